"""Log lines as a node sends them: cleaned and bounded. Shared by the node agent's log tails and its log shipper,
kept apart so neither imports the other."""

from __future__ import annotations

from shared.logging import scrub_untrusted

__all__ = ["MAX_LINE_CHARS", "clean_log_line"]

MAX_LINE_CHARS = 2000


def clean_log_line(text: str, api_key: str | None = None) -> str:
    """A log line safe to send: no terminal escapes or control characters, secrets redacted, at most 2000 chars."""
    return scrub_untrusted(text, MAX_LINE_CHARS, also_redact=api_key)[0]
