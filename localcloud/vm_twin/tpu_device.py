"""The VM twin's TPU: a stand-in device file and libtpu's runtime metrics service answering from it.

Why: on a TPU VM libtpu, inside the serving vLLM process, serves HBM use, duty cycle and HBM bandwidth per chip on
``TPU_RUNTIME_METRICS_PORTS`` (the service ``tpu-info`` and the node agent read). The twin has no TPU, so when its
vLLM container starts (``image_vllm.py``) this module runs beside it, in the container's network namespace and
process group, so it lives and dies with it:

* the **device file** (``<node dir>/tpu-devices.json``, :data:`DEVICE_FILE`)::

      {"pinned": false, "chips": [{"chip": 0, "hbm_total_bytes": 34359738368, "hbm_used_bytes": 12884901888,
                                   "duty_cycle_pct": 50.0, "hbm_bandwidth_pct": 30.0,
                                   "tensorcore_util_pct": 4.0}, ...]}

  is re-read on every request, so what it says is what the agent reads; ``tensorcore_util_pct`` is read by the
  twin's stand-in libtpu SDK (``libtpu_standin/``), as the agent reads it on a TPU VM;
* the **updater** keeps it current from the serving vLLM's own ``/metrics`` (:func:`chips_from_load`): HBM used is
  a weights share plus ``vllm:kv_cache_usage_perc`` of the KV share, the duty cycle the share of recent polls with
  ``vllm:num_requests_running`` above 0, the TensorCore utilisation the mean batch fill (running requests over
  ``--max-num-seqs``); the chip count and HBM per chip come from ``TPU_ACCELERATOR_TYPE`` (the
  startup script hands the VM's accelerator type to the container), else from ``--tensor-parallel-size``;
* a test injects a value (a full HBM, an idle chip) by writing the file with :func:`write_devices`: a file with
  ``"pinned": true`` is never overwritten by the updater.

Run as ``python -m localcloud.vm_twin.tpu_device --device-file F --port P -- <the vllm serve argv>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

from shared.adapters.vllm_probe import parse_metrics

__all__ = [
    "DEVICE_FILE",
    "ServingLoad",
    "StandInRuntimeMetrics",
    "chip_layout",
    "chips_from_load",
    "main",
    "read_devices",
    "serve",
    "write_devices",
]

log = logging.getLogger("tpuctl.localcloud.vm.tpu")

DEVICE_FILE = "tpu-devices.json"
GIB = 1 << 30
# HBM per chip by generation (one device per chip on each: v5p and v4 run as one megacore device).
_HBM_GIB = {"v6e": 32, "v5litepod": 16, "v5e": 16, "v5p": 95, "v4": 32}
_CORES_PER_CHIP = {"v5p": 2, "v4": 2}  # their type's number counts TensorCores, not chips
_MAX_CHIPS_PER_HOST = 8
_WEIGHTS_SHARE = 0.3  # of HBM: the (pretend) weights, resident from the start
_DEFAULT_MAX_SEQS = 256  # vLLM's --max-num-seqs when the argv has none
_FIELDS = {
    "tpu.runtime.hbm.memory.total.bytes": ("hbm_total_bytes", "as_int"),
    "tpu.runtime.hbm.memory.usage.bytes": ("hbm_used_bytes", "as_int"),
    "tpu.runtime.tensorcore.dutycycle.percent": ("duty_cycle_pct", "as_double"),
    "tpu.runtime.hbm.utilization.percent": ("hbm_bandwidth_pct", "as_double"),
}  # TensorCore utilisation (``tensorcore_util_pct``) is read through the libtpu SDK stand-in, not this service


def chip_layout(accelerator_type: str, tensor_parallel: int | None) -> tuple[int, int]:
    """(chips on this host, HBM bytes per chip) for ``v6e-4`` and the like; v6e's 32 GiB when it is unknown."""
    match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", accelerator_type.strip())
    if match is None:
        return max(1, tensor_parallel or 1), _HBM_GIB["v6e"] * GIB
    generation, count = match.group(1), int(match.group(2))
    chips = max(1, min(_MAX_CHIPS_PER_HOST, count // _CORES_PER_CHIP.get(generation, 1)))
    return chips, _HBM_GIB.get(generation, _HBM_GIB["v6e"]) * GIB


def write_devices(path: Path, chips: Sequence[Mapping[str, Any]], *, pinned: bool = True) -> None:
    """Write the device file whole (a reader never sees half of it); ``pinned`` keeps the updater off it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"pinned": pinned, "chips": [dict(chip) for chip in chips]}), encoding="utf-8")
    temporary.replace(path)


def read_devices(path: Path) -> list[dict[str, Any]]:
    """The chips of the device file; ValueError when it is not one (FileNotFoundError when there is none)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    chips = data.get("chips") if isinstance(data, dict) else None
    if not isinstance(chips, list) or not all(isinstance(chip, dict) for chip in chips):
        raise ValueError(f"{path.name}: no list of chips")
    for chip in chips:
        for name in ("chip", "hbm_total_bytes", "hbm_used_bytes"):
            if isinstance(chip.get(name), bool) or not isinstance(chip.get(name), int):
                raise ValueError(f"{path.name}: chip {chip.get('chip')!r}: {name} is not an integer")
    return chips


def _pinned(path: Path) -> bool:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("pinned") is True


class StandInRuntimeMetrics(pb_grpc.RuntimeMetricServiceServicer):
    """``GetRuntimeMetric`` from the device file, read anew for every request."""

    def __init__(self, device_file: Path) -> None:
        self.device_file = device_file

    def GetRuntimeMetric(self, request: Any, context: grpc.ServicerContext) -> Any:
        field = _FIELDS.get(request.metric_name)
        try:
            chips = read_devices(self.device_file)
        except FileNotFoundError:
            return context.abort(grpc.StatusCode.UNAVAILABLE, "the TPU runtime is not initialised yet")
        except ValueError as exc:
            return context.abort(grpc.StatusCode.INTERNAL, f"device file unreadable: {exc}")
        reported = [chip for chip in chips if field is not None and chip.get(field[0]) is not None]
        if field is None or not reported:  # as libtpu answers a metric it does not serve
            return context.abort(grpc.StatusCode.NOT_FOUND, f"metric {request.metric_name!r} is not supported")
        name, kind = field
        metrics = []
        for chip in reported:
            value = int(chip[name]) if kind == "as_int" else float(chip[name])
            metrics.append(
                pb.Metric(
                    attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=int(chip["chip"]))),
                    gauge=pb.Gauge(**{kind: value}),
                )
            )
        return pb.MetricResponse(metric=pb.TPUMetric(name=request.metric_name, metrics=metrics))


