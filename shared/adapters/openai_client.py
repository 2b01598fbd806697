"""``OpenAiCompatibleClient``: the gateway's HTTP client for a deployed model (vLLM's OpenAI-compatible server).

Why it exists: the gateway answers "query the model" and "is it healthy" itself, and both must be measured
the way ``vllm bench serve`` measures (docs/reference/vllm.md §5): TTFT at the first chunk whose delta carries
content (the
role chunk does not count), token counts from the server's ``usage`` chunk, never from counting chunks.

Errors are classified once, here: refused or timed out -> ``TRANSIENT``; 401/403 -> ``PERMISSION``; 404 ->
``NOT_FOUND``; other 4xx -> ``INVALID``; 5xx -> ``TRANSIENT``. The API key is sent as a bearer header and
never appears in an error message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from shared.domain.errors import CloudError, ErrorClass
from shared.ports import ModelChat, ModelChatRequest, ModelEndpointCheck

__all__ = ["OpenAiCompatibleClient"]

_MAX_ERROR_CHARS = 300
_MAX_TEXT_CHARS = 64 * 1024


def base_url(endpoint: str) -> str:
    """``http://10.0.0.5:8000/v1/`` -> ``http://10.0.0.5:8000``; only http(s) URLs with a host are accepted."""
    try:
        url = httpx.URL(endpoint.strip())
    except (httpx.InvalidURL, TypeError) as exc:
        raise CloudError(ErrorClass.INVALID, "endpoint: not a valid URL") from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise CloudError(ErrorClass.INVALID, "endpoint: must be an http(s) URL with a host, e.g. http://10.0.0.5:8000")
    path = url.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return str(url.copy_with(path=path or "", query=None, fragment=None)).rstrip("/")


class OpenAiCompatibleClient:
    """Streams chat completions and probes ``/health``, ``/v1/models`` and ``/version``.

    ``transport`` replaces the network (tests may pass a real loopback server's URL instead).
    """

    def __init__(self, *, transport: httpx.BaseTransport | None = None) -> None:
        self._transport = transport

    def chat(self, request: ModelChatRequest) -> ModelChat:
        base = base_url(request.endpoint)
        with self._client(request.api_key, request.timeout_s) as client:
            model = request.model or self._first_model(client, base)
            body = {
                "model": model,
                "messages": [{"role": role, "content": content} for role, content in request.messages],
                "max_tokens": request.max_tokens,
                "temperature": request.temperature,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            return _stream_chat(client, base, model, body)

    def check(self, endpoint: str, api_key: str | None, timeout_s: float = 5.0) -> ModelEndpointCheck:
        base = base_url(endpoint)
        problems: list[str] = []
        health_status: int | None = None
        health_ms: float | None = None
        models: tuple[str, ...] = ()
        max_model_len: int | None = None
        models_ms: float | None = None
        version: str | None = None
        with self._client(api_key, timeout_s) as client:
            started = time.perf_counter()
            try:
                with _mapped("GET /health"):
                    response = client.get(base + "/health")
                health_status = response.status_code
                health_ms = _ms_since(started)
                if response.status_code != 200:
                    problems.append(f"/health answered {response.status_code}")
            except CloudError as exc:
                problems.append(exc.message)
            started = time.perf_counter()
            try:
                with _mapped("GET /v1/models"):
                    response = client.get(base + "/v1/models")
                _raise_for_status(response, "GET /v1/models")
                models_ms = _ms_since(started)
                cards = [card for card in _json(response).get("data") or [] if isinstance(card, dict)]
                models = tuple(str(card.get("id", "")) for card in cards if card.get("id"))
                lengths = [card["max_model_len"] for card in cards if isinstance(card.get("max_model_len"), int)]
                max_model_len = lengths[0] if lengths else None
                if not models:
                    problems.append("/v1/models lists no model")
            except CloudError as exc:
                problems.append(exc.message)
            try:
                with _mapped("GET /version"):
                    response = client.get(base + "/version")
                _raise_for_status(response, "GET /version")
                raw_version = _json(response).get("version")
                version = str(raw_version)[:40] if raw_version is not None else None
            except CloudError as exc:
                problems.append(exc.message)
        return ModelEndpointCheck(
            health_status=health_status,
            health_ms=health_ms,
            models=models,
            max_model_len=max_model_len,
            models_ms=models_ms,
            version=version,
            problems=tuple(problems),
        )

    def _client(self, api_key: str | None, timeout_s: float) -> httpx.Client:
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0))
        return httpx.Client(headers=headers, timeout=timeout, transport=self._transport, follow_redirects=False)

    def _first_model(self, client: httpx.Client, base: str) -> str:
        with _mapped("GET /v1/models"):
            response = client.get(base + "/v1/models")
        _raise_for_status(response, "GET /v1/models")
        for card in _json(response).get("data") or []:
            if isinstance(card, dict) and card.get("id"):
                return str(card["id"])
        raise CloudError(ErrorClass.FAILED_PRECONDITION, "GET /v1/models: the endpoint serves no model yet")


