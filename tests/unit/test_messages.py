"""Wire contracts: valid messages round-trip, bad ones yield one clear error naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.domain.errors import InvalidMessage
from shared.messages import (
    MAX_MESSAGE_BYTES,
    CreateDeployment,
    ReconcileTick,
    RunBenchmark,
    decode_message,
    encode_message,
    message_attributes,
    topic_for,
)
from shared.messages.contracts import KINDS
from tests.support.builders import command_bytes, command_dict, spec_dict


class TestDecode:
    def test_a_valid_create_round_trips_through_the_wire_format(self) -> None:
        message = decode_message(command_bytes())
        assert isinstance(message, CreateDeployment)
        assert message.spec.accelerator == "v6e-4"
        assert decode_message(encode_message(message)) == message

    def test_attributes_carry_the_routing_keys(self) -> None:
        message = decode_message(command_bytes("benchmark.run"))
        assert isinstance(message, RunBenchmark)
        attrs = message_attributes(message)
        assert attrs["kind"] == "benchmark.run"
        assert attrs["deployment_id"] == "gemma-a"
        assert attrs["command_id"] == message.command_id

    def test_a_tick_needs_no_deployment_and_travels_on_the_ticks_topic(self) -> None:
        tick = decode_message(command_bytes("reconcile.tick"))
        assert isinstance(tick, ReconcileTick)
        assert tick.deployment_id is None
        assert topic_for(tick) == "ticks"
        assert topic_for(decode_message(command_bytes())) == "commands"

    @pytest.mark.parametrize(
        ("mutate", "field"),
        [
            (lambda b: b.update(kind="deployment.explode"), "kind"),
            (lambda b: b.update(schema_version="2"), "schema_version"),
            (lambda b: b.update(command_id="not-a-uuid"), "command_id"),
            (lambda b: b.update(deployment_id="Bad_ID"), "deployment_id"),
            (lambda b: b.update(issued_at="2026-12-02T12:00:00"), "issued_at"),
            (lambda b: b.update(surprise=1), "surprise"),
            (lambda b: b.pop("command_id"), "command_id"),
            (lambda b: b["spec"].update(accelerator="v6e-3"), "spec.accelerator"),
            (lambda b: b["spec"].update(zones=[]), "spec.zones"),
            (lambda b: b["spec"].update(zones=["us-east5-b; rm -rf /"]), "spec.zones.0"),
            (lambda b: b["spec"].update(hedge=9), "spec.hedge"),
            (lambda b: b["spec"].update(tiers=["spot", "spot"]), "spec.tiers"),
            (lambda b: b["spec"].update(tiers=["reservation"]), "spec.reservation_name"),
            (lambda b: b["spec"].update(model="meta-llama/evil"), "spec.model"),
            (lambda b: b["spec"].update(deployment_id="other"), "spec.deployment_id"),
        ],
    )
    def test_a_bad_field_is_named_in_the_one_error(self, mutate: Any, field: str) -> None:
        body = command_dict()
        mutate(body)
        with pytest.raises(InvalidMessage) as caught:
            decode_message(json.dumps(body))
        assert caught.value.field == field
        assert field in str(caught.value)

    def test_an_oversized_message_is_refused_before_parsing(self) -> None:
        body = command_dict("serving.restart", reason="x")
        raw = json.dumps(body).encode() + b" " * MAX_MESSAGE_BYTES
        with pytest.raises(InvalidMessage, match="over the 65536-byte limit"):
            decode_message(raw)

    @pytest.mark.parametrize("raw", [b"", b"\xff\xfe", b"[]", b"null", b'"text"', b"{", b"[" * 5000 + b"]" * 5000])
    def test_non_objects_are_rejected_as_the_whole_message(self, raw: bytes) -> None:
        with pytest.raises(InvalidMessage) as caught:
            decode_message(raw)
        assert caught.value.field == "<message>"

    def test_a_rate_benchmark_without_rates_names_the_field_and_fix(self) -> None:
        body = command_dict("benchmark.run", benchmark={"mode": "rate"})
        with pytest.raises(InvalidMessage) as caught:
            decode_message(json.dumps(body))
        assert caught.value.field == "benchmark.request_rate"
        assert "at least one rate" in caught.value.problem


def _valid_bodies() -> st.SearchStrategy[dict[str, Any]]:
    return st.sampled_from(sorted(set(KINDS) - {"deployment.observed", "deployment.phase_changed"})).map(
        lambda kind: command_dict(kind) if kind not in _EVENT_FIELDS else {**command_dict(kind), **_EVENT_FIELDS[kind]}
    )


_EVENT_FIELDS: dict[str, dict[str, Any]] = {
    "benchmark.completed": {"run_id": "0b5d1c3e-8a49-4c57-9a8e-3f8c1b2a9d10", "status": "completed"},
    "node.booted": {"node": "gemma-a-g1-a0"},
}

_json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    """A valid body with one path replaced, removed or added: the inputs most likely to slip through."""
    body = draw(_valid_bodies())
    target: dict[str, Any] = body
    if "spec" in body and draw(st.booleans()):
        target = body["spec"]
    key = draw(st.sampled_from([*sorted(target), "extra_field"]))
    action = draw(st.sampled_from(["replace", "delete"]))
    if action == "delete":
        target.pop(key, None)
    else:
        target[key] = draw(_json_values)
    return json.dumps(body).encode()


_arbitrary_inputs = (
    st.binary(max_size=300)
    | st.text(max_size=300).map(str.encode)
    | _json_values.map(lambda v: json.dumps(v).encode())
    | _mutated()
)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_arbitrary_inputs)
def test_every_input_is_a_valid_message_or_one_clear_rejection(raw: bytes) -> None:
    try:
        message = decode_message(raw)
    except InvalidMessage as exc:
        assert exc.field, "a rejection must name a field"
        assert exc.problem
        return
    assert message.kind in KINDS
    assert decode_message(encode_message(message)) == message


@settings(max_examples=300, deadline=None)
@given(zones=st.lists(st.sampled_from(["us-east5-b", "europe-west4-a", "asia-east1-c"]), min_size=1, max_size=3))
def test_a_spec_rejects_repeated_zones_and_accepts_distinct_ones(zones: list[str]) -> None:
    body = command_dict(spec=spec_dict(zones=zones))
    if len(set(zones)) == len(zones):
        assert decode_message(json.dumps(body)).spec.zones == tuple(zones)
    else:
        with pytest.raises(InvalidMessage, match="each zone may appear once"):
            decode_message(json.dumps(body))
