"""``tpuctl`` on the same core: output channels, formats, confirmation, ``--wait`` and exit codes."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mcp_client_gateway.cli import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    Output,
    run,
)
from shared.domain.models import BenchmarkRun, CommandRecord, Phase
from shared.messages import CreateDeployment, DeleteDeployment, RunBenchmark, StopDeployment
from tests.mcp.conftest import HF_TOKEN, GatewayWorld
from tests.support.openai_stub import StubConfig, serve_openai_stub


class Outcome:
    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.code = code
        self.stdout = stdout
        self.stderr = stderr

    def json(self) -> Any:
        return json.loads(self.stdout)


def tpuctl(world: GatewayWorld, *argv: str) -> Outcome:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = run(list(argv), ports=world.ports, stdout=stdout, stderr=stderr)
    return Outcome(code, stdout.getvalue(), stderr.getvalue())


DEPLOY = ("deploy", "gemma-a", "--model", "gemma-4-26b-a4b", "--zone", "us-east5-b", "--tier", "spot")


def applied(world: GatewayWorld, message: Any) -> None:
    """The controller's verdict on a published command: applied, as its ledger records it."""
    world.store.record_command(
        CommandRecord(
            command_id=message.command_id,
            kind=message.kind,
            deployment_id="gemma-a",
            status="applied",
            received_at=world.core.ports.clock.now(),
        )
    )


class TestDeploy:
    def test_deploy_publishes_and_prints_the_command_id(self, world: GatewayWorld) -> None:
        outcome = tpuctl(world, *DEPLOY)
        assert outcome.code == EXIT_OK, outcome.stderr
        (message,) = world.published()
        assert isinstance(message, CreateDeployment) and [t.value for t in message.spec.tiers] == ["spot"]
        assert message.command_id in outcome.stdout

    def test_json_output_is_the_accepted_command(self, world: GatewayWorld) -> None:
        outcome = tpuctl(world, "--format", "json", *DEPLOY)
        body = outcome.json()
        assert body["kind"] == "deployment.create" and body["deployment_id"] == "gemma-a"

    def test_options_may_follow_the_command(self, world: GatewayWorld) -> None:
        outcome = tpuctl(world, *DEPLOY, "--format", "json")
        assert outcome.json()["kind"] == "deployment.create"

    def test_quiet_prints_only_the_command_id(self, world: GatewayWorld) -> None:
        outcome = tpuctl(world, "--quiet", *DEPLOY)
        (message,) = world.published()
        assert outcome.stdout == message.command_id + "\n" and outcome.stderr == ""

    def test_an_invalid_argument_exits_2_naming_the_field(self, world: GatewayWorld) -> None:
        outcome = tpuctl(world, "deploy", "gemma-a", "--model", "gemma-4-26b-a4b", "--zone", "nowhere")
        assert outcome.code == EXIT_USAGE and "zones" in outcome.stderr
        assert world.published() == []

    def test_an_unknown_choice_is_a_usage_error(self, world: GatewayWorld) -> None:
        assert tpuctl(world, "deploy", "gemma-a", "--model", "llama").code == EXIT_USAGE

    def test_wait_follows_progress_until_serving(self, world: GatewayWorld) -> None:
        def controller() -> None:
            time.sleep(0.2)
            (message,) = world.published()
            world.seed("gemma-a", phase=Phase.SEARCHING)  # as the controller: the record, then the verdict
            applied(world, message)
            time.sleep(0.2)
            world.seed("gemma-a", phase=Phase.SERVING, endpoint="http://10.0.0.5:8000")

        worker = threading.Thread(target=controller)
        worker.start()
        outcome = tpuctl(world, *DEPLOY, "--wait", "--timeout", "10", "--poll-seconds", "0.05")
        worker.join()
        assert outcome.code == EXIT_OK, outcome.stderr
        assert "Queued" in outcome.stderr and "Waiting for capacity" in outcome.stderr
        assert "serving at http://10.0.0.5:8000" in outcome.stdout

    def test_wait_exits_5_when_the_deployment_fails(self, world: GatewayWorld) -> None:
        def controller() -> None:
            time.sleep(0.1)
            (message,) = world.published()
            world.seed("gemma-a", phase=Phase.FAILED)
            applied(world, message)

        worker = threading.Thread(target=controller)
        worker.start()
        outcome = tpuctl(world, *DEPLOY, "--wait", "--timeout", "10", "--poll-seconds", "0.05")
        worker.join()
        assert outcome.code == EXIT_FAILED

    def test_wait_exits_5_when_the_deployment_is_gone_before_it_served(self, world: GatewayWorld) -> None:
        def controller() -> None:
            time.sleep(0.1)
            (message,) = world.published()  # applied, then deleted (TTL, budget, janitor) before it served
            applied(world, message)

        worker = threading.Thread(target=controller)
        worker.start()
        outcome = tpuctl(world, *DEPLOY, "--wait", "--timeout", "10", "--poll-seconds", "0.05")
        worker.join()
        assert outcome.code == EXIT_FAILED
        assert "Superseded: the deployment no longer exists" in outcome.stdout + outcome.stderr

    def test_wait_exits_6_on_timeout_and_says_how_to_follow_up(self, world: GatewayWorld) -> None:
        outcome = tpuctl(world, *DEPLOY, "--wait", "--timeout", "0.2", "--poll-seconds", "0.05")
        assert outcome.code == EXIT_TIMEOUT and "tpuctl status" in outcome.stderr


