"""What runs on a TPU VM beside vLLM: the node agent and the serving proxy (one deployable unit, the node-agent bundle).

Modules: ``agent`` (``python -m node_agent.agent``: pulls the deployment's node channel, runs benchmarks and
serving tasks, ships vLLM's log lines, reports boot), ``serving_proxy`` (``python -m node_agent.serving_proxy``: the
only listener on the serving port), ``journal`` (crash-safe run and task journals), ``log_shipper`` and
``log_lines`` (vLLM's container log to Cloud Logging), ``system_info`` (what the VM is).
"""
