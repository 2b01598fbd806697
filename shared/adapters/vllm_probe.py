"""The vLLM probe (httpx, async): ``/health``, ``/v1/models``, ``/version`` and ``/metrics`` of one server, and the
monitor's canary completion (``POST /v1/chat/completions``, one token, ``shared.domain.canary``).

Why its own adapter: the monitor must tell "not up yet" (connection refused) from "hung" (timeout), "wrong key"
(401) and "engine dead" (503), and must read metrics with a real Prometheus parser. This is the only module that
speaks HTTP to vLLM for the monitor; everything it returns is a domain value (:class:`ProbeResult`).

* Network trouble never raises: it becomes an :class:`EndpointCheck` with a :class:`ProbeOutcome`.
* The API key (if any) goes only to ``/v1/*`` as ``Authorization: Bearer``; ``/health``, ``/metrics`` and
  ``/version`` are open even with ``--api-key``. The probe is built with the master key and sends each deployment
  its own key (``shared.domain.serving_key``: what that deployment's serving proxy takes); both are registered for
  log redaction and never printed.
* ``/metrics`` is fetched with a plain ``Accept`` (no OpenMetrics negotiation). Before parsing, lines of families
  the derivations do not use (``python_*``, ...) are dropped (``cache_config_info`` is kept: a few of its labels
  say what vLLM allocated, ``shared.domain.effective_config``); the
  remaining text goes through ``prometheus_client.parser.text_string_to_metric_families`` unchanged.
* ``/version`` rarely changes, so it is cached per endpoint for ``version_ttl_s``.
* The canary's stream is read as it arrives (at most ``_CANARY_MAX_LINES`` lines, the text bounded) and returned
  as a :class:`CanaryCheck`; whether it proves a completion is the domain's call.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import sniffio  # noqa: F401  # httpcore retries a failed `import sniffio` on every request; fail at import instead
from prometheus_client.parser import text_string_to_metric_families

from shared.domain.canary import CANARY_PATH, CanaryCheck, canary_request
from shared.domain.health import EndpointCheck, ProbeOutcome, ProbeResult
from shared.domain.metrics import COUNT_ONLY_FAMILIES, WANTED_FAMILIES, MetricsSnapshot, snapshot_from_samples
from shared.domain.serving_key import deployment_api_key
from shared.logging import register_secret

__all__ = ["VllmProbe", "parse_metrics", "relevant_metric_lines"]

_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")
_SUCCESS_CREATED = "vllm:request_success_created"
_CANARY_MAX_LINES = 256  # a one-token stream is about eight lines; more is a misbehaving server
_CANARY_TEXT_LIMIT = 200


def _family(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def relevant_metric_lines(text: str) -> Iterator[str]:
    """TYPE and sample lines of the families in ``WANTED_FAMILIES``: the only lines the parser is given.

    HELP lines, ``*_created`` series (except ``vllm:request_success_created``, which identifies the server
    process for restart detection) and the buckets of count-only histograms are dropped: none is read.
    """
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] == "TYPE" and _wanted(parts[2]):
                yield line
            continue
        end = len(line)
        for separator in ("{", " "):
            position = line.find(separator)
            if 0 <= position < end:
                end = position
        if _wanted(line[:end]):
            yield line


def _wanted(name: str) -> bool:
    if name.endswith("_created"):
        return name == _SUCCESS_CREATED
    family = _family(name)
    if name.endswith("_bucket") and family in COUNT_ONLY_FAMILIES:
        return False
    return family in WANTED_FAMILIES


def parse_metrics(text: str) -> MetricsSnapshot:
    """Prometheus text (format 0.0.4) -> :class:`MetricsSnapshot`. Raises ``ValueError`` on malformed input."""
    kept = "\n".join(relevant_metric_lines(text)) + "\n"
    samples = (
        (sample.name, sample.labels, float(sample.value))
        for family in text_string_to_metric_families(kept)
        for sample in family.samples
    )
    return snapshot_from_samples(samples)


class VllmProbe:
    """Implements the ``ServingProbe`` port over httpx. One instance serves many endpoints and event loops.

    Each probe opens its own one-connection client (cheap: the TLS context is built once and shared) and
    closes it before returning: one shared pool for a whole tick costs more CPU than it saves, because httpx
    rescans every pooled connection on each request, and endpoints are different hosts anyway.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        timeout_s: float = 3.0,
        connect_timeout_s: float = 1.0,
        version_ttl_s: float = 600.0,
    ) -> None:
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("timeout_s, connect_timeout_s: must be > 0 seconds")
        register_secret(api_key)
        self._api_key = api_key or None  # the master: each deployment's own key is derived from it
        self._derived: dict[str, str] = {}
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._version_ttl_s = version_ttl_s
        self._versions: dict[str, tuple[float, str]] = {}
        self._tls: ssl.SSLContext | None = None

    def __repr__(self) -> str:
        return f"VllmProbe(api_key={'set' if self._api_key else 'unset'}, timeout={self._timeout.read}s)"

    def _client(self) -> httpx.AsyncClient:
        if self._tls is None:
            self._tls = ssl.create_default_context()  # about 25 ms: once per process, not per probe
        return httpx.AsyncClient(
            timeout=self._timeout,
            verify=self._tls,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            headers={"Accept": "text/plain, application/json;q=0.9, */*;q=0.1"},
            follow_redirects=False,
            trust_env=False,
        )

    async def probe(self, base_url: str, deployment_id: str | None = None) -> ProbeResult:
        """Probe one server. ``/health`` first; the other three only when it answered 200. ``/v1/models`` gets
        ``deployment_id``'s own key (what its serving proxy takes), or the key itself when none is named."""
        base = base_url.rstrip("/")
        async with self._client() as client:
            health, _ = await _get(client, base, "/health")
            if health.outcome is not ProbeOutcome.OK:
                return ProbeResult(base_url=base, health=health)
            # One after the other on the kept-alive connection: the tick already probes many servers at once.
            models, models_body = await _get(client, base, "/v1/models", self._auth(deployment_id))
            metrics_check, metrics_text = await _get(client, base, "/metrics")
            version = await self._version(client, base)
        served, max_model_len = _read_models(models_body) if models.outcome is ProbeOutcome.OK else ((), None)
        if models.outcome is ProbeOutcome.OK and models_body is not None and not served:
            models = EndpointCheck(ProbeOutcome.ERROR, models.status, models.latency_s, "no model cards in /v1/models")
        snapshot: MetricsSnapshot | None = None
        if metrics_check.outcome is ProbeOutcome.OK and metrics_text is not None:
            try:
                snapshot = parse_metrics(metrics_text)
            except ValueError as exc:
                metrics_check = EndpointCheck(
                    ProbeOutcome.ERROR, metrics_check.status, metrics_check.latency_s, f"unparsable /metrics: {exc}"
                )
        return ProbeResult(
            base_url=base,
            health=health,
            models=models,
            served_models=served,
            max_model_len=max_model_len,
            version=version,
            metrics_check=metrics_check,
            metrics=snapshot,
        )

    async def canary(self, base_url: str, model: str, deployment_id: str | None = None) -> CanaryCheck:
        """One streamed one-token chat completion to ``model``, with the same key as ``/v1/models`` gets. Network
        trouble and error statuses become the check's outcome; the answer is read, not judged."""
        base = base_url.rstrip("/")
        reading = _CanaryReading()
        started = time.perf_counter()
        try:
            async with (
                self._client() as client,
                client.stream(
                    "POST", base + CANARY_PATH, json=canary_request(model), headers=self._auth(deployment_id)
                ) as response,
            ):
                if not 200 <= response.status_code < 300:
                    body = (await response.aread()).decode("utf-8", "replace")
                    detail = f"{CANARY_PATH} answered HTTP {response.status_code}{_error_message(body)}"
                    return CanaryCheck(_outcome_of(response.status_code), response.status_code, _since(started), detail)
                async for line in response.aiter_lines():
                    if not reading.feed(line):
                        break
                status = response.status_code
        except httpx.TimeoutException as exc:
            return CanaryCheck(ProbeOutcome.TIMEOUT, None, _since(started), _describe(exc))
        except httpx.ConnectError as exc:
            return CanaryCheck(ProbeOutcome.REFUSED, None, _since(started), _describe(exc))
        except httpx.HTTPError as exc:
            return CanaryCheck(ProbeOutcome.ERROR, None, _since(started), _describe(exc))
        return reading.check(status, _since(started))

    def _auth(self, deployment_id: str | None) -> dict[str, str] | None:
        if not self._api_key:
            return None
        if deployment_id is None:
            return {"Authorization": f"Bearer {self._api_key}"}
        key = self._derived.get(deployment_id)
        if key is None:
            key = self._derived[deployment_id] = deployment_api_key(self._api_key, deployment_id)
            register_secret(key)
        return {"Authorization": f"Bearer {key}"}

    async def _version(self, client: httpx.AsyncClient, base: str) -> str | None:
        cached = self._versions.get(base)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self._version_ttl_s:
            return cached[1]
        check, body = await _get(client, base, "/version")
        if check.outcome is not ProbeOutcome.OK or body is None:
            return cached[1] if cached else None
        try:
            version = str(json.loads(body)["version"])
        except (ValueError, KeyError, TypeError):
            return None
        self._versions[base] = (now, version)
        return version


