"""Build the ports from settings, lazily: SDK clients are created on first use, once per process."""

from __future__ import annotations
