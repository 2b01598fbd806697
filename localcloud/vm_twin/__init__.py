"""The VM twin: a TPU VM on this machine that boots by executing its rendered startup script.

Parts: a metadata server (``metadata_server``), the Google APIs a VM calls (``google_apis``), the VM's own
namespaces and network (``vm``, ``vm_init``), and a container runtime with a ``docker`` command (``containers``,
``docker_cli``) whose image runs the real vLLM on CPU (``image``). What differs from a TPU VM lives here and only
here; the script is the bytes the controller put in the node's metadata.
"""
