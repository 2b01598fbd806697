"""The bounds of every gateway argument, enforced by the core itself and published in the MCP schemas.

Why here: the MCP server validates arguments against its schemas, but the CLI (and any other caller of
``GatewayCore``) does not pass through them, so the core checks every value it is given with the same limits.
Both shells then refuse the same values with the same one-line error naming the field and the fix
(``[invalid_argument] minutes: 1000000000000 is above the maximum of 10080. Fix: ...``), never a traceback.
``server.py`` builds its ``Field`` constraints from the constants below, so the two cannot drift.

Rules: numbers are finite and within range (a ``bool`` is not a number); strings are bounded and ids match
their pattern; closed sets are closed. A refused value is never repeated back (it may be injected text or a
secret); only its type, its length or a short number is shown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from mcp_client_gateway.errors import GatewayError
from shared.domain.models import DEPLOYMENT_ID_PATTERN, ZONE_PATTERN
from shared.messages.contracts import UUID_PATTERN

__all__ = [
    "ANALYZE_MINUTES",
    "BUDGET_USD",
    "COMMAND_ID_PATTERN",
    "COMPARE_LIMIT",
    "CONCURRENCY_LEVEL",
    "CONFIRM_CHARS",
    "DEPLOYMENT_ID_PATTERN",
    "GPU_MEMORY_UTILIZATION",
    "HEDGE",
    "HF_TOKEN_CHARS",
    "IDLE_MINUTES",
    "INPUT_LEN",
    "LIST_LIMIT",
    "LIST_OFFSET",
    "LOG_LIMIT",
    "LOG_MAX_CHARS",
    "LOG_MINUTES",
    "MAX_LEVELS",
    "MAX_MODEL_LEN",
    "MAX_TIERS",
    "MAX_TOKENS",
    "MAX_ZONES",
    "NAME_CHARS",
    "NUM_PROMPTS",
    "OUTPUT_LEN",
    "PROMPT_CHARS",
    "REQUEST_RATE",
    "SLO_MS",
    "SYSTEM_PROMPT_CHARS",
    "TAIL_LINES",
    "TEMPERATURE",
    "TOKENS_PER_SECOND",
    "TRACE_REQUESTS",
    "TTL_HOURS",
    "TUNE_TRIALS",
    "TURNS",
    "VALID_UNTIL_MINUTES",
    "WAIT_SECONDS",
    "WINDOW_MINUTES",
    "ZONE_CHARS",
    "ZONE_PATTERN",
    "choice",
    "command_id",
    "deployment_id",
    "flag",
    "integer",
    "number",
    "text",
    "text_list",
    "zone",
]

COMMAND_ID_PATTERN = UUID_PATTERN

# Integer ranges, both ends included.
HEDGE = (1, 4)
IDLE_MINUTES = (5, 10080)
MAX_MODEL_LEN = (256, 131072)
VALID_UNTIL_MINUTES = (5, 1440)
LIST_OFFSET = (0, 100_000)
LIST_LIMIT = (1, 100)
WAIT_SECONDS = (0, 5)
MAX_TOKENS = (1, 2048)
WINDOW_MINUTES = (1, 10080)
LOG_MINUTES = (1, 10080)
LOG_LIMIT = (1, 200)
LOG_MAX_CHARS = (1, 65536)
ANALYZE_MINUTES = (1, 1440)
TAIL_LINES = (1, 500)
COMPARE_LIMIT = (1, 100)
CONCURRENCY_LEVEL = (1, 1024)
NUM_PROMPTS = (1, 10000)
INPUT_LEN = (1, 131072)
OUTPUT_LEN = (1, 32768)
TURNS = (2, 64)
TUNE_TRIALS = (2, 12)  # shared.messages.BenchmarkRequest.tune_trials (0, a plain run, is the parameter left out)
TRACE_REQUESTS = 1000  # shared.messages.MAX_TRACE_REQUESTS: a benchmark.run command stays under 64 KiB

# Number ranges: (low, high); "open" ones exclude the low end (gt), the others include it (ge).
TTL_HOURS = (0.0, 720.0)  # open
BUDGET_USD = (0.0, 1_000_000.0)  # open
TOKENS_PER_SECOND = (0.0, 10_000_000.0)  # open
REQUEST_RATE = (0.0, 10000.0)  # open
SLO_MS = (0.0, 600000.0)  # open
GPU_MEMORY_UTILIZATION = (0.5, 0.98)
TEMPERATURE = (0.0, 2.0)

# Sizes.
MAX_ZONES = 32
ZONE_CHARS = 40
MAX_TIERS = 4
MAX_LEVELS = 16
PROMPT_CHARS = 32000
SYSTEM_PROMPT_CHARS = 8000
CONFIRM_CHARS = 256
HF_TOKEN_CHARS = 200
NAME_CHARS = 64

_DEPLOYMENT_ID = re.compile(DEPLOYMENT_ID_PATTERN)
_COMMAND_ID = re.compile(UUID_PATTERN)
_ZONE = re.compile(ZONE_PATTERN)


def _refuse(field: str, problem: str, fix: str) -> NoReturn:
    raise GatewayError("invalid_argument", field, problem, fix)


def _kind(value: Any) -> str:
    """What a refused value is, without repeating it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return f"text ({len(value)} characters)"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _shown(value: int | float) -> str:
    """A number short enough to repeat, or its size."""
    shown = str(value) if isinstance(value, int) else f"{value:g}"
    return shown if len(shown) <= 16 else f"a {len(str(abs(int(value))))}-digit number"