def serve(device_file: Path, port: int, host: str = "127.0.0.1") -> tuple[grpc.Server, int]:
    """The stand-in service on ``host:port`` (0: any free port), started; returns it and its port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_RuntimeMetricServiceServicer_to_server(StandInRuntimeMetrics(device_file), server)
    bound = server.add_secure_port(f"{host}:{port}", grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP))
    if not bound:
        raise OSError(f"cannot listen on {host}:{port}")
    server.start()
    return server, bound


class ServingLoad:
    """What the updater remembers of the serving engine: how many requests ran at each of the recent polls."""

    def __init__(self, polls: int = 5) -> None:
        self.running: deque[float] = deque(maxlen=polls)

    def observe(self, metrics_text: str) -> float:
        """Note one ``/metrics`` page (read by the monitor's own parser); returns its KV cache use (0..1)."""
        try:
            gauges = parse_metrics(metrics_text).gauges
        except ValueError:  # a page cut short: nothing known about this poll
            gauges = {}
        self.running.append(max(0.0, gauges.get("running", 0.0)))
        return min(1.0, max(0.0, gauges.get("kv_cache_usage", 0.0)))

    def idle(self) -> None:
        """A poll that found no engine (still loading): the weights are resident, nothing runs."""
        self.running.append(0.0)

    @property
    def duty_cycle_pct(self) -> float:
        """The share of polls with a request running."""
        return 100.0 * sum(count > 0 for count in self.running) / len(self.running) if self.running else 0.0

    def tensorcore_util_pct(self, max_seqs: int) -> float:
        """How full the batch was on average: a decode step of a few sequences uses a sliver of the matrix units."""
        if not self.running:
            return 0.0
        return 100.0 * sum(min(1.0, count / max(1, max_seqs)) for count in self.running) / len(self.running)


def chips_from_load(
    chips: int,
    hbm_per_chip: int,
    kv_usage: float,
    duty_cycle_pct: float,
    memory_utilization: float,
    tensorcore_util_pct: float = 0.0,
) -> list[dict[str, Any]]:
    """Every chip alike: the weights' share of HBM plus the used part of the KV cache's share."""
    kv_share = max(0.0, memory_utilization - _WEIGHTS_SHARE)
    used = int(hbm_per_chip * (_WEIGHTS_SHARE + kv_usage * kv_share))
    return [
        {
            "chip": chip,
            "hbm_total_bytes": hbm_per_chip,
            "hbm_used_bytes": min(used, hbm_per_chip),
            "duty_cycle_pct": round(duty_cycle_pct, 2),
            "hbm_bandwidth_pct": round(duty_cycle_pct * 0.6, 2),
            "tensorcore_util_pct": round(min(tensorcore_util_pct, duty_cycle_pct), 2),
        }
        for chip in range(chips)
    ]


def _flag(argv: Sequence[str], name: str) -> str | None:
    for index, word in enumerate(argv):
        if word == name and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith(name + "="):
            return word.partition("=")[2]
    return None


def _metrics_client(argv: Sequence[str]) -> tuple[httpx.Client, str]:
    """vLLM's ``/metrics`` as the serving argv puts it: on its unix socket (``--uds``), else its port."""
    uds = _flag(argv, "--uds")
    if uds:
        return httpx.Client(transport=httpx.HTTPTransport(uds=uds), timeout=5.0), "http://localhost/metrics"
    return httpx.Client(timeout=5.0), f"http://127.0.0.1:{_flag(argv, '--port') or '8000'}/metrics"


def _update_forever(
    device_file: Path, argv: Sequence[str], accelerator_type: str, interval_s: float, parent: int
) -> None:
    """Keep the device file current from vLLM's load until the serving process (``parent``) is gone."""
    chips, hbm = chip_layout(accelerator_type, int(_flag(argv, "--tensor-parallel-size") or 0) or None)
    utilization = float(_flag(argv, "--gpu-memory-utilization") or 0.9)
    max_seqs = int(_flag(argv, "--max-num-seqs") or _DEFAULT_MAX_SEQS)
    load, (client, url), pause = ServingLoad(), _metrics_client(argv), threading.Event()
    kv_usage = 0.0
    while os.getppid() == parent:
        try:
            kv_usage = load.observe(client.get(url).text)
        except httpx.HTTPError:
            load.idle()
        if not _pinned(device_file):
            util = load.tensorcore_util_pct(max_seqs)
            reading = chips_from_load(chips, hbm, kv_usage, load.duty_cycle_pct, utilization, util)
            write_devices(device_file, reading, pinned=False)
        pause.wait(interval_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpu_device", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--device-file", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--accelerator-type", default="")
    parser.add_argument("--interval-s", type=float, default=2.0)
    parser.add_argument("--parent-pid", type=int, default=0, help="stop when this process is gone (default: ours)")
    parser.add_argument("serving_argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    serving_argv = args.serving_argv[1:] if args.serving_argv[:1] == ["--"] else args.serving_argv
    logging.basicConfig(level=logging.WARNING, format="tpu-device stand-in: %(message)s", stream=sys.stderr)
    try:
        server, _ = serve(args.device_file, args.port)
    except (OSError, RuntimeError) as exc:
        log.error("the TPU runtime metrics stand-in did not start: %s", exc)
        return 1
    try:
        parent = args.parent_pid or os.getppid()
        _update_forever(args.device_file, serving_argv, args.accelerator_type, args.interval_s, parent)
    finally:
        server.stop(grace=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
