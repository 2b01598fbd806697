"""``tpu_deploy(action='update')`` / ``tpuctl update``: a partial spec change published as ``deployment.update``.

Through the real ``GatewayCore`` on the embedded adapters (the ``world`` fixture), and through the provisioner
on the TPU simulator, which applies the update: the generation bumps, and a new generation runs on a new slice.
That is why an update of a deployment whose slice is up needs confirmation (not a change of when it ends: TTL,
budget and idle apply in place), while one of a stopped or still-searching deployment does not. ``hedge`` is no
MCP argument since issue #23 (``tpuctl update --hedge``): its updates are checked through the core and the CLI.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import ElicitResult

from mcp_client_gateway.cli import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, run
from mcp_client_gateway.core import GatewayCore, GatewayError, GatewayPorts
from shared.adapters.file_secrets import FileSecretStore
from shared.adapters.local_bus import LocalBus
from shared.config import Settings
from shared.domain.errors import PermanentError
from shared.domain.models import CommandRecord, DeploymentRecord, Desired, Phase, QueuedResourceState, Tier
from shared.messages import UpdateDeployment, decode_message
from shared.ports import Delivery
from tests.mcp.conftest import GatewayWorld, refusal_confirmation, text
from tests.support.fixtures_provisioner import HarnessFactory, spot, world
from tests.support.provisioner_harness import Harness

pytestmark = pytest.mark.anyio

CHEAP = "us-central1-b"
EUROPE = "europe-west4-a"
ZONES = (CHEAP, EUROPE)


async def call(world: GatewayWorld, arguments: dict[str, Any], **client: Any) -> Any:
    async with Client(world.server(), **client) as session:
        return await session.call_tool("tpu_deploy", {"action": "update", "deployment_id": "gemma-a", **arguments})


def with_spec(world: GatewayWorld, record: DeploymentRecord, **fields: Any) -> DeploymentRecord:
    """Store ``record`` with some spec fields changed (``serving`` as a dict of knobs)."""
    serving = fields.pop("serving", None)
    spec = record.spec.model_copy(update=fields)
    if serving is not None:
        spec = spec.model_copy(update={"serving": spec.serving.model_copy(update=serving)})
    return world.store.put_deployment(record.model_copy(update={"spec": spec}), expected_version=record.version)


class TestWithoutASliceToReplace:
    async def test_a_ttl_change_of_a_stopped_deployment_is_published_at_once_with_only_that_field_changed(
        self, world: GatewayWorld
    ) -> None:
        record = world.seed("gemma-a", phase=Phase.STOPPED, desired=Desired.STOPPED)
        result = await call(world, {"ttl_hours": 8})
        assert not result.is_error, text(result)
        body = result.structured_content
        assert body["kind"] == "deployment.update" and body["replaces_slice"] is False
        assert body["changes"] == [{"field": "ttl_hours", "old": None, "new": 8.0}]
        assert body["from_generation"] == 1
        assert "ttl_hours unset → 8" in text(result) and "slice and the endpoint are kept" in body["next_step"]
        (message,) = world.published()
        assert isinstance(message, UpdateDeployment) and message.command_id == body["command_id"]
        assert message.expected_generation == 1
        assert message.spec == record.spec.model_copy(update={"ttl_hours": 8.0})  # nothing else moved

    async def test_the_command_is_ordered_by_the_deployment_id(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", phase=Phase.STOPPED, desired=Desired.STOPPED)
        world.bus.ensure_subscription(world.settings.topic_commands, "ordering")
        result = await call(world, {"budget_usd": 25.5})
        assert not result.is_error, text(result)
        seen: list[Delivery] = []
        world.bus.pull("ordering", seen.append, max_messages=10, timeout_s=0.0)
        assert [(d.ordering_key, decode_message(d.data).kind) for d in seen] == [("gemma-a", "deployment.update")]

    async def test_serving_knobs_and_tiers_land_in_the_spec_and_health_is_kept(self, world: GatewayWorld) -> None:
        record = world.seed("gemma-a", phase=Phase.SEARCHING)  # no resource yet: nothing to replace
        record = world.store.put_deployment(
            record.model_copy(
                update={
                    "spec": record.spec.model_copy(
                        update={"health": record.spec.health.model_copy(update={"boot_budget_s": 900.0})}
                    )
                }
            ),
            expected_version=record.version,
        )
        result = await call(world, {"max_model_len": 8192, "kv_cache_dtype": "fp8", "tiers": ["spot", "on_demand"]})
        assert not result.is_error, text(result)
        fields = [change["field"] for change in result.structured_content["changes"]]
        assert fields == ["tiers", "max_model_len", "kv_cache_dtype"]
        (message,) = world.published()
        assert message.spec.serving.max_model_len == 8192 and message.spec.serving.kv_cache_dtype == "fp8"
        assert message.spec.tiers == (Tier.SPOT, Tier.ON_DEMAND) and message.spec.hedge == record.spec.hedge
        assert message.spec.health.boot_budget_s == 900.0  # the stored thresholds ride along unchanged
        assert "search starts again" in result.structured_content["next_step"]

    async def test_clear_unsets_a_field(self, world: GatewayWorld) -> None:
        record = world.seed("gemma-a", phase=Phase.STOPPED, desired=Desired.STOPPED)
        with_spec(world, record, ttl_hours=4.0, serving={"max_model_len": 4096})
        result = await call(world, {"clear": ["ttl_hours", "max_model_len"]})
        assert not result.is_error, text(result)
        assert result.structured_content["changes"] == [
            {"field": "ttl_hours", "old": 4.0, "new": None},
            {"field": "max_model_len", "old": 4096, "new": None},
        ]
        (message,) = world.published()
        assert message.spec.ttl_hours is None and message.spec.serving.max_model_len is None


class TestReplacingASlice:
    async def test_an_update_of_a_serving_deployment_is_refused_until_confirmed_then_published(
        self, world: GatewayWorld
    ) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        refused = await call(world, {"zones": ["us-east5-b"]})
        body = refusal_confirmation(refused)
        assert body["action"] == "update" and body["target"] == "gemma-a" and body["generation"] == 1
        impact = body["impact"]
        assert "zones [us-east5-b, europe-west4-a] → [us-east5-b]" in impact
        assert "gemma-a-g1-a1 (europe-west4-a, spot) keeps serving" in impact and "$2.85/h" in impact
        assert world.published() == []

        accepted = await call(world, {"zones": ["us-east5-b"], "confirm": body["confirm"]})
        assert not accepted.is_error, text(accepted)
        assert accepted.structured_content["replaces_slice"] is True
        (message,) = world.published()
        assert isinstance(message, UpdateDeployment) and message.spec.zones == ("us-east5-b",)

    async def test_a_token_confirms_only_the_change_it_was_issued_for(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        token = refusal_confirmation(await call(world, {"max_model_len": 4096}))["confirm"]
        other = await call(world, {"max_model_len": 8192, "confirm": token})
        assert other.is_error
        assert text(other).startswith("[confirmation_required] confirm: 'gemma-a' changed since the token was issued")
        assert world.published() == []

    async def test_a_slice_being_provisioned_counts_as_one_to_replace(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", phase=Phase.PROVISIONING)
        record = world.store.get_deployment("gemma-a")
        assert record is not None
        ref = record.status.resources[0].model_copy(update={"state": QueuedResourceState.PROVISIONING})
        status = record.status.model_copy(update={"resources": [ref]})
        world.store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)
        body = refusal_confirmation(await call(world, {"max_model_len": 4096}))
        assert "found capacity and is being provisioned" in body["impact"]
        assert world.published() == []

    @pytest.mark.parametrize("mode", ["auto", "legacy"])
    async def test_an_elicitation_capable_client_asks_the_user_with_the_change_shown(
        self, world: GatewayWorld, mode: str
    ) -> None:
        world.seed("gemma-a")
        asked: list[str] = []

        async def callback(context: Any, params: Any) -> ElicitResult:
            asked.append(params.message)
            return ElicitResult(action="accept", content={"confirm": "gemma-a"})

        result = await call(world, {"max_model_len": 4096}, elicitation_callback=callback, mode=mode)
        assert not result.is_error, text(result)
        assert asked and "max_model_len unset → 4096" in asked[0] and "Type 'gemma-a' to confirm" in asked[0]
        assert [m.spec.serving.max_model_len for m in world.published()] == [4096]


class TestRefusals:
    @pytest.mark.parametrize(
        ("seeded", "arguments", "start"),
        [
            (None, {"ttl_hours": 8}, "[not_found] deployment_id: no deployment 'gemma-a'"),
            (Desired.ABSENT, {"ttl_hours": 8}, "[failed_precondition] deployment_id: 'gemma-a' is being deleted"),
            (Desired.STOPPED, {}, "[invalid_argument] changes: no field to change was given"),
            (
                Desired.STOPPED,
                {"tiers": ["flex_start", "spot", "on_demand"]},
                "[invalid_argument] changes: 'gemma-a' already has these values",
            ),
            (Desired.STOPPED, {"hedge": 3}, "[invalid_argument] hedge: is not a parameter of tpu_deploy"),
            (Desired.STOPPED, {"model": "gemma-4-e2b"}, "[invalid_argument] model: cannot be changed by an update"),
            (Desired.STOPPED, {"ttl_hours": 3, "clear": ["ttl_hours"]}, "[invalid_argument] ttl_hours: is both"),
            (Desired.STOPPED, {"zones": ["us-east5-z"]}, "[invalid_argument] zones[0]: us-east5-z is not a zone"),
            (Desired.STOPPED, {"tiers": ["reservation"]}, "[invalid_argument] tiers: 'reservation' needs"),
            (Desired.STOPPED, {"accelerator": "v6e-1"}, "[failed_precondition] accelerator: gemma-4-26b-a4b would"),
            (Desired.STOPPED, {"ttl_hours": 0}, "[invalid_argument] ttl_hours:"),
            (Desired.STOPPED, {"spec": {}}, "[invalid_argument] spec:"),
        ],
    )
    async def test_a_bad_update_is_one_line_naming_the_field_and_publishes_nothing(
        self, world: GatewayWorld, seeded: Desired | None, arguments: dict[str, Any], start: str
    ) -> None:
        if seeded is not None:
            phase = Phase.DELETING if seeded is Desired.ABSENT else Phase.STOPPED
            world.seed("gemma-a", phase=phase, desired=seeded)
        result = await call(world, arguments)
        assert result.is_error and text(result).startswith(start), text(result)
        assert ". Fix: " in text(result)
        assert world.published() == []

    def test_the_core_checks_values_the_cli_passes_without_a_schema(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", phase=Phase.STOPPED, desired=Desired.STOPPED)
        for changes, field in (
            ({"ttl_hours": float("nan")}, "ttl_hours"),
            ({"hedge": True}, "hedge"),
            ({"spec": {"model": "x"}}, "changes"),
            ({"tiers": ["gold"]}, "tiers[0]"),
        ):
            with pytest.raises(GatewayError) as refused:
                world.core.update_deployment("gemma-a", changes)
            assert refused.value.code == "invalid_argument" and refused.value.field == field
        with pytest.raises(GatewayError, match=r"clear\[0\]"):
            world.core.update_deployment("gemma-a", {}, clear=["model"])
        assert world.published() == []

    def test_a_retried_command_id_the_controller_recorded_publishes_nothing(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", phase=Phase.STOPPED, desired=Desired.STOPPED)
        command_id = world.core.update_deployment("gemma-a", {"ttl_hours": 8}).command_id
        world.published()
        world.store.record_command(
            CommandRecord(
                command_id=command_id,
                kind="deployment.update",
                deployment_id="gemma-a",
                received_at=world.core.ports.clock.now(),
            )
        )
        again = world.core.update_deployment("gemma-a", {"ttl_hours": 8}, command_id=command_id)
        assert again.duplicate and again.command_id == command_id and again.changes == []
        assert world.published() == []


# ---------------------------------------------------------------- through the controller


@dataclass
class Controlled:
    """The gateway on the provisioner's store; ``deliver`` hands what the gateway published to the provisioner."""

    harness: Harness
    core: GatewayCore
    bus: LocalBus

    def deliver(self) -> list[str]:
        outcomes: list[str] = []

        def handle(delivery: Delivery) -> None:
            try:
                outcomes.append(self.harness.provisioner.handle(decode_message(delivery.data)))
            except PermanentError as exc:  # what the function entry records as failed (and acks)
                outcomes.append(f"refused: {type(exc).__name__}: {exc}")

        while self.bus.pull("controller", handle, max_messages=10, timeout_s=0.0):
            pass
        return outcomes


