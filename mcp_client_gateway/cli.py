"""``tpuctl``: the human CLI on the same core as the MCP gateway.

Data goes to stdout (rich tables, or JSON with ``--format json``); progress, prompts and errors go to
stderr. ``--quiet`` turns off progress and prompts (a command that needs confirmation then fails unless
``--yes`` is given) and prints only ids for commands. Destructive commands (delete, stop, restart, an update
that replaces a running slice, replacing the Hugging Face token) show their impact and ask for the target's
name on a terminal; ``--yes`` (or ``--confirm NAME``) confirms without a prompt. Either way the CLI obtains the
core's confirmation token and uses it in the same invocation. Every argument is checked by the core
(``bounds``), so a value out of range ends in one line naming the field and the fix, with exit 2. Exit codes,
for scripts:

====  ===========================================================================
0     done
1     unexpected error (details in the log on stderr)
2     bad usage or invalid argument
3     not found
4     refused: needs confirmation, already exists, wrong state, permission denied
5     the operation ended in failure (deployment FAILED, benchmark failed)
6     ``--wait`` timed out (the work goes on; check with ``tpuctl status``)
7     unavailable: the bus, the endpoint or the log service did not answer
130   interrupted (Ctrl-C detaches; nothing is cancelled)
====  ===========================================================================
"""

from __future__ import annotations

import argparse
import getpass
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError
from rich.text import Text

from mcp_client_gateway.capabilities.deployments import CLEARABLE, UPDATABLE, describe_changes
from mcp_client_gateway.cli_bench import add_tune_command, add_workload_arguments, run_of, workload_settings
from mcp_client_gateway.cli_bench_report import add_bench_report_command
from mcp_client_gateway.cli_debug import add_debug_command
from mcp_client_gateway.cli_deploy import PREWARM_HELP, add_deploy_arguments
from mcp_client_gateway.cli_output import (
    Output,
    render_accepted,
    render_benchmark,
    render_comparison,
    render_detail,
    render_health,
    render_list,
    render_logs,
    render_operation,
    render_plan,
    render_query,
    render_secret,
    render_serving_logs,
    render_zones,
    write_benchmark_plots,
)
from mcp_client_gateway.cli_ui import add_ui_command
from mcp_client_gateway.confirmation import ConfirmationRequest
from mcp_client_gateway.core import GatewayCore, GatewayError, GatewayPorts
from mcp_client_gateway.interface_words import cli_text
from mcp_client_gateway.models import CommandAccepted, ErrorCode, MetricsView, UpdateAccepted
from shared.domain.models import ACCELERATOR_TYPES, MODEL_PRESET_NAMES, Tier
from shared.tracing import configure_tracing, traced

__all__ = ["EXIT_CODES", "main", "run"]

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
EXIT_FAILED = 5
EXIT_TIMEOUT = 6
EXIT_UNAVAILABLE = 7
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[ErrorCode, int] = {
    "invalid_argument": EXIT_USAGE,
    "not_found": EXIT_NOT_FOUND,
    "already_exists": EXIT_REFUSED,
    "failed_precondition": EXIT_REFUSED,
    "confirmation_required": EXIT_REFUSED,
    "permission_denied": EXIT_REFUSED,
    "unavailable": EXIT_UNAVAILABLE,
    "internal": EXIT_ERROR,
}

MODELS = MODEL_PRESET_NAMES
ACCELERATORS = ACCELERATOR_TYPES
TIERS = tuple(tier.value for tier in Tier)
SEVERITIES = ("DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL")


class _Usage(Exception):
    """A usage problem found after parsing (exit 2)."""


# ---------------------------------------------------------------------------------------------- commands


def _wording(stage: str) -> str:
    """A stage without its numbers: "waited 3 min" and "waited 4 min" are one stage to a person watching."""
    return re.sub(r"\d+(?:[.:]\d+)*", "#", stage)


