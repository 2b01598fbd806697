"""``tpuctl debug ID``: the debug bundle a node kept of its engine (before a restart, or now with ``--capture``).

The command follows a pending capture for up to ``--timeout`` seconds, then prints the bundle as plain text: each
process with its state and, per thread, the innermost frames; the newest log lines; the vLLM gauges; tpu-info's
output; the boot stages; where the whole bundle is. ``--format json`` prints the view as the MCP tool returns it.
Everything printed from a bundle was cleaned by the core (it is untrusted text from the VM) and is written as is.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from mcp_client_gateway.cli_output import Output
from mcp_client_gateway.core import GatewayCore
from mcp_client_gateway.interface_words import cli_text
from mcp_client_gateway.models import DebugBundleView, DebugProcessView

__all__ = ["EXIT_OF_STATUS", "add_debug_command", "cmd_debug", "render_debug_bundle"]

# The exit code of each outcome, as ``cli.EXIT_*`` numbers them: done, not found, failed, timed out.
EXIT_OF_STATUS = {"ready": 0, "none": 3, "failed": 5, "pending": 6}
FRAMES_SHOWN = 6  # innermost frames printed per thread (--format json has the 15 the view keeps)
_IDLE_THREADS_SHOWN = 3  # idle threads of a process printed with their frames; the rest by name


def add_debug_command(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``tpuctl debug`` on the top-level subparsers."""
    debug = sub.add_parser("debug", parents=[common], help="the engine's debug bundle (stacks, logs, metrics)")
    debug.add_argument("deployment_id")
    debug.add_argument("--capture", action="store_true", help="ask the node for a new bundle now")
    debug.add_argument("--task-id", help="read the bundle of this restart or earlier --capture")
    debug.add_argument("--timeout", type=_seconds, default=30.0, help="with --capture: wait this long for the node")
    debug.add_argument("--poll-seconds", type=_seconds, default=1.0, help=argparse.SUPPRESS)
    debug.set_defaults(handler=cmd_debug)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 86_400:
        raise argparse.ArgumentTypeError(f"{text!r}: use 0 to 86400 seconds")
    return value


def cmd_debug(core: GatewayCore, args: argparse.Namespace, out: Output) -> int:
    """Read (or capture) a bundle; follow a pending one until ``--timeout``."""
    view = core.debug_bundle(args.deployment_id, capture=args.capture, task_id=args.task_id)
    deadline = time.monotonic() + args.timeout
    while view.status == "pending" and view.task_id and time.monotonic() < deadline:
        time.sleep(max(args.poll_seconds, 0.01))
        view = core.debug_bundle(args.deployment_id, task_id=view.task_id)
    out.data(view, render_debug_bundle)
    if view.status == "pending":
        out.note(f"no bundle yet; read it later with: tpuctl debug {args.deployment_id} --task-id {view.task_id}")
    return EXIT_OF_STATUS[view.status]


def render_debug_bundle(view: DebugBundleView, out: Output) -> None:
    """The bundle as plain text on stdout; the untrusted label and a missing bundle's reason on stderr."""
    if view.status != "ready":
        out.note(f"{view.status}: {view.detail}" + (f"; {cli_text(view.next_step)}" if view.next_step else ""))
        return
    out.note(f"debug bundle of {view.deployment_id} (task {view.task_id}); untrusted text from the TPU VM:")
    write = out.stdout.write
    captured = view.captured_at.isoformat() if view.captured_at else "unknown"
    write(f"captured: {captured}  reason: {view.reason or '-'}  node: {view.node or '-'}\n")
    if view.detail:
        write(f"note: {view.detail}\n")
    write(f"container: {view.container or '-'}\n")
    write(f"\nPROCESSES ({len(view.processes)})\n")
    for process in view.processes:
        _write_process(process, write)
    if view.stacks_note:
        write(f"stacks: {view.stacks_note}\n")
    gauges = "  ".join(f"{name}={value:g}" for name, value in view.metrics.items())
    write(f"\nMETRICS: {gauges or '-'}" + (f"  (error: {view.metrics_error})" if view.metrics_error else "") + "\n")
    write(f"\nLOG ({len(view.log_tail)} newest lines)\n")
    for line in view.log_tail:
        write(f"  {line}\n")
    write("\nTPU-INFO\n")
    for line in (view.tpu_info or f"- {view.tpu_info_error}".rstrip()).splitlines():
        write(f"  {line}\n")
    write("\nBOOT\n")
    for key, value in view.boot.items():
        write(f"  {key}: {value}\n")
    if view.boot_error:
        write(f"  error: {view.boot_error}\n")
    for note in view.trimmed:
        write(f"left out: {note}\n")
    write(f"\nwhole bundle: {view.location}\n")


def _write_process(process: DebugProcessView, write: Any) -> None:
    pid = process.pid if process.pid is not None else "?"
    write(f"  pid {pid}  {process.state or 'state unknown'}  {process.command}\n")
    if process.stacks_error:
        write(f"    no stacks: {process.stacks_error}\n")
    idle = 0
    for thread in process.threads:
        if not thread.active:
            idle += 1
            if idle > _IDLE_THREADS_SHOWN:
                continue
        write(f"    thread {thread.name}{' (active)' if thread.active else ''}\n")
        for frame in thread.frames[:FRAMES_SHOWN]:
            write(f"      {frame}\n")
        if len(thread.frames) > FRAMES_SHOWN:
            write(f"      ... {len(thread.frames) - FRAMES_SHOWN} outer frame(s)\n")
    if idle > _IDLE_THREADS_SHOWN:
        write(f"    ... {idle - _IDLE_THREADS_SHOWN} more idle thread(s) (--format json lists them)\n")
