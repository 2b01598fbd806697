"""The VM twin's stand-in for the ``libtpu`` package that the vLLM TPU image's Python carries.

Why: on a TPU VM the node agent runs on the serving image's Python, where ``libtpu.sdk.tpumonitoring`` reads the
TensorCore utilisation (``node_agent.tensorcore_util``). The twin's image (``localcloud/vm_twin/image.py``) puts this
directory on its ``python3``'s path, and only there: the twin's ``vllm`` is a CPU build, which would take an
importable ``libtpu`` to mean it runs on a TPU. Only the SDK's monitoring module is stood in for.
"""