class TestStatusAndDelete:
    def test_status_lists_then_shows_one(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        listing = tpuctl(world, "status")
        assert listing.code == EXIT_OK and "gemma-a" in listing.stdout and "SERVING" in listing.stdout
        detail = tpuctl(world, "status", "gemma-a", "--format", "json")
        assert detail.json()["endpoint"] == "http://10.0.0.5:8000"

    def test_status_of_a_missing_deployment_exits_3(self, world: GatewayWorld) -> None:
        outcome = tpuctl(world, "status", "ghost")
        assert outcome.code == EXIT_NOT_FOUND and "not_found" in outcome.stderr

    def test_delete_without_confirmation_is_refused_when_nobody_can_be_asked(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        outcome = tpuctl(world, "delete", "gemma-a")
        assert outcome.code == EXIT_REFUSED and "confirm" in outcome.stderr
        assert world.published() == []

    def test_delete_with_confirm_publishes(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        outcome = tpuctl(world, "delete", "gemma-a", "--confirm", "gemma-a")
        assert outcome.code == EXIT_OK
        assert [type(m) for m in world.published()] == [DeleteDeployment]

    def test_yes_confirms_in_one_invocation(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        outcome = tpuctl(world, "--quiet", "stop", "gemma-a", "--yes")
        assert outcome.code == EXIT_OK, outcome.stderr
        (message,) = world.published()
        assert isinstance(message, StopDeployment) and message.command_id in outcome.stdout

    def test_confirm_naming_another_deployment_is_refused(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        outcome = tpuctl(world, "delete", "gemma-a", "--confirm", "gemma-b")
        assert outcome.code == EXIT_REFUSED
        assert "[confirmation_required] --confirm: does not name 'gemma-a'" in outcome.stderr
        assert world.published() == []

    def test_quiet_without_yes_is_refused_naming_the_flag(self, world: GatewayWorld) -> None:
        world.seed("gemma-a")
        outcome = tpuctl(world, "--quiet", "delete", "gemma-a")
        assert outcome.code == EXIT_REFUSED
        assert "[confirmation_required] --yes: deleting 'gemma-a'" in outcome.stderr and "pass --yes" in outcome.stderr
        assert world.published() == []

    @pytest.mark.parametrize(("typed", "code"), [("gemma-a", EXIT_OK), ("yes", EXIT_REFUSED), ("", EXIT_REFUSED)])
    def test_on_a_terminal_the_impact_is_shown_and_the_name_typed_confirms(
        self, world: GatewayWorld, monkeypatch: pytest.MonkeyPatch, typed: str, code: int
    ) -> None:
        world.seed("gemma-a")
        monkeypatch.setattr(Output, "interactive", property(lambda self: True))
        monkeypatch.setattr("builtins.input", lambda: typed)
        outcome = tpuctl(world, "delete", "gemma-a")
        assert outcome.code == code, outcome.stderr
        assert "force-deletes its 1 TPU resource(s)" in outcome.stderr and "Type 'gemma-a' to confirm" in outcome.stderr
        assert [type(m) for m in world.published()] == ([DeleteDeployment] if code == EXIT_OK else [])


class TestArgumentBounds:
    """The core checks every argument, so the CLI ends a bad value with one line and exit 2, never a traceback."""

    @pytest.mark.parametrize(
        ("argv", "flag"),
        [
            (("logs", "gemma-a", "--minutes", "1000000000000"), "--minutes"),
            (("plan", "--model", "gemma-4-e4b", "--tokens-per-second", "-1"), "--tokens-per-second"),
            (("plan", "--model", "gemma-4-e4b", "--ttl-hours", "nan"), "--ttl-hours"),
            (
                ("deploy", "gemma-a", "--model", "tiny-llama", "--accelerator", "v6e-1", "--budget-usd", "inf"),
                "--budget-usd",
            ),
            (("logs", "--limit", "-5"), "--limit"),
            (("logs", "gemma-a", "--tail", "100000"), "--tail"),
            (("query", "gemma-a", "hi", "--temperature", "9"), "--temperature"),
            (("bench", "compare", "--deployment", "../../etc/passwd"), "--deployment"),
            (("bench", "compare", "--limit", "0"), "--limit"),
            (("status", "gemma-a;rm -rf /"), "deployment_id"),
        ],
    )
    def test_a_bad_value_is_one_line_naming_the_field_and_the_fix(
        self, world: GatewayWorld, argv: tuple[str, ...], flag: str
    ) -> None:
        outcome = tpuctl(world, *argv)
        assert outcome.code == EXIT_USAGE, outcome.stderr
        (line,) = outcome.stderr.strip().splitlines()
        assert line.startswith(f"error: [invalid_argument] {flag}: ") and ". Fix: " in line
        assert "Traceback" not in outcome.stderr
        assert world.published() == []

    def test_a_bad_wait_timeout_is_a_usage_error(self, world: GatewayWorld, capsys: pytest.CaptureFixture[str]) -> None:
        outcome = tpuctl(world, *DEPLOY, "--wait", "--timeout", "nan")
        assert outcome.code == EXIT_USAGE and "argument --timeout" in capsys.readouterr().err  # argparse's own line
        assert world.published() == []


class TestPlanZonesLogsQuery:
    def test_plan_exits_0_when_it_fits_and_4_when_it_does_not(self, world: GatewayWorld) -> None:
        fits = tpuctl(world, "plan", "--model", "gemma-4-26b-a4b", "--kv-cache-dtype", "fp8")
        assert fits.code == EXIT_OK and "fits" in fits.stdout and "--tensor-parallel-size 4" in fits.stdout
        too_big = tpuctl(world, "plan", "--model", "gemma-4-31b", "--accelerator", "v6e-1", "--format", "json")
        assert too_big.code == EXIT_REFUSED and too_big.json()["smallest_fitting_slice"] == "v6e-4"

    def test_zones_as_json(self, world: GatewayWorld) -> None:
        outcome = tpuctl(world, "zones", "--tier", "spot", "--format", "json")
        zones = {z["zone"]: z for z in outcome.json()["zones"]}
        assert zones["europe-west4-a"]["usd_per_hour"] == {"spot": pytest.approx(0.713 * 4)}

    def test_log_text_that_looks_like_markup_is_printed_literally(self, world: GatewayWorld) -> None:
        (world.log_dir / "provision.jsonl").write_text(
            json.dumps({"severity": "ERROR", "message": "[bold red]boom[/bold red] \x1b[2J", "time": None}) + "\n",
            encoding="utf-8",
        )
        outcome = tpuctl(world, "logs", "--severity", "ERROR")
        assert outcome.code == EXIT_OK
        assert "[bold red]boom[/bold red]" in outcome.stdout and "\x1b" not in outcome.stdout

    def test_query_prints_the_answer_on_stdout_and_timing_on_stderr(self, world: GatewayWorld) -> None:
        with serve_openai_stub(StubConfig(reply_text=["Hello", " there"], usage_completion_tokens=2)) as stub:
            world.seed("gemma-a", endpoint=stub.base_url)
            outcome = tpuctl(world, "query", "gemma-a", "Hi?")
        assert outcome.code == EXIT_OK
        assert outcome.stdout.strip() == "Hello there"
        assert "TTFT" in outcome.stderr and "2 tokens" in outcome.stderr


class TestBenchAndToken:
    def test_bench_run_then_show(self, world: GatewayWorld) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        started = tpuctl(world, "--format", "json", "bench", "run", "gemma-a", "--concurrency", "1,8")
        run_id = started.json()["command_id"]
        (message,) = world.published()
        assert isinstance(message, RunBenchmark) and message.benchmark.concurrency == (1, 8)
        now = world.core.ports.clock.now()
        world.store.create_benchmark_run(
            BenchmarkRun(
                run_id=run_id,
                deployment_id="gemma-a",
                status="completed",
                result={"output_throughput": 512.5, "mean_ttft_ms": 80.0},
                created_at=now,
                updated_at=now,
            )
        )
        shown = tpuctl(world, "bench", "show", run_id)
        assert shown.code == EXIT_OK and "512.5" in shown.stdout
        bad = tpuctl(world, "bench", "run", "gemma-a", "--concurrency", "one")
        assert bad.code == EXIT_USAGE

    def test_bench_run_sends_a_trace_file_relative_and_refuses_a_bad_line_by_number(
        self, world: GatewayWorld, tmp_path: Path
    ) -> None:
        world.seed("gemma-a", endpoint="http://10.0.0.5:8000")
        trace = tmp_path / "trace.jsonl"
        trace.write_text(
            '{"timestamp": 1700000000.25, "input_len": 64, "output_len": 16}\n'
            '{"timestamp": 1700000001.75, "input_len": 32, "output_len": 8, "id": "x"}\n',
            encoding="utf-8",
        )
        started = tpuctl(world, "bench", "run", "gemma-a", "--trace-file", str(trace), "--slo-ttft-ms", "250")
        assert started.code == EXIT_OK, started.stderr
        (message,) = world.published()
        assert isinstance(message, RunBenchmark) and message.benchmark.workload == "trace"
        assert [(e.timestamp, e.input_len) for e in message.benchmark.trace] == [(0.0, 64), (1.5, 32)]
        assert message.benchmark.slo_ttft_ms == 250.0
        trace.write_text('{"timestamp": 0, "input_len": 64}\n', encoding="utf-8")
        bad = tpuctl(world, "bench", "run", "gemma-a", "--trace-file", str(trace))
        assert bad.code != EXIT_OK and "--trace-file" in bad.stderr and "line 1" in bad.stderr
        assert "'output_len'" in bad.stderr and world.published() == []

    def test_token_set_reads_stdin_and_never_prints_the_token(
        self, world: GatewayWorld, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr("sys.stdin", io.StringIO(HF_TOKEN + "\n"))
        outcome = tpuctl(world, "token", "set")
        assert outcome.code == EXIT_OK
        assert world.secrets.get(world.settings.hf_token_secret) == HF_TOKEN
        assert HF_TOKEN not in outcome.stdout + outcome.stderr

    def test_replacing_a_token_without_confirmation_is_refused(
        self, world: GatewayWorld, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        world.secrets.put(world.settings.hf_token_secret, HF_TOKEN)
        monkeypatch.setattr("sys.stdin", io.StringIO("hf_Another0123456789abcdefghijk\n"))
        outcome = tpuctl(world, "token", "set")
        assert outcome.code == EXIT_REFUSED and "pass --yes" in outcome.stderr
        assert world.secrets.get(world.settings.hf_token_secret) == HF_TOKEN

    @pytest.mark.parametrize("flags", [("--yes",), ("--confirm", "tpuctl-hf-token")])
    def test_replacing_a_token_with_yes_or_its_name(
        self, world: GatewayWorld, monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...]
    ) -> None:
        world.secrets.put(world.settings.hf_token_secret, HF_TOKEN)
        replacement = "hf_Another0123456789abcdefghijk"
        monkeypatch.setattr("sys.stdin", io.StringIO(replacement + "\n"))
        outcome = tpuctl(world, "token", "set", *flags)
        assert outcome.code == EXIT_OK, outcome.stderr
        assert world.secrets.get(world.settings.hf_token_secret) == replacement
        assert replacement not in outcome.stdout + outcome.stderr