def gateway_on(h: Harness, folder: Path) -> Controlled:
    """A gateway on the harness's store and clock, publishing to a bus the test delivers from."""
    settings = Settings(backend="local", data_dir=folder / "gateway")
    bus = LocalBus(folder / "gateway-bus.sqlite")
    bus.ensure_topic(settings.topic_commands)
    bus.ensure_subscription(settings.topic_commands, "controller")
    ports = GatewayPorts(
        settings=settings, store=h.store, bus=bus, secrets=FileSecretStore(folder / "secrets"), clock=h.clock
    )
    return Controlled(h, GatewayCore(ports), bus)


@pytest.fixture
def controlled(harness_factory: HarnessFactory, tmp_path: Path) -> Iterator[Controlled]:
    made = gateway_on(harness_factory(world({CHEAP: spot(8), EUROPE: spot(8)})), tmp_path)
    yield made
    made.bus.close()


def _serving(h: Harness) -> None:
    """What the monitor does once vLLM answers: mark the deployment SERVING."""
    record = h.record()
    status = record.status.model_copy(update={"phase": Phase.SERVING})
    h.store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)


class TestThroughTheController:
    def test_a_ttl_change_of_a_serving_deployment_applies_in_place_without_confirmation_or_a_second_slice(
        self, controlled: Controlled
    ) -> None:
        h, core = controlled.harness, controlled.core
        h.create(zones=ZONES)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        _serving(h)
        before = h.record()
        assert core.update_confirmation("gemma", {"ttl_hours": 8, "budget_usd": 40}) is None
        accepted = core.update_deployment("gemma", {"ttl_hours": 8, "budget_usd": 40})
        assert not accepted.replaces_slice and "slice and the endpoint are kept" in accepted.next_step
        (outcome,) = controlled.deliver()
        assert outcome.startswith("updated gemma in place (generation 1")
        after = h.record()
        assert after.generation == 1
        assert after.spec == before.spec.model_copy(update={"ttl_hours": 8.0, "budget_usd": 40.0})
        h.run(10)
        assert h.active() == ["gemma-g1-a0"], "the running slice is kept; no second one is asked for"

    def test_a_serving_change_of_a_serving_deployment_replaces_its_slice_so_it_is_confirmed(
        self, controlled: Controlled
    ) -> None:
        h, core = controlled.harness, controlled.core
        h.create(zones=ZONES)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        _serving(h)
        before = h.record()
        with pytest.raises(GatewayError) as refused:
            core.update_deployment("gemma", {"max_model_len": 4096})
        assert refused.value.code == "confirmation_required" and refused.value.confirmation is not None
        assert controlled.deliver() == []  # nothing was published

        request = core.update_confirmation("gemma", {"max_model_len": 4096})
        assert request is not None and request.confirm == request.confirm.strip()
        accepted = core.update_deployment("gemma", {"max_model_len": 4096}, confirm=request.confirm)
        assert accepted.replaces_slice and [c.field for c in accepted.changes] == ["max_model_len"]
        (outcome,) = controlled.deliver()
        assert outcome.startswith("updated gemma to generation 2")
        after = h.record()
        serving = before.spec.serving.model_copy(update={"max_model_len": 4096})
        assert after.generation == 2 and after.spec == before.spec.model_copy(update={"serving": serving})

        h.run(10, until=lambda: h.record().status.observed_generation == 2)
        assert sorted(h.active()) == ["gemma-g1-a0", "gemma-g2-a1"]  # the new generation brought a second slice
        with pytest.raises(GatewayError, match=r"changed since the token was issued \(now generation 2"):
            core.update_deployment("gemma", {"max_model_len": 8192}, confirm=request.confirm)

    def test_a_stopped_deployment_is_updated_without_confirmation_and_the_generation_bumps_for_a_new_slice(
        self, controlled: Controlled
    ) -> None:
        h, core = controlled.harness, controlled.core
        h.create(zones=ZONES)
        h.run_until_phase(Phase.BOOTING, minutes=10)
        h.stop()
        h.run_until_phase(Phase.STOPPED, minutes=10)
        assert core.update_confirmation("gemma", {"ttl_hours": 2, "hedge": 2}) is None
        accepted = core.update_deployment("gemma", {"ttl_hours": 2, "hedge": 2})
        assert not accepted.replaces_slice
        (outcome,) = controlled.deliver()
        assert outcome.startswith("updated gemma to generation 2")
        record = h.record()
        assert (record.generation, record.spec.ttl_hours, record.spec.hedge) == (2, 2.0, 2)
        assert record.desired is Desired.STOPPED and h.active() == []

    def test_a_searching_deployment_needs_no_confirmation_and_an_update_behind_another_is_refused(
        self, harness_factory: HarnessFactory, tmp_path: Path
    ) -> None:
        h = harness_factory(world({CHEAP: spot(0), EUROPE: spot(0)}))
        controlled = gateway_on(h, tmp_path)
        try:
            h.create(zones=ZONES)
            h.run(3)
            assert h.record().status.phase is Phase.SEARCHING
            first = controlled.core.update_deployment("gemma", {"zones": [ZONES[0]]})
            second = controlled.core.update_deployment("gemma", {"hedge": 2})  # made against generation 1 too
            assert not first.replaces_slice and first.from_generation == second.from_generation == 1
            applied, refused = controlled.deliver()
            assert applied.startswith("updated gemma to generation 2")
            assert refused.startswith("refused: StaleGeneration: deployment 'gemma' is at generation 2")
            record = h.record()
            assert (record.generation, record.spec.zones, record.spec.hedge) == (2, (ZONES[0],), 1)
        finally:
            controlled.bus.close()


