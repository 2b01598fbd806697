"""What the node agent answers: a node task's answer, and results and log lines fitted to one Pub/Sub message.

Why apart from the agent: these are pure shapes and budgets (no bus, no engine), tested on their own, and the
agent's module stays about receiving and carrying out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from node_agent.journal import TaskAction
from node_agent.log_lines import MAX_LINE_CHARS
from shared.messages import MAX_MESSAGE_BYTES, NodeTaskCompleted, encode_message

__all__ = ["RESULT_BUDGET_BYTES", "TASK_ACTIONS", "TaskAnswer", "fit_lines", "shrink_result"]

RESULT_BUDGET_BYTES = MAX_MESSAGE_BYTES - 4096  # room for the envelope
TASK_ACTIONS: dict[str, TaskAction] = {"serving.restart": "restart", "serving.logs": "logs", "serving.debug": "debug"}


@dataclass(frozen=True)
class TaskAnswer:
    """What the node answers to one node task (``node.task_completed``)."""

    status: Literal["completed", "failed"]
    detail: str
    lines: list[str] = field(default_factory=list)
    bundle: str = ""


def shrink_result(result: dict[str, Any], budget: int = RESULT_BUDGET_BYTES) -> dict[str, Any]:
    """Fit a result into one message: drop std and median figures, then the highest levels, saying so."""
    if len(json.dumps(result)) <= budget:
        return result
    slim = dict(result)
    slim["points"] = [
        {k: v for k, v in point.items() if not k.startswith(("std_", "median_"))} for point in result.get("points", [])
    ]
    slim["truncated"] = "std_ and median_ figures dropped to fit one message; the full result is on the node"
    while len(json.dumps(slim)) > budget and slim["points"]:
        slim["points"] = slim["points"][:-1]
        slim["truncated"] = (
            f"only the first {len(slim['points'])} levels fit one message; the full result is on the node"
        )
    return slim


def fit_lines(event: NodeTaskCompleted, lines: list[str], budget: int = MAX_MESSAGE_BYTES) -> NodeTaskCompleted:
    """``event`` with as many of the newest ``lines`` (500 at most) as fit in ``budget`` bytes, oldest dropped."""
    kept = [line[:MAX_LINE_CHARS] for line in lines][-500:]
    base = len(encode_message(event))
    costs = [len(json.dumps(line, ensure_ascii=False).encode("utf-8")) + 1 for line in kept]
    total = base + sum(costs) + 16
    start = 0
    while total > budget and start < len(kept):
        total -= costs[start]
        start += 1
    while True:
        candidate = event.model_copy(update={"lines": tuple(kept[start:])})
        if len(encode_message(candidate)) <= budget or start >= len(kept):
            return candidate
        start += 1
