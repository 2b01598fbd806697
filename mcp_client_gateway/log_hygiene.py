"""Making untrusted text (log lines, upstream error strings, model output) safe to hand to a model or a terminal.

Why: logs can carry attacker text and secrets (docs/reference/reliability-security.md §10). Every line is stripped of
ANSI
escapes and control or bidi characters, redacted (registered secrets plus token-shaped strings), and cut to a
bound, so a log line can neither steer a terminal nor smuggle a credential out through a tool result.
"""

from __future__ import annotations

from shared.logging import scrub_untrusted

__all__ = ["MAX_LINE_CHARS", "clean_text"]

MAX_LINE_CHARS = 500


def clean_text(text: str, limit: int = MAX_LINE_CHARS) -> tuple[str, bool]:
    """Sanitised ``text`` and whether it was cut. Tabs and newlines become spaces."""
    cleaned, _ = scrub_untrusted(text, len(text) + 1)
    return scrub_untrusted(" ".join(cleaned.split()), limit)