def integer(field: str, value: Any, bounds: tuple[int, int], *, fix: str = "") -> int:
    """``value`` as an int within ``bounds`` (both ends included)."""
    low, high = bounds
    fix = fix or f"pass {field} as a whole number from {low} to {high}"
    if isinstance(value, bool) or not isinstance(value, int):
        _refuse(field, f"must be a whole number, not {_kind(value)}", fix)
    if value < low:
        _refuse(field, f"{_shown(value)} is below the minimum of {low}", fix)
    if value > high:
        _refuse(field, f"{_shown(value)} is above the maximum of {high}", fix)
    return value


def number(field: str, value: Any, bounds: tuple[float, float], *, low_open: bool = False, fix: str = "") -> float:
    """``value`` as a finite float within ``bounds`` (the low end excluded when ``low_open``)."""
    low, high = bounds
    span = f"above {low:g} up to {high:g}" if low_open else f"from {low:g} to {high:g}"
    fix = fix or f"pass {field} as a number {span}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        _refuse(field, f"must be a number, not {_kind(value)}", fix)
    try:
        converted = float(value)
    except OverflowError:
        _refuse(field, f"{_shown(value)} is above the maximum of {high:g}", fix)
    if not math.isfinite(converted):
        _refuse(field, f"must be a finite number, not {converted}", fix)
    if converted < low or (low_open and converted == low):
        _refuse(field, f"{_shown(converted)} is {'not above' if low_open else 'below'} the minimum of {low:g}", fix)
    if converted > high:
        _refuse(field, f"{_shown(converted)} is above the maximum of {high:g}", fix)
    return converted


def text(
    field: str,
    value: Any,
    *,
    max_chars: int,
    min_chars: int = 1,
    pattern: re.Pattern[str] | None = None,
    what: str = "",
    fix: str = "",
) -> str:
    """``value`` as a string of ``min_chars``..``max_chars`` characters, matching ``pattern`` in full if given."""
    fix = fix or f"pass {field} as text of at most {max_chars} characters"
    if not isinstance(value, str):
        _refuse(field, f"must be text, not {_kind(value)}", fix)
    if len(value) > max_chars:
        _refuse(field, f"is {len(value)} characters, over the limit of {max_chars}", fix)
    if len(value) < min_chars:
        _refuse(field, "is empty" if not value else f"is shorter than {min_chars} characters", fix)
    if pattern is not None and not pattern.fullmatch(value):
        _refuse(field, f"is not {what or 'in the expected form'}", fix)
    return value


def choice(field: str, value: Any, choices: Sequence[str], *, fix: str = "") -> str:
    """``value`` if it is one of ``choices`` (the refused value is not repeated)."""
    if not isinstance(value, str) or value not in choices:
        _refuse(field, f"{_kind(value)} is not one of the allowed values", fix or "one of " + ", ".join(choices))
    return value


def flag(field: str, value: Any) -> bool:
    """``value`` if it is a boolean (1, "true" and "yes" are not)."""
    if not isinstance(value, bool):
        _refuse(field, f"must be true or false, not {_kind(value)}", f"pass {field} as a boolean")
    return value


def text_list(
    field: str,
    value: Any,
    *,
    max_items: int,
    item: Callable[[str, Any], str],
    min_items: int = 1,
) -> list[str]:
    """``value`` as a list of ``min_items``..``max_items`` strings, each checked by ``item(field[i], value)``."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        _refuse(field, f"must be a list, not {_kind(value)}", f"pass {field} as a list of at most {max_items}")
    if len(value) > max_items:
        _refuse(field, f"has {len(value)} items, over the limit of {max_items}", f"pass at most {max_items}")
    if len(value) < min_items:
        _refuse(field, "is empty", f"pass at least {min_items}")
    return [item(f"{field}[{index}]", entry) for index, entry in enumerate(value)]


def deployment_id(value: Any, field: str = "deployment_id") -> str:
    """A deployment id: 2-40 lower-case letters, digits or '-', starting with a letter."""
    return text(
        field,
        value,
        max_chars=40,
        pattern=_DEPLOYMENT_ID,
        what="a deployment id",
        fix="2-40 lower-case letters, digits or '-', starting with a letter; list them with tpu_status",
    )


def command_id(value: Any, field: str = "command_id", *, fix: str = "") -> str:
    """A command id (also a run id or a task id): a lower-case UUID."""
    return text(
        field,
        value,
        max_chars=36,
        pattern=_COMMAND_ID,
        what="a lower-case UUID",
        fix=fix or f"pass the {field} a tool returned",
    )


def zone(field: str, value: Any) -> str:
    """A zone name such as ``us-east5-b``."""
    return text(
        field,
        value,
        max_chars=ZONE_CHARS,
        pattern=_ZONE,
        what="a zone name",
        fix="a zone such as 'us-east5-b' (tpu_plan(show='zones') lists them)",
    )
