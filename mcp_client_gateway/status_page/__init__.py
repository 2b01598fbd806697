"""The status page (``tpuctl ui``): deployments, phases, timelines, SLI charts and benchmark curves, read-only."""
