"""Deployment tools over the in-memory MCP client: tpu_deploy (create), tpu_status (list, dashboard, follow a
command), tpu_control (delete, stop, start, restart)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from mcp import Client
from mcp.types import ElicitResult

from mcp_client_gateway.core import GatewayCore, GatewayError
from mcp_client_gateway.server import build_server
from shared.adapters.clock import ManualClock
from shared.domain.models import BenchmarkRun, CommandRecord, Desired, Phase
from shared.messages import (
    CreateDeployment,
    DeleteDeployment,
    RestartServing,
    StartDeployment,
    StopDeployment,
    new_command_id,
)
from tests.mcp.conftest import GatewayWorld, call, refusal_confirmation, text

pytestmark = pytest.mark.anyio


def answering(action: str, content: dict[str, Any] | None = None) -> Any:
    """An elicitation callback that answers every question the same way (and records the questions)."""
    asked: list[str] = []

    async def callback(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    callback.asked = asked  # type: ignore[attr-defined]
    return callback


class TestCreate:
    async def test_a_valid_spec_is_published_as_a_create_command_at_once(self, world: GatewayWorld) -> None:
        result = await call(
            world,
            "tpu_deploy",
            {"deployment_id": "gemma-a", "model": "gemma-4-26b-a4b", "zones": ["us-east5-b"], "kv_cache_dtype": "fp8"},
        )
        assert not result.is_error, text(result)
        body = result.structured_content
        assert body["kind"] == "deployment.create" and body["deployment_id"] == "gemma-a"
        (message,) = world.published()
        assert isinstance(message, CreateDeployment)
        assert message.command_id == body["command_id"]
        assert message.spec.serving.kv_cache_dtype == "fp8"
        assert f"tpu_status(command_id='{body['command_id']}')" in body["next_step"]

    async def test_a_bad_zone_is_refused_naming_the_field_and_nothing_is_published(self, world: GatewayWorld) -> None:
        result = await call(
            world, "tpu_deploy", {"deployment_id": "gemma-a", "model": "tiny-llama", "zones": ["mars-1"]}
        )
        assert result.is_error
        assert "[invalid_argument] zones" in text(result)
        assert world.published() == []

    async def test_an_unknown_model_is_rejected_by_the_schema(self, world: GatewayWorld) -> None:
        result = await call(world, "tpu_deploy", {"deployment_id": "gemma-a", "model": "llama-70b"})
        assert result.is_error and "model" in text(result)
        assert world.published() == []

    async def test_a_model_that_does_not_fit_is_refused_with_the_smallest_slice(self, world: GatewayWorld) -> None:
        result = await call(
            world, "tpu_deploy", {"deployment_id": "big", "model": "gemma-4-31b", "accelerator": "v6e-1"}
        )
        assert result.is_error
        assert "[failed_precondition] accelerator" in text(result) and "v6e-4" in text(result)
        assert world.published() == []

    async def test_an_existing_deployment_is_not_created_twice(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        result = await call(
            world, "tpu_deploy", {"deployment_id": "gemma-a", "model": "tiny-llama", "accelerator": "v6e-1"}
        )
        assert result.is_error and "[already_exists]" in text(result)

    async def test_a_retry_with_a_recorded_command_id_publishes_nothing(self, world: GatewayWorld) -> None:
        first = await call(
            world, "tpu_deploy", {"deployment_id": "gemma-a", "model": "tiny-llama", "accelerator": "v6e-1"}
        )
        command_id = first.structured_content["command_id"]
        world.store.record_command(
            CommandRecord(
                command_id=command_id,
                kind="deployment.create",
                deployment_id="gemma-a",
                received_at=world.core.ports.clock.now(),
            )
        )
        world.seed("gemma-a", phase=Phase.PENDING)
        world.published()
        again = await call(
            world,
            "tpu_deploy",
            {"deployment_id": "gemma-a", "model": "tiny-llama", "accelerator": "v6e-1", "command_id": command_id},
        )
        assert not again.is_error and again.structured_content["duplicate"] is True
        assert world.published() == []


class TestReads:
    async def test_list_shows_deployments_with_their_resources(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://127.0.0.1:9")
        world.seed("gemma-b", phase=Phase.SEARCHING)
        result = await call(world, "tpu_status", {})
        assert not result.is_error
        rows = {row["deployment_id"]: row for row in result.structured_content["deployments"]}
        assert set(rows) == {"gemma-a", "gemma-b"}
        assert rows["gemma-a"]["resources"][0]["state"] == "ACTIVE"
        assert rows["gemma-b"]["resources"] == []

    def test_the_core_list_filters_by_phase_and_rejects_an_unknown_phase(self, world: GatewayWorld) -> None:
        """tpu_status has no phase filter (issue #23); the core's list, which the CLI uses, keeps it."""
        world.seed("gemma-a")
        world.seed("gemma-b", phase=Phase.SEARCHING)
        only = world.core.list_deployments(phase="SEARCHING")
        assert [row.deployment_id for row in only.deployments] == ["gemma-b"]
        with pytest.raises(GatewayError) as bad:
            world.core.list_deployments(phase="RUNNING")
        assert bad.value.code == "invalid_argument" and bad.value.field == "phase"

    async def test_get_is_the_dashboard(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        result = await call(world, "tpu_status", {"deployment_id": "gemma-a"})
        assert not result.is_error
        body = result.structured_content
        assert body["phase"] == "SERVING" and body["zone"] == "europe-west4-a" and body["tier"] == "spot"
        assert [a["outcome"] for a in body["attempts"]] == ["stockout", "active"]
        assert body["hourly_usd"] == pytest.approx(0.713 * 4)
        assert body["node"]["chips"] == 4 and body["node"]["state"] == "READY"
        assert "SERVING" in text(result)

    async def test_get_of_a_missing_deployment_says_not_found(self, world: GatewayWorld) -> None:
        result = await call(world, "tpu_status", {"deployment_id": "nope"})
        assert result.is_error and "[not_found]" in text(result) and "list them with tpu_status" in text(result)

    async def test_get_rejects_a_malformed_id(self, world: GatewayWorld) -> None:
        result = await call(world, "tpu_status", {"deployment_id": "Bad_ID"})
        assert result.is_error and "deployment_id" in text(result)


class TestOperation:
    async def test_a_published_command_is_queued_until_the_controller_records_it(self, world: GatewayWorld) -> None:
        async with Client(world.server()) as session:
            created = await session.call_tool(
                "tpu_deploy", {"deployment_id": "gemma-a", "model": "tiny-llama", "accelerator": "v6e-1"}
            )
            command_id = created.structured_content["command_id"]
            queued = await session.call_tool("tpu_status", {"command_id": command_id})
            assert queued.structured_content["status"] == "published"
            assert queued.structured_content["done"] is False
            world.store.record_command(
                CommandRecord(
                    command_id=command_id,
                    kind="deployment.create",
                    deployment_id="gemma-a",
                    status="applied",
                    received_at=world.core.ports.clock.now(),
                )
            )
            world.seed("gemma-a", phase=Phase.SEARCHING)
            searching = await session.call_tool("tpu_status", {"command_id": command_id})
            assert searching.structured_content["stage"].startswith("Waiting for capacity")
            assert searching.structured_content["done"] is False
            world.seed("gemma-a", phase=Phase.SERVING, endpoint="http://10.0.0.5:8000")
            serving = await session.call_tool("tpu_status", {"command_id": command_id})
        assert serving.structured_content["done"] is True
        assert "serving at http://10.0.0.5:8000" in serving.structured_content["stage"]

    async def test_waiting_sends_progress_and_returns_within_the_bound(self, world: GatewayWorld) -> None:
        progress: list[tuple[float, float | None, str | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append((value, total, message))

        async with Client(world.server()) as session:
            created = await session.call_tool(
                "tpu_deploy", {"deployment_id": "gemma-a", "model": "tiny-llama", "accelerator": "v6e-1"}
            )
            result = await session.call_tool(
                "tpu_status",
                {"command_id": created.structured_content["command_id"], "wait_seconds": 1},
                progress_callback=on_progress,
            )
        assert not result.is_error and result.structured_content["status"] == "published"
        assert progress and progress[0][1] == 1.0 and "Queued" in (progress[0][2] or "")

    async def test_an_unknown_command_is_reported_as_unknown_and_a_malformed_one_refused(
        self, world: GatewayWorld
    ) -> None:
        unknown = await call(world, "tpu_status", {"command_id": "00000000-0000-4000-8000-000000000000"})
        assert unknown.structured_content["status"] == "unknown"
        bad = await call(world, "tpu_status", {"command_id": "not-a-uuid"})
        assert bad.is_error and "command_id" in text(bad)
        too_long = await call(
            world, "tpu_status", {"command_id": "00000000-0000-4000-8000-000000000000", "wait_seconds": 60}
        )
        assert too_long.is_error and "wait_seconds" in text(too_long)


# The confirmed calls: a tool and the arguments that pick its action.
DELETE: tuple[str, dict[str, Any]] = ("tpu_control", {"action": "delete"})
STOP: tuple[str, dict[str, Any]] = ("tpu_control", {"action": "stop"})
RESTART: tuple[str, dict[str, Any]] = ("tpu_control", {"action": "restart"})
DESTRUCTIVE = pytest.mark.parametrize("confirmed", [DELETE, STOP, RESTART], ids=["delete", "stop", "restart"])


async def refused_then_token(
    world: GatewayWorld, confirmed: tuple[str, dict[str, Any]], deployment_id: str = "gemma-a"
) -> str:
    """Make the ``confirmed`` call unconfirmed (refused, nothing published) and return the token its refusal carries."""
    tool, action = confirmed
    refused = await call(world, tool, {**action, "deployment_id": deployment_id})
    token = str(refusal_confirmation(refused)["confirm"])
    assert world.published() == []
    return token


class TestDestructive:
    @DESTRUCTIVE
    async def test_without_confirmation_nothing_is_published_and_the_refusal_carries_the_impact_and_a_token(
        self, world: GatewayWorld, confirmed: tuple[str, dict[str, Any]]
    ) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        tool, action = confirmed
        result = await call(world, tool, {**action, "deployment_id": "gemma-a"})
        body = refusal_confirmation(result)
        assert "[confirmation_required] confirm" in text(result) and "nothing was changed" in text(result)
        assert body["target"] == "gemma-a" and body["generation"] == 1 and body["impact"] in text(result)
        assert body["confirm"].startswith(f"tpuctl-confirm.{body['action']}.gemma-a.g1-")
        assert body["valid_for_s"] == 300 and "Show the impact to the user" in body["next_step"]
        assert world.published() == []

    @DESTRUCTIVE
    async def test_the_deployment_id_or_other_text_does_not_confirm(
        self, world: GatewayWorld, confirmed: tuple[str, dict[str, Any]]
    ) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        tool, action = confirmed
        for injected in ("gemma-a", "yes", "tpuctl-confirm.delete.gemma-a.g1-0.9999999999.forged", "\u202egemma-a"):
            result = await call(world, tool, {**action, "deployment_id": "gemma-a", "confirm": injected})
            assert result.is_error and text(result).startswith("[confirmation_required] confirm: "), text(result)
            assert "Fix: call again without confirm" in text(result)
        assert world.published() == []

    @pytest.mark.parametrize(
        ("confirmed", "kind"),
        [(DELETE, DeleteDeployment), (STOP, StopDeployment), (RESTART, RestartServing)],
        ids=["delete", "stop", "restart"],
    )
    async def test_the_token_from_the_refusal_publishes_the_command_once(
        self, world: GatewayWorld, confirmed: tuple[str, dict[str, Any]], kind: type
    ) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        tool, action = confirmed
        token = await refused_then_token(world, confirmed)
        result = await call(world, tool, {**action, "deployment_id": "gemma-a", "confirm": token})
        assert not result.is_error, text(result)
        (message,) = world.published()
        assert isinstance(message, kind) and message.deployment_id == "gemma-a"
        again = await call(world, tool, {**action, "deployment_id": "gemma-a", "confirm": token})
        assert again.is_error and "already used" in text(again)
        assert world.published() == []

    async def test_a_token_for_another_action_is_refused(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        stop_token = await refused_then_token(world, STOP)
        result = await call(
            world, "tpu_control", {"action": "delete", "deployment_id": "gemma-a", "confirm": stop_token}
        )
        assert result.is_error
        assert "[confirmation_required] confirm: the token confirms stopping 'gemma-a', not deleting it" in text(result)
        assert world.published() == []

    async def test_a_token_for_another_deployment_is_refused(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        world.seed("gemma-b", endpoint="http://10.0.0.6:8000")
        token_b = await refused_then_token(world, DELETE, "gemma-b")
        result = await call(world, "tpu_control", {"action": "delete", "deployment_id": "gemma-a", "confirm": token_b})
        assert result.is_error and "the token is for 'gemma-b', not 'gemma-a'" in text(result)
        assert world.published() == []

    async def test_a_token_for_a_deployment_that_changed_since_is_refused(self, world: GatewayWorld) -> None:
        record = world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        token = await refused_then_token(world, DELETE)
        world.store.put_deployment(  # a deployment.update landed meanwhile: generation 2
            record.model_copy(update={"generation": 2}), expected_version=record.version
        )
        result = await call(world, "tpu_control", {"action": "delete", "deployment_id": "gemma-a", "confirm": token})
        assert result.is_error and "'gemma-a' changed since the token was issued (now generation 2" in text(result)
        assert world.published() == []

    async def test_status_writes_of_the_controller_do_not_invalidate_a_token(self, world: GatewayWorld) -> None:
        record = world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        token = await refused_then_token(world, STOP)
        status = record.status.model_copy(update={"phase": Phase.DEGRADED, "spend_usd": 2.0})
        world.store.put_deployment(record.model_copy(update={"status": status}), expected_version=record.version)
        result = await call(world, "tpu_control", {"action": "stop", "deployment_id": "gemma-a", "confirm": token})
        assert not result.is_error, text(result)

    async def test_an_expired_or_altered_token_is_refused(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        clock = ManualClock(datetime.now(UTC))
        core = GatewayCore(replace(world.ports, clock=clock))
        async with Client(build_server(core)) as session:
            stop = {"action": "stop", "deployment_id": "gemma-a"}
            refused = await session.call_tool("tpu_control", stop)
            token = refusal_confirmation(refused)["confirm"]
            altered = token[:-1] + ("A" if token[-1] != "A" else "B")
            forged = await session.call_tool("tpu_control", {**stop, "confirm": altered})
            clock.advance(301)
            late = await session.call_tool("tpu_control", {**stop, "confirm": token})
        assert forged.is_error and "was not issued by this gateway, or was altered" in text(forged)
        assert late.is_error and "[confirmation_required] confirm: the token expired at" in text(late)
        assert world.published() == []

    async def test_a_token_from_another_gateway_process_is_refused(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        token = await refused_then_token(world, STOP)
        other = GatewayCore(world.ports)  # another process: its own random key
        with pytest.raises(GatewayError, match="was not issued by this gateway"):
            other.stop_deployment("gemma-a", confirm=token)
        assert world.published() == []

    @pytest.mark.parametrize("mode", ["auto", "legacy"])
    async def test_an_elicitation_capable_client_is_asked_and_its_yes_counts(
        self, world: GatewayWorld, mode: str
    ) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        callback = answering("accept", {"confirm": "gemma-a"})
        result = await call(
            world,
            "tpu_control",
            {"action": "delete", "deployment_id": "gemma-a"},
            elicitation_callback=callback,
            mode=mode,
        )
        assert not result.is_error, text(result)
        assert callback.asked and "force-deletes" in callback.asked[0] and "$2.85/h" in callback.asked[0]
        assert [type(m) for m in world.published()] == [DeleteDeployment]

    async def test_a_model_supplied_confirm_does_not_skip_asking_the_user(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        callback = answering("decline")
        result = await call(
            world,
            "tpu_control",
            {"action": "delete", "deployment_id": "gemma-a", "confirm": "gemma-a"},
            elicitation_callback=callback,
        )
        assert result.is_error and "declined" in text(result)
        assert callback.asked
        assert world.published() == []

    async def test_typing_the_wrong_name_in_the_form_is_refused(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        result = await call(
            world,
            "tpu_control",
            {"action": "stop", "deployment_id": "gemma-a"},
            elicitation_callback=answering("accept", {"confirm": "yes"}),
        )
        assert result.is_error and "does not match 'gemma-a'" in text(result)
        assert world.published() == []

    async def test_deleting_a_missing_deployment_is_not_found_before_anyone_is_asked(self, world: GatewayWorld) -> None:
        callback = answering("accept", {"confirm": "ghost"})
        result = await call(
            world, "tpu_control", {"action": "delete", "deployment_id": "ghost"}, elicitation_callback=callback
        )
        assert result.is_error and "[not_found]" in text(result)
        assert callback.asked == []


class TestStartAndRestart:
    async def test_start_publishes_for_a_stopped_deployment(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", phase=Phase.STOPPED, desired=Desired.STOPPED)
        result = await call(world, "tpu_control", {"action": "start", "deployment_id": "gemma-a"})
        assert not result.is_error
        assert [type(m) for m in world.published()] == [StartDeployment]

    async def test_start_refuses_a_running_deployment(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        result = await call(world, "tpu_control", {"action": "start", "deployment_id": "gemma-a"})
        assert result.is_error and "[failed_precondition]" in text(result)
        assert world.published() == []

    async def test_restart_refuses_a_deployment_without_a_node(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", phase=Phase.SEARCHING)
        result = await call(
            world, "tpu_control", {"action": "restart", "deployment_id": "gemma-a", "confirm": "gemma-a"}
        )
        assert result.is_error and "no running node" in text(result)

    async def test_restart_takes_no_reason_and_publishes_the_users_request(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        restart = {"action": "restart", "deployment_id": "gemma-a"}
        result = await call(world, "tpu_control", {**restart, "confirm": "gemma-a", "reason": "rm -rf /"})
        assert result.is_error and "[invalid_argument] reason: is not a parameter of tpu_control" in text(result)
        assert world.published() == []
        token = await refused_then_token(world, RESTART)
        assert not (await call(world, "tpu_control", {**restart, "confirm": token})).is_error
        (message,) = world.published()
        assert isinstance(message, RestartServing) and message.reason == "user_request"


class TestNodeDetails:
    async def test_the_dashboard_shows_what_the_node_agent_reported_with_its_latest_benchmark(
        self, world: GatewayWorld
    ) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        empty = await call(world, "tpu_status", {"deployment_id": "gemma-a"})
        assert empty.structured_content["node"]["system"] is None
        now = world.core.ports.clock.now()
        node = {
            "name": "gemma-a-g1-a1",
            "cpu_model": "AMD EPYC 9B14",
            "cpus": 180,
            "memory_gib": 708.4,
            "memory_used_gib": 301.5,
            "memory_free_gib": 406.9,
            "accelerator": "v6e-4",
        }
        world.store.create_benchmark_run(
            BenchmarkRun(
                run_id=new_command_id(),
                deployment_id="gemma-a",
                status="completed",
                result={"points": [], "node": node},
                created_at=now,
                updated_at=now,
            )
        )
        result = await call(world, "tpu_status", {"deployment_id": "gemma-a"})
        assert result.structured_content["node"]["system"] == node


class TestUnexpectedFailures:
    async def test_an_internal_failure_is_reported_with_a_correlation_id_and_no_internals(
        self, world: GatewayWorld, caplog: pytest.LogCaptureFixture
    ) -> None:
        class BrokenStore:
            """A store whose disk went away: every read fails with an error the caller cannot act on."""

            def list_deployments(self, *, include_deleted: bool = False) -> list[Any]:
                raise RuntimeError("disk I/O error at /srv/internal/path")

        world.ports.store = BrokenStore()  # type: ignore[assignment]
        result = await call(world, "tpu_status", {})
        assert result.is_error
        message = text(result)
        assert "[internal]" in message and "correlation id" in message
        assert "/srv/internal/path" not in message and "RuntimeError" not in message
        correlation_id = message.split("correlation id ")[1].split(")")[0]
        logged = [r for r in caplog.records if getattr(r, "correlation_id", None) == correlation_id]
        assert logged and logged[0].exc_info is not None  # the details are in the log, with the same id

    async def test_start_rejects_a_malformed_id(self, world: GatewayWorld) -> None:
        result = await call(world, "tpu_control", {"action": "start", "deployment_id": "-bad-"})
        assert result.is_error and "deployment_id" in text(result)
        assert world.published() == []
