"""The load generator: benchmarks an OpenAI-compatible server the way vLLM's own ``bench serve`` measures it.

Modules: ``generator`` (the sweep over concurrency or request rate), ``stats`` (vLLM's definitions of TTFT,
TPOT, ITL and the knee), ``sse`` (stream parsing), ``transport`` (lean HTTP/1.1 for httpx), ``datasets``
(exact-length prompts), ``workloads`` (shared prefix, multi-turn sessions, trace replay), ``sessions`` (a level of
multi-turn sessions), ``server_cache`` (the server's prefix-cache hit rate per level from ``/metrics``),
``report`` and ``plots`` (table, SVG/PNG). ``python -m loadgen`` is its command line; the node agent runs it on
the VM.
"""
