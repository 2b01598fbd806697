"""Which message kinds may travel on which topic, and which function handles them from which trigger.

The topic a delivery came from is known from the push path Pub/Sub posts to (``/projects/P/topics/T``,
set in each push subscription by Terraform), never from attributes a publisher sets. A kind that may not
travel on the topic it arrived from is refused and recorded (``shared.entry``): a TPU VM, which may
publish only on the events topic, can report about itself but never command the controller.

Built from the message unions, so a new command or event class lands on the right topic by its family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from shared.messages.contracts import NODE_TASK_KINDS, Command, Event

__all__ = ["FUNCTION_TRIGGERS", "TOPIC_KINDS", "Trigger", "accepted_on", "kinds_of"]


def kinds_of(union: Any) -> frozenset[str]:
    """The ``kind`` literals of a discriminated union (``Annotated[A | B, Field(discriminator="kind")]``)."""
    members = get_args(get_args(union)[0])
    return frozenset(member.model_fields["kind"].default for member in members)


_COMMANDS = kinds_of(Command) - {"reconcile.tick"}
_EVENTS = kinds_of(Event)

TOPIC_KINDS: dict[str, frozenset[str]] = {
    "commands": _COMMANDS,
    "ticks": frozenset({"reconcile.tick"}),
    "events": _EVENTS,
    "node-tasks": frozenset({"benchmark.run", *NODE_TASK_KINDS}),
}
"""Logical topic -> the kinds that may be published on it (the node-tasks topic is read by node agents only)."""

_NODE_COMMANDS = frozenset({"benchmark.run", "benchmark.schedule", *NODE_TASK_KINDS})

FUNCTION_TRIGGERS: dict[str, dict[str, frozenset[str]]] = {
    "provision": {"commands": _COMMANDS - _NODE_COMMANDS, "ticks": TOPIC_KINDS["ticks"]},
    "monitor": {"ticks": TOPIC_KINDS["ticks"]},
    "benchmark": {
        "commands": _NODE_COMMANDS,
        "events": frozenset({"benchmark.completed", "node.booted", "node.task_completed"}),
    },
}
"""Function -> the logical topics that trigger it -> the kinds it handles from each."""


@dataclass(frozen=True)
class Trigger:
    """One topic that triggers a function: the kinds it handles from there, out of the kinds allowed there."""

    topic: str
    """The logical topic (commands, ticks, events)."""
    handles: frozenset[str]

    @property
    def allowed(self) -> frozenset[str]:
        return TOPIC_KINDS[self.topic]


def accepted_on(function: str, topic_name: Callable[[str], str]) -> dict[str, Trigger]:
    """A function's triggers keyed by configured topic name (what the push path names)."""
    return {topic_name(logical): Trigger(logical, kinds) for logical, kinds in FUNCTION_TRIGGERS[function].items()}
