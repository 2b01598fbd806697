"""tpuctl's shared code: domain, messages, ports, services, adapters (see docs/reference/DESIGN.md §2)."""
