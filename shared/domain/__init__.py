"""Pure domain logic: no I/O, no clock, no vendor SDKs (enforced by import-linter)."""
