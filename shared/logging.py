"""JSON-lines logging as Cloud Logging parses it, with secret redaction on every record.

One object per line: ``severity``, ``message``, ``logger``, ``time`` and our ids
(``deployment_id``, ``command_id``, ...). Any value registered with :func:`register_secret` is
replaced by ``[REDACTED]`` in the message, the arguments, the traceback and the extras before a
line is written, so a secret logged by mistake never reaches the output.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import traceback
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import IO, Any

__all__ = [
    "JsonFormatter",
    "RedactingFilter",
    "configure_logging",
    "deployment_logger",
    "redact",
    "register_secret",
    "scrub_untrusted",
]

REDACTED = "[REDACTED]"
_MIN_SECRET_LEN = 6  # shorter values would redact ordinary words
_secrets: set[str] = set()
_secrets_lock = threading.Lock()

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
_SEVERITY = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "CRITICAL",
}


def register_secret(value: str | None) -> None:
    """Remember a secret value so that no log line ever carries it."""
    if value and len(value) >= _MIN_SECRET_LEN:
        with _secrets_lock:
            _secrets.add(value)


def redact(text: str) -> str:
    """Replace every registered secret in ``text``."""
    if not _secrets:
        return text
    with _secrets_lock:
        values = sorted(_secrets, key=len, reverse=True)
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2069\ufeff]")
_TOKEN_SHAPED = re.compile(
    r"hf_[A-Za-z0-9]{20,}"  # Hugging Face tokens
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}"  # Authorization headers
    r"|sk-[A-Za-z0-9_-]{16,}"  # OpenAI-style keys
    r"|(?i:api[_-]?key[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9._~+/=-]{8,}"  # key=value forms
)


def scrub_untrusted(text: str, limit: int, *, also_redact: str | None = None) -> tuple[str, bool]:
    """Untrusted text (log lines, upstream errors, model output) made safe to store, show or hand to a model.

    Logs can carry attacker text and secrets: ANSI escapes and control or bidi characters go (tabs and line
    breaks become spaces), registered secrets, ``also_redact`` and token-shaped strings are redacted, and the
    result is cut to ``limit`` characters. Returns the text and whether it was cut.
    """
    cleaned = _ANSI.sub("", text).replace("\t", " ").replace("\r", " ").replace("\n", " ")
    cleaned = _CONTROL.sub("", cleaned)
    if also_redact:
        cleaned = cleaned.replace(also_redact, REDACTED)
    cleaned = _TOKEN_SHAPED.sub(REDACTED, redact(cleaned))
    if len(cleaned) > limit:
        return cleaned[: max(0, limit - 1)] + "…", True
    return cleaned, False


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(str(k)): _redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_redact_value(v) for v in value]
    if isinstance(value, int | float | bool) or value is None:
        return value
    return redact(str(value))


class RedactingFilter(logging.Filter):
    """Renders the message, then strips secrets from it, its traceback and its extras."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not lose the line
            message = f"{record.msg!r} {record.args!r}"
        record.msg = redact(message)
        record.args = None
        if record.exc_info:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)))

        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        for key, value in list(vars(record).items()):
            if key not in _STANDARD_ATTRS:
                setattr(record, key, _redact_value(value))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line; extras become top-level fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "severity": _SEVERITY.get(record.levelno, "DEFAULT"),
            "message": record.getMessage(),
            "logger": record.name,
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and key not in payload:
                payload[key] = value
        if record.exc_text:
            payload["stack_trace"] = record.exc_text
        elif record.exc_info:
            payload["stack_trace"] = "".join(traceback.format_exception(*record.exc_info))
        return redact(json.dumps(payload, default=str, ensure_ascii=False))


_configured_handler: logging.Handler | None = None


def configure_logging(level: str = "INFO", stream: IO[str] | None = None) -> logging.Handler:
    """Send the root logger's records to ``stream`` (stderr by default) as redacted JSON lines.

    Idempotent: a second call replaces the handler the first one installed.
    """
    global _configured_handler
    root = logging.getLogger()
    if _configured_handler is not None:
        root.removeHandler(_configured_handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    _configured_handler = handler
    return handler


class _DeploymentAdapter(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return msg, kwargs


def deployment_logger(logger: logging.Logger, **ids: Any) -> logging.LoggerAdapter[logging.Logger]:
    """A logger that stamps ``deployment_id``, ``command_id`` (and any other ids given) on every line."""
    return _DeploymentAdapter(logger, {k: v for k, v in ids.items() if v is not None})
