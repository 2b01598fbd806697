"""The benchmark tool set: load generator, metrics, datasets, plots, and the node agent that runs them on the VM.

Modules: ``loadgen`` (the generator), ``metrics`` (vLLM's definitions), ``sse`` (stream parsing), ``transport``
(lean HTTP/1.1 for httpx), ``datasets`` (exact-length prompts), ``report`` and ``plots`` (table, SVG/PNG),
``node_agent`` with ``journal`` and ``system_info``, and ``stub_server`` (a calibration server).
"""
