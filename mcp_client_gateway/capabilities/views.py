"""Output views shared by several capabilities: node tasks, monitor samples, and a cloud error as the
caller's one-line error. Text from the node or the cloud is untrusted: it is cleaned on the way out."""

from __future__ import annotations

from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.log_hygiene import clean_text
from mcp_client_gateway.models import NodeTaskView, SampleView
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import MonitorSample, NodeTask

__all__ = ["from_cloud", "node_task_view", "sample_view"]


def from_cloud(exc: CloudError, field: str) -> GatewayError:
    text = clean_text(exc.message, limit=300)[0]
    if exc.error_class is ErrorClass.PERMISSION:
        return GatewayError(
            "permission_denied", field, text, "the vLLM API key secret does not match the server's; re-deploy or fix it"
        )
    if exc.error_class is ErrorClass.INVALID:
        return GatewayError("invalid_argument", field, text, "lower max_tokens or shorten the prompt")
    if exc.error_class is ErrorClass.NOT_FOUND:
        return GatewayError(
            "failed_precondition",
            field,
            text,
            "check tpu_query without a prompt (the health check) for what the endpoint serves",
        )
    if exc.error_class is ErrorClass.RATE_LIMIT:
        return GatewayError("unavailable", field, text, "try again shortly", retry_after_s=30)
    return GatewayError(
        "unavailable",
        field,
        text,
        "the endpoint may be restarting; see tpu_query without a prompt (the health check)",
        retry_after_s=15,
    )


def node_task_view(task: NodeTask) -> NodeTaskView:
    return NodeTaskView(
        task_id=task.task_id,
        action=task.action,
        status=task.status,
        reason=clean_text(task.reason, limit=200)[0],
        requested_at=task.requested_at,
        finished_at=task.finished_at,
        detail=clean_text(task.detail, limit=500)[0],
        line_count=len(task.lines),
        bundle=task.bundle,
    )


def sample_view(sample: MonitorSample) -> SampleView:
    return SampleView(taken_at=sample.taken_at, phase=sample.phase.value, probe=sample.probe, slis=dict(sample.slis))
