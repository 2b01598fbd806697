"""tpuctl's shared code: domain, messages, ports, services, adapters (see DESIGN.md §2)."""