def _wait(core: GatewayCore, command_id: str, out: Output, timeout_s: float, poll_s: float) -> int:
    """Follow a command until it is done; live view on a TTY, stage changes otherwise. Ctrl-C detaches."""
    deadline = time.monotonic() + timeout_s
    last_stage = ""
    started = time.monotonic()
    live = out.interactive and out.format != "json"
    status_ctx = out.err.status("waiting", spinner="dots") if live else None
    try:
        if status_ctx is not None:
            status_ctx.__enter__()
        while True:
            view = core.get_operation(command_id)
            elapsed = int(time.monotonic() - started)
            if status_ctx is not None:
                status_ctx.update(Text(f"{view.stage}  [{elapsed}s]"))
            elif _wording(view.stage) != last_stage and not out.quiet:
                out.err.print(Text(f"[{elapsed:>5}s] {view.stage}"))  # a new stage, not a new count of minutes
            last_stage = _wording(view.stage)
            if view.done:
                break
            if time.monotonic() >= deadline:
                out.note(
                    f"still running after {timeout_s:g}s; follow it with: tpuctl status {view.deployment_id or ''}"
                )
                return EXIT_TIMEOUT
            time.sleep(poll_s)
    except KeyboardInterrupt:
        out.note("detached; the work goes on in the controller")
        return EXIT_INTERRUPTED
    finally:
        if status_ctx is not None:
            status_ctx.__exit__(None, None, None)
    out.data(view, render_operation)
    failed = view.status in ("rejected", "failed") or view.phase == "FAILED" or view.benchmark_status == "failed"
    failed = failed or view.superseded
    failed = failed or (view.node_task is not None and view.node_task.status == "failed")
    return EXIT_FAILED if failed else EXIT_OK


def _confirmed(request: ConfirmationRequest, args: argparse.Namespace, out: Output) -> str:
    """The core's confirmation token, once the person at the terminal agreed: ``--yes``, ``--confirm NAME``
    (the target's name, as they would type it), or the name typed at the prompt under the impact."""
    target = request.target
    if getattr(args, "yes", False):
        return request.confirm
    if args.confirm is not None:
        if args.confirm == target:
            return request.confirm
        raise GatewayError(
            "confirmation_required",
            "--confirm",
            f"does not name '{target}'; nothing was changed",
            request.how_to_confirm(),
        )
    if not out.interactive:
        raise GatewayError(
            "confirmation_required",
            "--yes",
            f"{request.impact}; nothing was changed",
            request.how_to_confirm("run it on a terminal to be asked, or "),
        )
    out.err.print(Text(f"{request.impact}. Type '{target}' to confirm: "), end="")
    try:
        typed = input().strip()
    except EOFError:
        typed = ""
    if typed != target:
        raise GatewayError(
            "confirmation_required",
            "confirm",
            f"what was typed is not '{target}'; nothing was changed",
            f"run the command again and type '{target}', or pass --yes",
        )
    return request.confirm


