"""The push subscriptions' filters come from the routing table, never from hand-written strings.

``shared/messages/routing.py`` says which function handles which kind (and which tick purpose) from which topic;
``scripts/render_routes.py`` renders the filters into ``terraform/envs/default/routes.json``, which main.tf reads.
These tests hold the checked-in file to the table, main.tf's triggers to the file, and the rendered filters to
the table's meaning (each kind and purpose reaches the functions that handle it, and only those).
"""

from __future__ import annotations

import importlib.util
import json
from types import ModuleType
from typing import Any

import pytest

from shared.adapters._pubsub_rules import MAX_FILTER_BYTES, parse_filter
from shared.messages.routing import (
    DEFAULT_RECEIVER,
    FUNCTION_PURPOSES,
    FUNCTION_TRIGGERS,
    ROUTED_BY,
    TICK_PURPOSES,
    TOPIC_KINDS,
    PushRoute,
    push_routes,
    route_filters,
)
from tests.support.terraform_config import REPO_ROOT, TERRAFORM_ROOT, ModuleDir, load_module

ENV = TERRAFORM_ROOT / "envs" / "default"
ROUTES_FILE = ENV / "routes.json"
SCRIPT = REPO_ROOT / "scripts" / "render_routes.py"
FUNCTION_MODULE = "modules/event_function"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_routes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def env() -> ModuleDir:
    return load_module(ENV)


def _function_calls(env: ModuleDir) -> dict[str, dict[str, Any]]:
    return {name: body for name, body in env.modules.items() if body["source"].endswith(FUNCTION_MODULE)}


def test_the_checked_in_routes_json_is_the_rendering_of_the_table() -> None:
    script = _script()
    assert script.ROUTES_FILE == ROUTES_FILE
    assert ROUTES_FILE.read_text(encoding="utf-8") == script.render(), (
        f"{ROUTES_FILE.relative_to(REPO_ROOT)} is out of date with shared/messages/routing.py: run {script.COMMAND}"
    )
    assert json.loads(ROUTES_FILE.read_text(encoding="utf-8")) == route_filters()
    assert script.main(["--check"]) == 0


def test_main_tf_reads_every_push_filter_from_routes_json(env: ModuleDir) -> None:
    assert env.locals["route_filters"] == '${jsondecode(file("${path.module}/routes.json"))}'
    calls = _function_calls(env)
    triggers = {(call["name"], key): trigger for call in calls.values() for key, trigger in call["triggers"].items()}
    assert set(triggers) == {(route.function, route.trigger) for route in push_routes()}, (
        "main.tf's push subscriptions and the routing table name different (function, trigger) pairs"
    )
    for (function, key), trigger in triggers.items():
        expected = f"${{local.route_filters.{function}.{key}}}"
        assert trigger.get("filter") == expected, f"{function}.{key}: filter must be {expected}, not a literal"
        assert f"local.topic_ids.{key}" in trigger["topic"], f"{function}.{key}: the trigger key names its topic"
    assert "_filter" not in "".join(name for name in env.locals if name != "route_filters"), "hand-written filters"


def _receivers(routes: tuple[PushRoute, ...], topic: str, attributes: dict[str, str]) -> set[str]:
    receivers = set()
    for route in routes:
        parsed = parse_filter(route.filter)
        if route.topic == topic and (parsed is None or parsed.matches(attributes)):
            receivers.add(route.function)
    return receivers


def test_rendered_filters_route_each_kind_and_purpose_to_its_handlers_only() -> None:
    routes = push_routes()
    for route in routes:
        assert len((route.filter or "").encode()) <= MAX_FILTER_BYTES, f"{route}: Pub/Sub filters are at most 256 bytes"
    for topic, kinds in TOPIC_KINDS.items():
        subscribed = {function for function, triggers in FUNCTION_TRIGGERS.items() if topic in triggers}
        if not subscribed:
            continue  # node-tasks: read by the node agents, never pushed to a function
        if ROUTED_BY[topic] == "kind":
            for kind in kinds:
                handlers = {f for f in subscribed if kind in FUNCTION_TRIGGERS[f][topic]}
                receivers = _receivers(routes, topic, {"kind": kind, "schema_version": "1"})
                if len(subscribed) == 1:
                    assert receivers == subscribed, f"{kind} on {topic}"  # the only receiver takes all, drops the rest
                else:
                    assert receivers == handlers and len(handlers) == 1, f"{kind} on {topic} reaches {receivers}"
        else:
            for purpose in TICK_PURPOSES:
                handlers = {f for f in subscribed if purpose in FUNCTION_PURPOSES[f]}
                receivers = _receivers(routes, topic, {"kind": "reconcile.tick", "purpose": purpose})
                assert receivers == handlers and len(handlers) == 1, f"{purpose} tick reaches {receivers}"
        if len(subscribed) > 1:
            unknown = {"kind": "reconcile.tick"} if topic == "ticks" else {"kind": "deployment.new_kind"}
            assert _receivers(routes, topic, unknown) == {DEFAULT_RECEIVER[topic]}, f"{unknown} on {topic}"


def test_the_deployed_filters_change_only_knowingly() -> None:
    """Pub/Sub cannot change a subscription's filter: a new string (even a reordering) makes Terraform replace the
    subscription and drop what it holds. These are the filters as deployed: main.tf's hand-written ones when
    routes.json took over, plus ``serving.debug`` (debug bundles; docs/deploy.md "Upgrading" says how to apply a
    filter change without losing a command). A change here must come with such a note."""
    benchmark = (
        'attributes.kind = "benchmark.run" OR attributes.kind = "benchmark.schedule" '
        'OR attributes.kind = "serving.restart" OR attributes.kind = "serving.logs" '
        'OR attributes.kind = "serving.debug"'
    )
    assert route_filters() == {
        "provision": {"commands": f"NOT ({benchmark})", "ticks": 'NOT attributes.purpose = "monitor"'},
        "monitor": {"ticks": 'attributes.purpose = "monitor"'},
        "benchmark": {"events": "", "commands": benchmark},
    }