async def _get(
    client: httpx.AsyncClient, base: str, path: str, headers: dict[str, str] | None = None
) -> tuple[EndpointCheck, str | None]:
    """One GET; every transport failure becomes an outcome (refused, timeout, error), never an exception."""
    started = time.perf_counter()
    try:
        response = await client.get(base + path, headers=headers)
    except httpx.TimeoutException as exc:
        return EndpointCheck(ProbeOutcome.TIMEOUT, None, time.perf_counter() - started, _describe(exc)), None
    except httpx.ConnectError as exc:
        return EndpointCheck(ProbeOutcome.REFUSED, None, time.perf_counter() - started, _describe(exc)), None
    except httpx.HTTPError as exc:
        return EndpointCheck(ProbeOutcome.ERROR, None, time.perf_counter() - started, _describe(exc)), None
    elapsed = time.perf_counter() - started
    outcome = _outcome_of(response.status_code)
    detail = "" if outcome is ProbeOutcome.OK else f"{path} answered HTTP {response.status_code}"
    return EndpointCheck(outcome, response.status_code, elapsed, detail), response.text


@dataclass
class _CanaryReading:
    """The canary's server-sent events, as they arrive: choices, text, usage, ``[DONE]``, a problem."""

    lines: int = 0
    choices: int = 0
    text: str = ""
    completion_tokens: int | None = None
    done: bool = False
    problem: str = ""

    def feed(self, line: str) -> bool:
        """Take one line; False once reading should stop (the stream is done, broken or too long)."""
        self.lines += 1
        if self.lines > _CANARY_MAX_LINES:
            self.problem = f"the stream ran past {_CANARY_MAX_LINES} lines"
            return False
        if not line.startswith("data:"):
            return True
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            self.done = True
            return False
        try:
            chunk: Any = json.loads(data)
        except ValueError:
            self.problem = "a stream chunk is not JSON"
            return False
        if not isinstance(chunk, dict) or "error" in chunk:
            self.problem = "error in the stream" + _error_message(data)
            return False
        self._take(chunk)
        return True

    def _take(self, chunk: dict[str, Any]) -> None:
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            self.choices += 1
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str):
                self.text = (self.text + content)[:_CANARY_TEXT_LIMIT]
        usage = chunk.get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            self.completion_tokens = tokens

    def check(self, status: int, latency_s: float) -> CanaryCheck:
        return CanaryCheck(
            outcome=ProbeOutcome.OK,
            status=status,
            latency_s=latency_s,
            detail=self.problem,
            choices=self.choices,
            text=self.text,
            completion_tokens=self.completion_tokens,
            done=self.done,
        )