def _stream_chat(client: httpx.Client, base: str, model: str, body: dict[str, Any]) -> ModelChat:
    parts: list[str] = []
    size = 0
    ttft_s: float | None = None
    last_token_s: float | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] = {}
    served_model = model
    content_chunks = 0
    started = time.perf_counter()
    with (
        _mapped("POST /v1/chat/completions"),
        client.stream("POST", base + "/v1/chat/completions", json=body) as response,
    ):
        if response.status_code != 200:
            response.read()
            _raise_for_status(response, "POST /v1/chat/completions")
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[len("data:") :].strip()
            if payload == "[DONE]":
                break
            try:
                chunk = json.loads(payload)
            except ValueError as exc:
                raise CloudError(ErrorClass.TRANSIENT, "POST /v1/chat/completions: a stream chunk is not JSON") from exc
            if not isinstance(chunk, dict):
                continue
            now = time.perf_counter()
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            served_model = str(chunk.get("model") or served_model)
            for choice in chunk.get("choices") or []:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta") or {}
                content = str(delta.get("content") or "")
                if content or delta.get("reasoning") or delta.get("reasoning_content") or delta.get("tool_calls"):
                    if ttft_s is None:
                        ttft_s = now - started
                    last_token_s = now - started
                    content_chunks += 1
                if content and size < _MAX_TEXT_CHARS:
                    parts.append(content)
                    size += len(content)
                if choice.get("finish_reason"):
                    finish_reason = str(choice["finish_reason"])
    total_s = time.perf_counter() - started
    return ModelChat(
        model=served_model,
        text="".join(parts)[:_MAX_TEXT_CHARS],
        finish_reason=finish_reason,
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
        ttft_s=ttft_s,
        last_token_s=last_token_s,
        total_s=total_s,
        content_chunks=content_chunks,
    )


@contextmanager
def _mapped(what: str) -> Iterator[None]:
    """Turn httpx transport failures into classified ``CloudError``s (no URL, no header in the message)."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise CloudError(ErrorClass.TRANSIENT, f"{what}: timed out") from exc
    except httpx.ConnectError as exc:
        raise CloudError(ErrorClass.TRANSIENT, f"{what}: connection refused or unreachable") from exc
    except httpx.TransportError as exc:
        raise CloudError(ErrorClass.TRANSIENT, f"{what}: transport error ({type(exc).__name__})") from exc


def _raise_for_status(response: httpx.Response, what: str) -> None:
    status = response.status_code
    if status < 400:
        return
    detail = _error_detail(response)
    text = f"{what}: HTTP {status}" + (f": {detail}" if detail else "")
    if status in (401, 403):
        raise CloudError(
            ErrorClass.PERMISSION, f"{what}: HTTP {status}: the endpoint rejected the API key", code=status
        )
    if status == 404:
        raise CloudError(ErrorClass.NOT_FOUND, text, code=status)
    if status == 429:
        raise CloudError(ErrorClass.RATE_LIMIT, text, code=status)
    if status >= 500:
        raise CloudError(ErrorClass.TRANSIENT, text, code=status)
    raise CloudError(ErrorClass.INVALID, text, code=status)


def _error_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    message: Any = None
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        message = message or body.get("detail") or body.get("message")
    text = " ".join(str(message or "").split())
    return text[:_MAX_ERROR_CHARS]


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError as exc:
        raise CloudError(ErrorClass.TRANSIENT, f"{response.request.url.path}: the answer is not JSON") from exc
    return body if isinstance(body, dict) else {}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 3)
