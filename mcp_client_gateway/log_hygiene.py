"""Making untrusted text (log lines, upstream error strings, model output) safe to hand to a model or a terminal.

Why: logs can carry attacker text and secrets (reliability-security.md §10). Every line is stripped of ANSI
escapes and control or bidi characters, redacted (registered secrets plus token-shaped strings), and cut to a
bound, so a log line can neither steer a terminal nor smuggle a credential out through a tool result.
"""

from __future__ import annotations

import re

from shared.logging import REDACTED, redact

__all__ = ["MAX_LINE_CHARS", "clean_text"]

MAX_LINE_CHARS = 500

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2069\ufeff]")
_TOKEN_SHAPED = re.compile(
    r"hf_[A-Za-z0-9]{20,}"  # Hugging Face tokens
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}"  # Authorization headers
    r"|sk-[A-Za-z0-9_-]{16,}"  # OpenAI-style keys
    r"|(?i:api[_-]?key[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9._~+/=-]{8,}"  # key=value forms
)


def clean_text(text: str, limit: int = MAX_LINE_CHARS) -> tuple[str, bool]:
    """Sanitised ``text`` and whether it was cut. Tabs and newlines become spaces."""
    cleaned = _ANSI.sub("", text)
    cleaned = cleaned.replace("\t", " ").replace("\r", " ").replace("\n", " ")
    cleaned = _CONTROL.sub("", cleaned)
    cleaned = redact(cleaned)
    cleaned = _TOKEN_SHAPED.sub(REDACTED, cleaned)
    cleaned = " ".join(cleaned.split())
    if len(cleaned) > limit:
        return cleaned[: max(0, limit - 1)] + "…", True
    return cleaned, False
