"""Serving: live calls to a deployment's vLLM (one timed chat, a deep health check), through the endpoint
the deployment recorded or the ``EndpointAccess`` port (an IAP tunnel on loopback)."""

from __future__ import annotations

from typing import Any

from mcp_client_gateway import bounds
from mcp_client_gateway.capabilities.common import GatewayPorts, Records, SecretRedaction
from mcp_client_gateway.capabilities.views import from_cloud
from mcp_client_gateway.errors import GatewayError
from mcp_client_gateway.log_hygiene import clean_text
from mcp_client_gateway.models import ErrorCode, HealthCheck, HealthReport, QueryResult
from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import DeploymentRecord, Phase
from shared.domain.serving_key import deployment_api_key
from shared.logging import redact, register_secret
from shared.ports import EndpointAccessError, EndpointTarget, ModelChatRequest, ModelClient

__all__ = ["Serving"]

_ACCESS_CODES: dict[ErrorClass, ErrorCode] = {
    ErrorClass.PERMISSION: "permission_denied",
    ErrorClass.INVALID: "failed_precondition",  # a recorded value, not the caller's argument
    ErrorClass.NOT_FOUND: "failed_precondition",
    ErrorClass.FAILED_PRECONDITION: "failed_precondition",
}


class Serving:
    """The deployed model, live: chat completions and health probes with the vLLM API key."""

    def __init__(self, ports: GatewayPorts, records: Records, redaction: SecretRedaction) -> None:
        self.ports = ports
        self.records = records
        self.redaction = redaction

    def query_model(
        self,
        deployment_id: str,
        *,
        prompt: str,
        max_tokens: int = 256,
        temperature: float = 0.0,
        system_prompt: str | None = None,
    ) -> QueryResult:
        """One streamed chat completion, timed: TTFT at the first content chunk, tokens from usage."""
        deployment_id = bounds.deployment_id(deployment_id)
        prompt = bounds.text("prompt", prompt, max_chars=bounds.PROMPT_CHARS, min_chars=0)
        max_tokens = bounds.integer("max_tokens", max_tokens, bounds.MAX_TOKENS)
        temperature = bounds.number("temperature", temperature, bounds.TEMPERATURE)
        if system_prompt is not None:
            system_prompt = bounds.text(
                "system_prompt", system_prompt, max_chars=bounds.SYSTEM_PROMPT_CHARS, min_chars=0
            )
        if not prompt.strip():
            raise GatewayError("invalid_argument", "prompt", "is empty", "give the question to ask the model")
        record = self.records.serving(deployment_id)
        self.redaction.register_known()
        messages: list[tuple[str, str]] = []
        if system_prompt:
            messages.append(("system", system_prompt))
        messages.append(("user", prompt))
        chat = self.chat(record, tuple(messages), max_tokens=max_tokens, temperature=temperature, timeout_s=30.0)
        tokens = chat.completion_tokens
        decode_rate: float | None = None
        if tokens and tokens > 1 and chat.ttft_s is not None and chat.last_token_s and chat.last_token_s > chat.ttft_s:
            decode_rate = round((tokens - 1) / (chat.last_token_s - chat.ttft_s), 2)
        return QueryResult(
            deployment_id=deployment_id,
            model=chat.model,
            text=redact(chat.text),  # a model must not become a way to read a stored secret
            finish_reason=chat.finish_reason,
            prompt_tokens=chat.prompt_tokens,
            completion_tokens=tokens,
            ttft_ms=round(chat.ttft_s * 1000, 2) if chat.ttft_s is not None else None,
            total_ms=round(chat.total_s * 1000, 2),
            output_tokens_per_s=round(tokens / chat.total_s, 2) if tokens and chat.total_s > 0 else None,
            decode_tokens_per_s=decode_rate,
            note=_empty_answer_note(chat.text, chat.finish_reason, tokens, max_tokens, temperature),
        )

    def check_health(self, deployment_id: str) -> HealthReport:
        """Deep health: /health, /v1/models, /version, a one-token completion, and the monitor's phase."""
        record = self.records.get(deployment_id)
        endpoint = record.status.endpoint
        checks: list[HealthCheck] = []
        phase = record.status.phase
        checks.append(HealthCheck(name="monitor_phase", ok=phase is Phase.SERVING, detail=phase.value))
        if not endpoint:
            checks.append(HealthCheck(name="endpoint", ok=False, detail="no endpoint recorded yet"))
            return HealthReport(
                deployment_id=deployment_id, endpoint=None, healthy=False, phase=phase.value, checks=checks, models=[]
            )
        client = self._model_client()
        api_key = self._vllm_api_key(deployment_id)
        url = self._endpoint_url(record)
        try:
            probe = client.check(url, api_key, timeout_s=5.0)
        except CloudError as exc:
            raise from_cloud(exc, "endpoint") from None
        checks.append(
            HealthCheck(
                name="health",
                ok=probe.health_status == 200,
                latency_ms=probe.health_ms,
                detail=f"HTTP {probe.health_status}" if probe.health_status is not None else "no answer",
            )
        )
        checks.append(
            HealthCheck(
                name="models",
                ok=bool(probe.models),
                latency_ms=probe.models_ms,
                detail=", ".join(probe.models) if probe.models else "no model listed",
            )
        )
        checks.append(HealthCheck(name="version", ok=probe.version is not None, detail=probe.version or "unknown"))
        completion_ok = False
        if probe.models:
            try:
                chat = self.chat(
                    record, (("user", "Reply with OK."),), max_tokens=1, temperature=0.0, timeout_s=15.0, url=url
                )
                completion_ok = (chat.completion_tokens or 0) >= 1 or bool(chat.text)
                checks.append(
                    HealthCheck(
                        name="completion",
                        ok=completion_ok,
                        latency_ms=round(chat.total_s * 1000, 2),
                        detail=f"{chat.completion_tokens} token(s)",
                    )
                )
            except GatewayError as exc:
                checks.append(HealthCheck(name="completion", ok=False, detail=exc.problem))
        for problem in probe.problems:
            checks.append(HealthCheck(name="problem", ok=False, detail=clean_text(problem)[0]))
        healthy = probe.health_status == 200 and bool(probe.models) and completion_ok
        return HealthReport(
            deployment_id=deployment_id,
            endpoint=endpoint,
            healthy=healthy,
            phase=phase.value,
            checks=checks,
            models=list(probe.models),
            max_model_len=probe.max_model_len,
            vllm_version=probe.version,
        )

    def chat(
        self,
        record: DeploymentRecord,
        messages: tuple[tuple[str, str], ...],
        *,
        max_tokens: int,
        temperature: float,
        timeout_s: float,
        url: str | None = None,
    ) -> Any:
        request = ModelChatRequest(
            endpoint=url or self._endpoint_url(record),
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
            api_key=self._vllm_api_key(record.deployment_id),
            timeout_s=timeout_s,
        )
        try:
            return self._model_client().chat(request)
        except CloudError as exc:
            raise from_cloud(exc, "max_tokens" if exc.error_class is ErrorClass.INVALID else "endpoint") from None

    def _endpoint_url(self, record: DeploymentRecord) -> str:
        """Where this process reaches the deployment's vLLM: the recorded URL (``direct``), or what the
        ``EndpointAccess`` port opens to it (an IAP tunnel on loopback)."""
        status = record.status
        endpoint = status.endpoint
        if not endpoint:
            raise GatewayError("failed_precondition", "deployment_id", "no endpoint recorded", "wait for SERVING")
        access = self.ports.endpoint_access
        if access is None:
            return endpoint
        serving = [r for r in status.resources if r.endpoint == endpoint and r.zone == status.zone]
        if not serving or status.zone is None:
            raise GatewayError(
                "failed_precondition",
                "deployment_id",
                f"no node of '{record.deployment_id}' is recorded with its endpoint",
                "wait for the next reconcile tick, then retry",
            )
        ref = max(serving, key=lambda r: (r.generation, r.attempt))
        target = EndpointTarget(
            deployment_id=record.deployment_id,
            endpoint=endpoint,
            zone=status.zone,
            node=ref.name,
            backend=status.backend or ref.backend,
        )
        self.redaction.register_known()  # before a child process gets an environment
        try:
            return access.base_url(target)
        except EndpointAccessError as exc:
            raise GatewayError(
                _ACCESS_CODES.get(exc.error_class, "unavailable"),
                exc.field,
                clean_text(exc.message, limit=400)[0],
                exc.fix,
                retry_after_s=10 if exc.transient else None,
            ) from None

    def _model_client(self) -> ModelClient:
        if self.ports.model_client is None:
            raise GatewayError("unavailable", None, "no model client is configured", "")
        return self.ports.model_client

    def _vllm_api_key(self, deployment_id: str) -> str | None:
        """``deployment_id``'s own key (what its serving proxy takes), derived from the stored master; None
        without a master."""
        master = self.ports.secrets.get(self.ports.settings.vllm_api_key_secret)
        if not master:
            return None
        key = deployment_api_key(master, deployment_id)
        register_secret(key)
        return key


def _empty_answer_note(
    text: str, finish_reason: str | None, tokens: int | None, max_tokens: int, temperature: float
) -> str | None:
    """Why an answer with no visible text may be empty, and what to try; None when there is text."""
    if text.strip():
        return None
    tries = ["temperature 0"] if temperature > 0 else []
    tries += [f"more max_tokens (this call allowed {max_tokens})", "another prompt"]
    return (
        f"the model returned no text ({f'finish_reason={finish_reason}' if finish_reason else 'no finish_reason'}, "
        f"{tokens or 0} completion tokens): "
        "a tiny model, such as the local stand-in, often ends at once or emits only whitespace; try "
        + ", ".join(tries[:-1])
        + " or "
        + tries[-1]
    )
