"""Which message kinds may travel on which topic, and which function handles them from which trigger.

The topic a delivery came from is known from the push path Pub/Sub posts to (``/projects/P/topics/T``,
set in each push subscription by Terraform), never from attributes a publisher sets. A kind that may not
travel on the topic it arrived from is refused and recorded (``shared.entry``): a TPU VM, which may
publish only on the events topic, can report about itself but never command the controller.

Built from the message unions, so a new command or event class lands on the right topic by its family. The same
table renders the push subscriptions' filters (:func:`subscription_filter`, :func:`push_routes`): Terraform reads
them from ``terraform/envs/default/routes.json`` (``scripts/render_routes.py`` writes it) and the local cloud's
runner subscribes with them, so which function receives a kind is stated once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from shared.messages.contracts import NODE_TASK_KINDS, Command, Event, ReconcileTick

__all__ = [
    "DEFAULT_RECEIVER",
    "FUNCTION_PURPOSES",
    "FUNCTION_TRIGGERS",
    "ROUTED_BY",
    "TICK_PURPOSES",
    "TOPIC_KINDS",
    "PushRoute",
    "Trigger",
    "accepted_on",
    "kinds_of",
    "push_routes",
    "route_filters",
    "subscription_filter",
]


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

_NODE_COMMANDS: tuple[str, ...] = ("benchmark.run", "benchmark.schedule", *NODE_TASK_KINDS)
"""Benchmark commands and node tasks: the benchmark function dispatches both to the node agent. Its subscription's
filter names them in this order, as deployed: Pub/Sub cannot change a filter in place, so Terraform would replace
the subscription (and drop what it holds) for a mere reordering."""

FUNCTION_TRIGGERS: dict[str, dict[str, frozenset[str]]] = {
    "provision": {"commands": _COMMANDS - frozenset(_NODE_COMMANDS), "ticks": TOPIC_KINDS["ticks"]},
    "monitor": {"ticks": TOPIC_KINDS["ticks"]},
    "benchmark": {
        "events": frozenset({"benchmark.completed", "node.booted", "node.task_completed"}),
        "commands": frozenset(_NODE_COMMANDS),
    },
}
"""Function -> the logical topics that trigger it -> the kinds it handles from each."""

ROUTED_BY: dict[str, str] = {"commands": "kind", "ticks": "purpose", "events": "kind"}
"""Logical topic -> the attribute its push subscriptions select on. Every tick is a ``reconcile.tick``, so ticks go
by ``purpose``, an attribute Scheduler jobs set (``terraform/envs/default/ticks.json``); a tick the controller
publishes itself carries none (``message_attributes``) and reconciles."""

TICK_PURPOSES: frozenset[str] = frozenset(get_args(ReconcileTick.model_fields["purpose"].annotation))

FUNCTION_PURPOSES: dict[str, frozenset[str]] = {
    "provision": TICK_PURPOSES - {"monitor"},
    "monitor": frozenset({"monitor"}),
}
"""Function -> the tick purposes it handles (reconcile and janitor sweeps; monitor probes)."""

DEFAULT_RECEIVER: dict[str, str] = {"commands": "provision", "ticks": "provision"}
"""Logical topic with several receivers -> the one that gets whatever the others do not select: a kind this table
does not know yet, a tick without a ``purpose`` attribute. Its filter negates the others', so nothing published on
the topic goes unrouted (the provisioner refuses and records a kind it does not handle)."""

_FILTER_VALUE = re.compile(r"^[a-z][a-z0-9_.-]*$")


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


@dataclass(frozen=True)
class PushRoute:
    """One push subscription: ``function`` is triggered from ``topic`` (logical) through ``filter`` (None: all)."""

    function: str
    trigger: str
    """The trigger's key: in the event_function module's ``triggers`` map and in the subscription's name."""
    topic: str
    filter: str | None


def _receivers(topic: str) -> list[str]:
    return [function for function, triggers in FUNCTION_TRIGGERS.items() if topic in triggers]


def _selected(function: str, topic: str) -> frozenset[str]:
    """The values of the topic's routing attribute that ``function`` handles from it."""
    return FUNCTION_PURPOSES[function] if ROUTED_BY[topic] == "purpose" else FUNCTION_TRIGGERS[function][topic]


def _any_of(attribute: str, values: frozenset[str]) -> str:
    def order(value: str) -> tuple[int, str]:
        return (_NODE_COMMANDS.index(value) if value in _NODE_COMMANDS else len(_NODE_COMMANDS), value)

    for value in values:
        if not _FILTER_VALUE.match(value):
            raise ValueError(f"{attribute} {value!r}: not a plain name, so not rendered into a filter")
    return " OR ".join(f'attributes.{attribute} = "{value}"' for value in sorted(values, key=order))


def subscription_filter(function: str, topic: str) -> str | None:
    """The filter of ``function``'s push subscription on the logical ``topic`` (None: it receives everything).

    A topic's only receiver takes everything; with several, each but the topic's :data:`DEFAULT_RECEIVER` selects
    what it handles (``attributes.A = "v" OR ...``) and the default receiver takes the rest (``NOT ...``). Only the
    part of the Pub/Sub filter language the local bus understands is used (shared/adapters/_pubsub_rules.py).
    """
    if topic not in FUNCTION_TRIGGERS[function]:
        raise KeyError(f"{function} is not triggered from the {topic} topic")
    receivers = _receivers(topic)
    if len(receivers) == 1:
        return None
    attribute = ROUTED_BY[topic]
    default = DEFAULT_RECEIVER[topic]
    if function != default:
        return _any_of(attribute, _selected(function, topic))
    others = [_selected(other, topic) for other in receivers if other != default]
    taken = frozenset().union(*others)
    rest = _any_of(attribute, taken)
    return f"NOT ({rest})" if len(taken) > 1 else f"NOT {rest}"


def push_routes() -> tuple[PushRoute, ...]:
    """Every push subscription: (function, trigger, topic, filter), in the table's order."""
    return tuple(
        PushRoute(function, topic, topic, subscription_filter(function, topic))
        for function, triggers in FUNCTION_TRIGGERS.items()
        for topic in triggers
    )


def route_filters() -> dict[str, dict[str, str]]:
    """Function -> trigger -> filter, ``""`` for none (Pub/Sub's "no filter"): what ``routes.json`` holds."""
    filters: dict[str, dict[str, str]] = {}
    for route in push_routes():
        filters.setdefault(route.function, {})[route.trigger] = route.filter or ""
    return filters
