"""Server-sent events from an OpenAI-compatible stream: split bytes into events, and read one event.

Pure (no I/O). The split works on bytes as they arrive, so the caller can stamp the time of the read that
completed each event before any JSON is parsed. What counts as a token follows ``vllm bench serve``'s definition
(``docs/reference/vllm.md`` §5): a chat chunk whose delta has non-empty ``content``, ``reasoning`` (or
``reasoning_content``)
or ``tool_calls``; a completions chunk with non-empty ``text``. vLLM's role chunk (``"content": ""``) and a
finishing chunk without text are not tokens; the usage chunk (``"choices": []``) is not either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["DONE", "ChunkInfo", "SseSplitter", "read_chunk"]

DONE = b"[DONE]"


class SseSplitter:
    """Accumulates stream bytes and returns the ``data:`` payload of every complete event."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return the payloads of the events it completed (comments and blank events dropped)."""
        buffer = self._buffer + data if self._buffer else data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        events = buffer.split(b"\n\n")
        self._buffer = events.pop()
        payloads = []
        for event in events:
            payload = _data_of(event)
            if payload is not None:
                payloads.append(payload)
        return payloads

    def close(self) -> list[bytes]:
        """The payload of a last event that ended without its blank line (tolerated, as vLLM's client does)."""
        rest, self._buffer = self._buffer, b""
        payload = _data_of(rest.strip(b"\n"))
        return [] if payload is None else [payload]


def _data_of(event: bytes) -> bytes | None:
    if event.startswith(b"data:") and b"\n" not in event:  # the common case: one data line
        return event[5:].strip()
    lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """What one streamed chunk says, as far as the metrics care."""

    token: bool
    text: str = ""
    response_id: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None


_NOT_A_TOKEN = ChunkInfo(token=False)


def read_chunk(payload: bytes) -> ChunkInfo:
    """Classify one ``data:`` payload (not ``[DONE]``); raises ``ValueError`` when it is not a JSON object."""
    data = json.loads(payload)
    if not isinstance(data, dict):
        raise ValueError("stream chunk is not a JSON object")
    choices = data.get("choices")
    if choices:
        choice = choices[0]
        delta = choice.get("delta")
        if delta is not None:
            text = delta.get("content") or ""
            token = bool(text or delta.get("reasoning") or delta.get("reasoning_content") or delta.get("tool_calls"))
        else:
            text = choice.get("text") or ""
            token = bool(text)
        info = ChunkInfo(
            token=token, text=text, response_id=str(data.get("id") or ""), finish_reason=choice.get("finish_reason")
        )
        usage = data.get("usage")
        return _with_usage(info, usage) if usage else info
    usage = data.get("usage")
    if usage:
        return _with_usage(_NOT_A_TOKEN, usage)
    error = data.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else error
        return ChunkInfo(token=False, error=str(message)[:500])
    return _NOT_A_TOKEN


def _with_usage(info: ChunkInfo, usage: Any) -> ChunkInfo:
    if not isinstance(usage, dict):
        return info
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    return ChunkInfo(
        token=info.token,
        text=info.text,
        response_id=info.response_id,
        finish_reason=info.finish_reason,
        prompt_tokens=prompt if isinstance(prompt, int) else None,
        completion_tokens=completion if isinstance(completion, int) else None,
        error=info.error,
    )