def cmd_deploy(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    try:
        accepted = _create(core, args, confirm=None)
    except GatewayError as refused:  # a calendar booking: the person at the terminal confirms window and price
        if refused.confirmation is None or refused.confirmation.action != "book_calendar":
            raise
        accepted = _create(core, args, confirm=_confirmed(refused.confirmation, args, out))
    out.data(accepted, render_accepted)
    if args.wait:
        return _wait(core, accepted.command_id, out, args.timeout, args.poll_seconds)
    return EXIT_OK


def _create(core: GatewayCore, args: argparse.Namespace, *, confirm: str | None) -> CommandAccepted:
    return core.create_deployment(
        deployment_id=args.deployment_id,
        model=args.model,
        accelerator=args.accelerator,
        alternative_accelerators=args.alternative_accelerator,
        zones=args.zone or None,
        tiers=args.tier,
        hedge=args.hedge,
        ttl_hours=args.ttl_hours,
        budget_usd=args.budget_usd,
        idle_minutes=args.idle_minutes,
        max_model_len=args.max_model_len,
        kv_cache_dtype=args.kv_cache_dtype,
        dtype=args.dtype,
        command_id=args.command_id,
        book_calendar=args.book_calendar,
        confirm=confirm,
        prewarm=args.prewarm,
        preset=args.preset,
    )


def cmd_status(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    if args.deployment_id:
        out.data(core.get_deployment(args.deployment_id), render_detail)
    else:
        out.data(core.list_deployments(include_deleted=args.all, limit=100), render_list)
    return EXIT_OK


def cmd_delete(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    token = _confirmed(core.request_confirmation("delete", args.deployment_id), args, out)
    accepted = core.delete_deployment(args.deployment_id, confirm=token)
    out.data(accepted, render_accepted)
    if args.wait:
        return _wait(core, accepted.command_id, out, args.timeout, args.poll_seconds)
    return EXIT_OK


def cmd_stop(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    token = _confirmed(core.request_confirmation("stop", args.deployment_id), args, out)
    accepted = core.stop_deployment(args.deployment_id, confirm=token)
    out.data(accepted, render_accepted)
    return _wait(core, accepted.command_id, out, args.timeout, args.poll_seconds) if args.wait else EXIT_OK


def cmd_restart(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    token = _confirmed(core.request_confirmation("restart", args.deployment_id), args, out)
    accepted = core.restart_serving(args.deployment_id, confirm=token)
    out.data(accepted, render_accepted)
    return _wait(core, accepted.command_id, out, args.timeout, args.poll_seconds) if args.wait else EXIT_OK


def cmd_update(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    changes = {field: getattr(args, field, None) for field in UPDATABLE} | {"zones": args.zone, "tiers": args.tier}
    request = core.update_confirmation(args.deployment_id, changes, clear=args.clear or ())  # None: not needed
    token = _confirmed(request, args, out) if request is not None else None
    accepted = core.update_deployment(
        args.deployment_id, changes, clear=args.clear or (), confirm=token, command_id=args.command_id
    )
    out.data(accepted, _render_update)
    return _wait(core, accepted.command_id, out, args.timeout, args.poll_seconds) if args.wait else EXIT_OK


def _render_update(accepted: UpdateAccepted, out: Output) -> None:
    render_accepted(accepted, out)
    if not out.quiet and accepted.changes:
        out.out.print(Text(f"changes: {describe_changes(accepted.changes)}"))
        out.note(cli_text(accepted.next_step))


def cmd_start(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    accepted = core.start_deployment(args.deployment_id)
    out.data(accepted, render_accepted)
    return _wait(core, accepted.command_id, out, args.timeout, args.poll_seconds) if args.wait else EXIT_OK


def cmd_plan(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    plan = core.plan(
        model=args.model,
        accelerator=args.accelerator,
        alternative_accelerators=args.alternative_accelerator,
        zones=args.zone or None,
        tiers=args.tier,
        max_model_len=args.max_model_len,
        kv_cache_dtype=args.kv_cache_dtype,
        dtype=args.dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        ttl_hours=args.ttl_hours,
        tokens_per_second=args.tokens_per_second,
    )
    out.data(plan, render_plan)
    return EXIT_OK if plan.fits else EXIT_REFUSED


def cmd_zones(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    out.data(core.list_zones(accelerator=args.accelerator, tier=args.tier, live_quota=args.live_quota), render_zones)
    return EXIT_OK


def cmd_query(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    result = core.query_model(
        args.deployment_id,
        prompt=prompt,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        system_prompt=args.system,
    )
    out.data(result, render_query)
    return EXIT_OK


def cmd_health(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    report = core.check_health(args.deployment_id)
    out.data(report, render_health)
    return EXIT_OK if report.healthy else EXIT_FAILED


def cmd_metrics(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    out.data(core.get_metrics(args.deployment_id, window_minutes=args.window), _render_metrics)
    return EXIT_OK


def _render_metrics(view: MetricsView, out: Output) -> None:
    """Plain ``label: value`` lines in human units: readable at any terminal width."""
    out.stdout.write(f"{view.deployment_id} ({view.phase}), window {view.window_minutes} min\n")
    for line in view.summary or ["no vLLM counters recorded yet"]:
        out.stdout.write(line + "\n")
    for note in view.notes:
        out.note(f"note: {note}")


def cmd_logs(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    if args.tail is not None or args.task_id is not None:
        return _tail_logs(core, args, out)
    view = core.get_logs(
        deployment_id=args.deployment_id,
        source=args.source,
        min_severity=args.severity,
        minutes=args.minutes,
        limit=args.limit,
        max_chars=64 * 1024,
        include_probes=args.probes,
    )
    out.data(view, render_logs)
    return EXIT_OK


def _tail_logs(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    """Ask the node for the newest vLLM log lines and follow the answer for up to --timeout seconds."""
    if not args.deployment_id:
        raise _Usage("deployment_id: --tail and --task-id read one deployment's node; name the deployment")
    lines = args.tail if args.tail is not None else 100
    view = core.tail_serving_logs(args.deployment_id, lines=lines, task_id=args.task_id)
    deadline = time.monotonic() + args.timeout
    while view.status == "pending" and time.monotonic() < deadline:
        time.sleep(args.poll_seconds)
        view = core.tail_serving_logs(args.deployment_id, task_id=view.task_id)
    out.data(view, render_serving_logs)
    if view.status == "pending":
        out.note(f"no answer yet; read it later with: tpuctl logs {args.deployment_id} --task-id {view.task_id}")
        return EXIT_TIMEOUT
    return EXIT_FAILED if view.status == "failed" else EXIT_OK


def cmd_bench_run(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    benchmark: dict[str, Any] = {
        "concurrency": args.concurrency,
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "endpoint": args.endpoint,
        **workload_settings(args),
    }
    accepted = core.run_benchmark(args.deployment_id, benchmark=benchmark, command_id=args.command_id)
    out.data(accepted, render_accepted)
    if not args.wait:
        return EXIT_OK
    code = _wait(core, accepted.command_id, out, args.timeout, args.poll_seconds)
    if code == EXIT_OK:
        out.data(core.get_benchmark(accepted.command_id), render_benchmark)
    return code


def cmd_bench_show(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    view = core.get_benchmark(run_of(core, args.run_id))
    out.data(view, render_benchmark)
    return EXIT_FAILED if view.status == "failed" else EXIT_OK


def cmd_bench_plot(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    view = core.get_benchmark(run_of(core, args.run_id))
    written = write_benchmark_plots(view, args.out)
    if not written:
        out.note(f"benchmark {view.run_id} ({view.status}) has no levels to plot yet")
        return EXIT_FAILED
    for path in written:
        out.stdout.write(f"{path}\n")
    return EXIT_OK


def cmd_bench_compare(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    out.data(
        core.compare_benchmarks(deployment_id=args.deployment, model=args.model, limit=args.limit), render_comparison
    )
    return EXIT_OK


def cmd_token_set(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    """Read the token from a pipe or a hidden prompt: never from argv, where ps and shell history see it."""
    if sys.stdin is not None and not sys.stdin.isatty():
        token = sys.stdin.readline().strip()
    elif out.quiet:
        raise _Usage("token set: pipe the token on stdin when --quiet is given")
    else:
        token = getpass.getpass("Hugging Face token (hidden): ", stream=out.stderr).strip()
    request = core.hf_token_confirmation(token)  # None unless a different token is stored
    confirm = _confirmed(request, args, out) if request is not None else None
    out.data(core.save_hf_token(token, confirm=confirm), render_secret)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- parser


def _seconds(minimum: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds from ``minimum`` to a week (--timeout, --poll-seconds)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: give a number of seconds, e.g. 30") from None
        if not math.isfinite(value) or not minimum <= value <= 604800:
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: give seconds from {minimum:g} to 604800 (a week)")
        return value

    return parse


def _csv_ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use comma-separated integers, e.g. 1,4,16") from None


def _common_options(*, top: bool) -> argparse.ArgumentParser:
    """Options accepted before or after the command; below the top level they must not reset the top's values."""
    common = argparse.ArgumentParser(add_help=False)

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    common.add_argument(
        "--format", choices=("table", "json"), default=default("table"), help="output format (default table)"
    )
    common.add_argument(
        "--quiet", "-q", action="store_true", default=default(False), help="no progress, no prompts, ids only"
    )
    common.add_argument("--backend", choices=("local", "gcp"), default=default(None), help="overrides TPUCTL_BACKEND")
    common.add_argument("--project", default=default(None), help="overrides TPUCTL_PROJECT")
    common.add_argument("--data-dir", default=default(None), help="overrides TPUCTL_DATA_DIR")
    common.add_argument(
        "--endpoint-access",
        choices=("direct", "iap"),
        default=default(None),
        help="how query and health reach vLLM: direct (inside the VPC) or iap (a gcloud IAP tunnel); "
        "overrides TPUCTL_ENDPOINT_ACCESS",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common_options(top=False)

    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--wait", action="store_true", help="follow progress until done (Ctrl-C detaches)")
    waiting.add_argument("--timeout", type=_seconds(0), default=3600.0, help="give up waiting after this many seconds")
    waiting.add_argument("--poll-seconds", type=_seconds(0.01), default=2.0, help=argparse.SUPPRESS)

    parser = argparse.ArgumentParser(
        prog="tpuctl",
        description="Serve Gemma 4 on Cloud TPU with vLLM: the human CLI of the tpuctl gateway.",
        parents=[_common_options(top=True)],
        epilog="Exit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 refused, 5 failed, 6 timeout, 7 unavailable.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_deployment_commands(sub, common, waiting)
    _add_planning_commands(sub, common)
    _add_serving_commands(sub, common)
    add_debug_command(sub, common)
    add_ui_command(sub, common)
    _add_bench_commands(sub, common, waiting)
    _add_gateway_commands(sub, common)
    return parser


_ALTERNATIVE = "a slice to step down or across to when the first is scarce (repeat, in order); must fit"


def _add_deployment_commands(sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> None:
    """deploy, status, delete, stop, restart, start."""
    deploy = sub.add_parser("deploy", parents=[common, waiting], help="create a deployment")
    add_deploy_arguments(deploy)
    deploy.set_defaults(handler=cmd_deploy)
    prewarm = sub.add_parser("prewarm", parents=[common, waiting], help=PREWARM_HELP)
    add_deploy_arguments(prewarm)
    prewarm.set_defaults(handler=cmd_deploy, prewarm=True)

    status = sub.add_parser("status", parents=[common], help="list deployments, or show one")
    status.add_argument("deployment_id", nargs="?")
    status.add_argument("--all", action="store_true", help="include deleted deployments")
    status.set_defaults(handler=cmd_status)

    for name, handler, text in (
        ("delete", cmd_delete, "delete a deployment (asks for confirmation)"),
        ("stop", cmd_stop, "release the TPU, keep the deployment (asks for confirmation)"),
        ("restart", cmd_restart, "restart the vLLM container on the node (asks for confirmation)"),
    ):
        destructive = sub.add_parser(name, parents=[common, waiting], help=text)
        destructive.add_argument("deployment_id")
        destructive.add_argument("--yes", "-y", action="store_true", help="confirm without a prompt")
        destructive.add_argument(
            "--confirm", metavar="DEPLOYMENT_ID", help="confirm without a prompt by naming the deployment again"
        )
        destructive.set_defaults(handler=handler)

    update = sub.add_parser("update", parents=[common, waiting], help="change only the given fields of a deployment")
    update.add_argument("deployment_id")
    update.add_argument("--accelerator", choices=ACCELERATORS)
    update.add_argument("--zone", action="append", help="replaces the allowed zones, best first (repeat)")
    update.add_argument("--tier", action="append", choices=TIERS, help="replaces the tiers, in priority order (repeat)")
    for option, kind in (("--hedge", int), ("--ttl-hours", float), ("--budget-usd", float), ("--idle-minutes", int)):
        update.add_argument(option, type=kind)
    update.add_argument("--max-model-len", type=int)
    update.add_argument("--kv-cache-dtype", choices=("auto", "fp8"))
    update.add_argument("--dtype", choices=("bfloat16", "fp8"), help="weight dtype")
    update.add_argument("--clear", action="append", choices=CLEARABLE, help="unset this field (repeat)")
    update.add_argument("--yes", "-y", action="store_true", help="confirm replacing a running slice without a prompt")
    update.add_argument("--confirm", metavar="DEPLOYMENT_ID", help="confirm by naming the deployment again")
    update.add_argument("--command-id", help="idempotency key (UUID) to retry safely")
    update.set_defaults(handler=cmd_update)

    start = sub.add_parser("start", parents=[common, waiting], help="start a stopped deployment")
    start.add_argument("deployment_id")
    start.set_defaults(handler=cmd_start)


def _add_planning_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """plan, zones."""
    plan = sub.add_parser("plan", parents=[common], help="will it fit, how vLLM runs, what it costs")
    plan.add_argument("--model", required=True, choices=MODELS)
    plan.add_argument("--accelerator", default="v6e-4", choices=ACCELERATORS)
    plan.add_argument("--alternative-accelerator", action="append", choices=ACCELERATORS, help=_ALTERNATIVE)
    plan.add_argument("--zone", action="append", help="zone to price (repeat); default: where it fits quota")
    plan.add_argument("--tier", action="append", choices=TIERS, help="tier to price (repeat)")
    plan.add_argument("--max-model-len", type=int)
    plan.add_argument("--kv-cache-dtype", choices=("auto", "fp8"))
    plan.add_argument("--dtype", choices=("bfloat16", "fp8"), help="weight dtype (default bfloat16)")
    plan.add_argument("--gpu-memory-utilization", type=float)
    plan.add_argument("--ttl-hours", type=float)
    plan.add_argument("--tokens-per-second", type=float, help="measured output tokens/s, to price 1M tokens")
    plan.set_defaults(handler=cmd_plan)

    zones = sub.add_parser("zones", parents=[common], help="zones, prices and capacity memory")
    zones.add_argument("--accelerator", default="v6e-4", choices=ACCELERATORS)
    zones.add_argument("--tier", choices=TIERS)
    zones.add_argument(
        "--live-quota",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read quota limits (Cloud Quotas API) and usage (TPU API nodes) now (default: yes)",
    )
    zones.set_defaults(handler=cmd_zones)


def _add_serving_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """query, health, metrics, logs."""
    query = sub.add_parser("query", parents=[common], help="ask the deployed model (with timing)")
    query.add_argument("deployment_id")
    query.add_argument("prompt", help="the question, or - to read it from stdin")
    query.add_argument("--max-tokens", type=int, default=256)
    query.add_argument("--temperature", type=float, default=0.0)
    query.add_argument("--system", help="system message")
    query.set_defaults(handler=cmd_query)

    health = sub.add_parser("health", parents=[common], help="deep health check of a deployment")
    health.add_argument("deployment_id")
    health.set_defaults(handler=cmd_health)

    metrics = sub.add_parser("metrics", parents=[common], help="request and token totals, window latency and rates")
    metrics.add_argument("deployment_id")
    metrics.add_argument("--window", type=int, default=60, metavar="MINUTES", help="window length (1-10080)")
    metrics.set_defaults(handler=cmd_metrics)

    logs = sub.add_parser("logs", parents=[common], help="recent log lines (untrusted text)")
    logs.add_argument("deployment_id", nargs="?")
    logs.add_argument("--source", choices=("any", "controller", "node"), default="any")
    logs.add_argument("--severity", choices=SEVERITIES, default="DEFAULT")
    logs.add_argument("--minutes", type=int, default=60)
    logs.add_argument("--limit", type=int, default=100)
    logs.add_argument("--probes", action="store_true", help="also the monitor's own successful probe lines")
    logs.add_argument(
        "--tail", type=int, metavar="N", help="fetch the newest N lines of the vLLM container from the node (1-500)"
    )
    logs.add_argument("--task-id", help="read the answer of an earlier --tail that had not arrived")
    logs.add_argument("--timeout", type=_seconds(0), default=30.0, help="with --tail: wait this long for the node")
    logs.add_argument("--poll-seconds", type=_seconds(0.01), default=1.0, help=argparse.SUPPRESS)
    logs.set_defaults(handler=cmd_logs)


def _add_bench_commands(sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> None:
    """bench run, bench show, bench compare; tune (a bench run with tune_trials)."""
    bench = sub.add_parser("bench", parents=[common], help="run, show and compare benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="ACTION")
    run_bench = bench_sub.add_parser("run", parents=[common, waiting], help="benchmark a serving deployment")
    run_bench.add_argument("deployment_id")
    run_bench.add_argument("--concurrency", type=_csv_ints, default=[1, 4, 16], help="e.g. 1,4,16")
    run_bench.add_argument("--num-prompts", type=int, default=64)
    run_bench.add_argument("--input-len", type=int, default=256)
    run_bench.add_argument("--output-len", type=int, default=64)
    run_bench.add_argument("--endpoint", choices=("chat", "completions"), default="completions")
    run_bench.add_argument("--command-id", help="idempotency key (UUID)")
    add_workload_arguments(run_bench)
    run_bench.set_defaults(handler=cmd_bench_run)
    show = bench_sub.add_parser("show", parents=[common], help="one run with its comparison")
    show.add_argument("run_id", help="a run id, or a deployment id for its newest run")
    show.set_defaults(handler=cmd_bench_show)
    plot = bench_sub.add_parser("plot", parents=[common], help="charts of one run: an HTML page, SVG and PNG")
    plot.add_argument("run_id", help="a run id, or a deployment id for its newest run")
    plot.add_argument("--out", type=Path, default=Path("bench-plots"), help="folder to write them into")
    plot.set_defaults(handler=cmd_bench_plot)
    add_bench_report_command(bench_sub, common)
    add_tune_command(sub, [common, waiting], cmd_bench_run)
    compare = bench_sub.add_parser("compare", parents=[common], help="runs side by side")
    compare.add_argument("--deployment")
    compare.add_argument("--model", choices=MODELS)
    compare.add_argument("--limit", type=int, default=20)
    compare.set_defaults(handler=cmd_bench_compare)


def _add_gateway_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """mcp (serve the gateway on stdio), token set."""
    serve = sub.add_parser("mcp", parents=[common], help="serve the MCP gateway on stdio (for agent CLIs)")
    serve.add_argument("--read-only", action="store_true", help="serve only the tools that change nothing")
    serve.add_argument("--toolset", choices=("read-only", "operate", "all"), help="read-only, operate (no delete), all")
    serve.set_defaults(handler=None)

    token = sub.add_parser("token", parents=[common], help="store the Hugging Face token")
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    token_set = token_sub.add_parser("set", parents=[common], help="read it from stdin or a hidden prompt")
    token_set.add_argument("--yes", "-y", action="store_true", help="replace a stored token without a prompt")
    token_set.add_argument(
        "--confirm", metavar="SECRET_NAME", help="replace a stored token without a prompt by naming its secret"
    )
    token_set.set_defaults(handler=cmd_token_set)


def run(
    argv: Sequence[str] | None = None,
    *,
    ports: GatewayPorts | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Parse ``argv`` and run one command; returns the exit code. ``ports`` lets tests inject their own."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    if args.command == "mcp":
        return _serve_mcp(args)
    out = Output(args.format, args.quiet, stdout, stderr)
    owned = ports is None
    if ports is None:
        built = _build_ports(args, out)
        if built is None:
            return EXIT_USAGE
        ports = built
    core = GatewayCore(ports)
    try:
        with traced(f"tpuctl {args.command}"):  # the commands it publishes carry this trace (shared/tracing.py)
            return int(args.handler(core, args, out))
    except GatewayError as exc:
        out.err.print(Text(f"error: {_cli_error(exc, args)}"))
        return EXIT_CODES.get(exc.code, EXIT_ERROR)
    except _Usage as exc:
        out.err.print(Text(f"error: {exc}"))
        return EXIT_USAGE
    except KeyboardInterrupt:
        out.note("interrupted")
        return EXIT_INTERRUPTED
    except Exception:
        log.exception("tpuctl failed unexpectedly")
        out.err.print(Text("error: unexpected failure; the log above has the details"))
        return EXIT_ERROR
    finally:
        if owned:
            ports.close()


# Core fields whose flag is not simply --field-name.
_FLAG_OF = {
    "lines": "--tail",
    "window_minutes": "--window",
    "min_severity": "--severity",
    "system_prompt": "--system",
    "zones": "--zone",
    "tiers": "--tier",
    "tune_trials": "--trials",
}
_POSITIONAL = frozenset({"deployment_id", "run_id", "prompt"})


def _cli_error(exc: GatewayError, args: argparse.Namespace) -> str:
    """The core's one-line error worded for the CLI, its field named as this command's flag (``zones[0]`` is
    ``--zone``)."""
    field = re.sub(r"\[\d+\]$", "", exc.field) if exc.field else exc.field
    given = vars(args)
    if field == "deployment_id" and "deployment" in given and "deployment_id" not in given:
        flag = "--deployment"  # bench compare names it so
    elif field in _FLAG_OF and _FLAG_OF[field].removeprefix("--").replace("-", "_") in given:
        flag = _FLAG_OF[field]
    elif field is not None and field not in _POSITIONAL and field in given:
        flag = "--" + field.replace("_", "-")
    else:
        return exc.render("cli")
    assert field is not None
    fix = re.sub(rf"(?<!tpuctl )\b{re.escape(field)}\b", flag, exc.fix_words("cli"))  # not `tpuctl zones`
    return GatewayError(exc.code, flag, exc.problem, fix, retry_after_s=exc.retry_after_s).render("cli")


def _serve_mcp(args: argparse.Namespace) -> int:
    """``tpuctl mcp``: the same server as ``python -m mcp_client_gateway`` (stdout is the wire from here on)."""
    from mcp_client_gateway.__main__ import main as serve

    forwarded: list[str] = []
    for flag, value in (
        ("--backend", args.backend),
        ("--project", args.project),
        ("--data-dir", args.data_dir),
        ("--endpoint-access", args.endpoint_access),
        ("--toolset", args.toolset),
    ):
        if value:
            forwarded += [flag, str(value)]
    if args.read_only:
        forwarded.append("--read-only")
    return serve(forwarded)


def _build_ports(args: argparse.Namespace, out: Output) -> GatewayPorts | None:
    from mcp_client_gateway.composition import build_ports
    from shared.config import Settings
    from shared.logging import configure_logging

    overrides: dict[str, Any] = {}
    for key in ("backend", "project", "data_dir", "endpoint_access"):
        value = getattr(args, key, None)
        if value:
            overrides[key] = value
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(str(e.get("msg", "")) for e in exc.errors(include_url=False, include_input=False))
        out.err.print(Text(f"error: bad configuration: {problems}"))
        return None
    configure_logging("WARNING" if settings.log_level == "INFO" else settings.log_level, stream=out.stderr)
    configure_tracing(settings.trace_export, "tpuctl-cli", project=settings.project)
    return build_ports(settings)


def main() -> None:
    """Console-script entry point (``tpuctl``)."""
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