# ---------------------------------------------------------------- the CLI


def tpuctl(world: GatewayWorld, *argv: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = run(list(argv), ports=world.ports, stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


class TestCli:
    def test_update_prints_the_changes_and_json_is_the_result(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", phase=Phase.STOPPED, desired=Desired.STOPPED)
        code, stdout, stderr = tpuctl(world, "update", "gemma-a", "--ttl-hours", "8", "--tier", "spot")
        assert code == EXIT_OK, stderr
        assert "Published deployment.update for gemma-a" in stdout
        assert "changes: tiers [flex_start, spot, on_demand] → [spot]; ttl_hours unset → 8" in stdout
        code, stdout, stderr = tpuctl(world, "--format", "json", "update", "gemma-a", "--hedge", "3")
        assert code == EXIT_OK, stderr
        assert json.loads(stdout)["changes"] == [{"field": "hedge", "old": 2, "new": 3}]
        published = [(m.spec.ttl_hours, m.spec.tiers[0], m.spec.hedge) for m in world.published()]
        assert published == [(8.0, Tier.SPOT, 2), (None, Tier.FLEX_START, 3)]  # each against the stored spec

    def test_replacing_a_slice_needs_yes_or_the_name_and_nothing_is_published_without(
        self, world: GatewayWorld
    ) -> None:
        world.seed("gemma-a")
        code, _, stderr = tpuctl(world, "--quiet", "update", "gemma-a", "--zone", "us-east5-b")
        assert code == EXIT_REFUSED
        assert "error: [confirmation_required] --yes: updating 'gemma-a' (zones" in stderr
        assert world.published() == []
        code, stdout, stderr = tpuctl(world, "--quiet", "update", "gemma-a", "--zone", "us-east5-b", "--yes")
        assert code == EXIT_OK, stderr
        (message,) = world.published()
        assert isinstance(message, UpdateDeployment) and stdout.strip() == message.command_id

    @pytest.mark.parametrize(
        ("argv", "flag"),
        [
            (("--ttl-hours", "0"), "--ttl-hours"),
            (("--budget-usd", "inf"), "--budget-usd"),
            (("--idle-minutes", "1"), "--idle-minutes"),
            (("--ttl-hours", "3", "--clear", "ttl_hours"), "--ttl-hours"),
            ((), "changes"),
        ],
    )
    def test_a_bad_value_exits_2_in_one_line_naming_the_flag(
        self, world: GatewayWorld, argv: tuple[str, ...], flag: str
    ) -> None:
        world.seed("gemma-a", phase=Phase.STOPPED, desired=Desired.STOPPED)
        code, _, stderr = tpuctl(world, "update", "gemma-a", *argv)
        assert code == EXIT_USAGE, stderr
        (line,) = stderr.strip().splitlines()
        assert line.startswith(f"error: [invalid_argument] {flag}: ") and ". Fix: " in line
        assert world.published() == []