def _error_message(body: str) -> str:
    """``": <message>"`` from an OpenAI-style error body (``error.message``, ``error`` or ``detail``), bounded;
    empty when there is none. Upstream text: the monitor cleans it before storing."""
    try:
        payload: Any = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(payload, dict):
        return ""
    error = payload.get("error", payload.get("detail"))
    message = error.get("message") if isinstance(error, dict) else error
    return f": {message[:_CANARY_TEXT_LIMIT]}" if isinstance(message, str) and message else ""


def _since(started: float) -> float:
    return time.perf_counter() - started


def _outcome_of(status: int) -> ProbeOutcome:
    if 200 <= status < 300:
        return ProbeOutcome.OK
    if status in (401, 403):
        return ProbeOutcome.UNAUTHORIZED
    if status >= 500:
        return ProbeOutcome.SERVER_ERROR
    return ProbeOutcome.CLIENT_ERROR


def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


def _read_models(body: str | None) -> tuple[tuple[str, ...], int | None]:
    """Served ids (base models first; LoRA cards have a ``parent``) and the base model's ``max_model_len``."""
    if not body:
        return (), None
    try:
        payload: Any = json.loads(body)
    except ValueError:
        return (), None
    cards = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(cards, list):
        return (), None
    base_cards = [c for c in cards if isinstance(c, dict) and c.get("id") and not c.get("parent")]
    adapters = [c for c in cards if isinstance(c, dict) and c.get("id") and c.get("parent")]
    served = tuple(str(c["id"]) for c in (*base_cards, *adapters))
    max_len = next((c.get("max_model_len") for c in base_cards if isinstance(c.get("max_model_len"), int)), None)
    return served, max_len
