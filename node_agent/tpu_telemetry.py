"""Sample the TPU's own telemetry (HBM per chip, duty cycle, HBM bandwidth, TensorCore utilisation) on the VM.

Why: vLLM on TPU exports none of these, so a full HBM or an idle chip under load is invisible in ``/metrics``.
libtpu serves them inside the serving process (its runtime metrics gRPC service, ``TPU_RUNTIME_METRICS_PORTS``),
the one ``tpu-info`` reads; :class:`RuntimeMetricsReader` reads it with tpu-info's own generated stubs and never
raises (no service while vLLM loads, a timeout or a malformed answer is a reading with an ``error``). TensorCore
utilisation comes from the libtpu SDK instead (``node_agent.tensorcore_util``) and is added to each chip.
:class:`TelemetrySampler` reads every ``interval_s``, writes the newest reading to the guest attribute
``tpuctl/telemetry`` (``shared.domain.tpu_telemetry.encode``), where the monitor reads it, and keeps recent
readings so a benchmark result can carry a summary of those taken during its run (:func:`tpu_result`). Readings
are stamped with the controller's clock (the agent's ``runtime.clock``), so the monitor can tell a stale one.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

import grpc
import httpx
from tpu_info.proto import tpu_metric_service_pb2, tpu_metric_service_pb2_grpc

from node_agent.bundle_keeper import metadata_base_url
from node_agent.tensorcore_util import TensorCoreUtilReader, with_utilisation
from shared.domain.startup_script import GUEST_ATTRIBUTE_NAMESPACE
from shared.domain.tpu_telemetry import TELEMETRY_KEY, ChipReading, TpuTelemetry, encode, summarize
from shared.ports import Clock

__all__ = [
    "HBM_BANDWIDTH",
    "HBM_TOTAL",
    "HBM_USED",
    "TENSORCORE_DUTY_CYCLE",
    "GuestAttributeWriter",
    "RuntimeMetricsReader",
    "SamplerSettings",
    "TelemetrySampler",
    "start_sampler",
    "tpu_result",
]

log = logging.getLogger("tpuctl.node_agent.telemetry")

# libtpu's metric names, as tpu_info.metrics.MetricName spells them.
HBM_TOTAL = "tpu.runtime.hbm.memory.total.bytes"
HBM_USED = "tpu.runtime.hbm.memory.usage.bytes"
TENSORCORE_DUTY_CYCLE = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_BANDWIDTH = "tpu.runtime.hbm.utilization.percent"
_KEEP_S = 6 * 3600.0  # readings kept for a benchmark's summary: longer than any run
_LOG_EVERY_S = 300.0  # the same failure is said again at most this often


class RuntimeMetricsReader:
    """libtpu's ``RuntimeMetricService`` at ``addr`` (``host:port``, or ``unix:/path``): one reading per call."""

    def __init__(self, addr: str, clock: Clock, *, timeout_s: float = 2.0) -> None:
        self.addr = addr
        self.clock = clock
        self.timeout_s = timeout_s
        kind = grpc.LocalConnectionType.UDS if addr.startswith("unix:") else grpc.LocalConnectionType.LOCAL_TCP
        self._channel = grpc.secure_channel(addr, grpc.local_channel_credentials(kind))
        self._stub = tpu_metric_service_pb2_grpc.RuntimeMetricServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def read(self) -> TpuTelemetry:
        """Every chip now; never raises: a failure is a reading with no chips and a short ``error``."""
        now = self.clock.now()
        try:
            total, used = self._gauges(HBM_TOTAL, "as_int"), self._gauges(HBM_USED, "as_int")
            duty = self._gauges(TENSORCORE_DUTY_CYCLE, "as_double")
            try:
                bandwidth = self._gauges(HBM_BANDWIDTH, "as_double")
            except grpc.RpcError as exc:  # optional: older libtpu builds do not serve it
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                bandwidth = {}
            return TpuTelemetry(sampled_at=now, chips=chip_readings(total, used, duty, bandwidth))
        except grpc.RpcError as exc:
            return TpuTelemetry(sampled_at=now, error=self._reason(exc))
        except (ValueError, TypeError, AttributeError) as exc:
            return TpuTelemetry(sampled_at=now, error=f"malformed answer from the TPU runtime: {exc}"[:300])

    def _gauges(self, metric: str, kind: str) -> dict[int, Any]:
        """``{device id: gauge value}`` of one metric."""
        request = tpu_metric_service_pb2.MetricRequest(metric_name=metric)
        answer = self._stub.GetRuntimeMetric(request, timeout=self.timeout_s)
        return {int(m.attribute.value.int_attr): getattr(m.gauge, kind) for m in answer.metric.metrics}

    def _reason(self, exc: grpc.RpcError) -> str:
        code = exc.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            return f"no TPU runtime metrics service at {self.addr} (vLLM not up yet, or not on a TPU)"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"the TPU runtime metrics service at {self.addr} did not answer within {self.timeout_s:g} s"
        name = code.name if code is not None else "UNKNOWN"
        return f"the TPU runtime metrics service failed ({name}): {exc.details() or ''}"[:300]


def chip_readings(
    total: dict[int, int], used: dict[int, int], duty: dict[int, float], bandwidth: dict[int, float]
) -> tuple[ChipReading, ...]:
    """One reading per device; duty cycle is per chip, so where a chip has several devices each gets its chip's."""
    if not total:
        raise ValueError("it reported no devices")
    if set(used) != set(total):
        raise ValueError(f"HBM usage for devices {sorted(used)}, totals for {sorted(total)}")
    devices = sorted(total)
    per_chip = max(1, len(devices) // len(duty)) if duty else 1
    chip_duty = [duty[key] for key in sorted(duty)]
    chips = []
    for index, device in enumerate(devices):
        if not 0 <= used[device] <= total[device]:
            raise ValueError(f"device {device}: {used[device]} bytes used of {total[device]}")
        share = duty.get(device) if len(duty) == len(devices) else _at(chip_duty, index // per_chip)
        chips.append(ChipReading(device, used[device], total[device], _percent(share), _percent(bandwidth.get(device))))
    return tuple(chips)


def _at(values: Sequence[float], index: int) -> float | None:
    return values[index] if index < len(values) else None


def _percent(value: float | None) -> float | None:
    """A finite percentage clamped to 0..100 (libtpu rounds past the edges at times); None for none."""
    if value is None or not math.isfinite(value):
        return None
    return min(100.0, max(0.0, float(value)))


class GuestAttributeWriter:
    """``PUT`` one value to this VM's guest attribute ``tpuctl/<key>`` on its metadata server."""

    def __init__(self, key: str = TELEMETRY_KEY, *, base_url: str | None = None, timeout_s: float = 5.0) -> None:
        base = base_url or metadata_base_url()
        self.url = f"{base}/instance/guest-attributes/{GUEST_ATTRIBUTE_NAMESPACE}/{key}"
        self.timeout_s = timeout_s

    def __call__(self, value: str) -> None:
        answer = httpx.put(self.url, content=value, headers={"Metadata-Flavor": "Google"}, timeout=self.timeout_s)
        answer.raise_for_status()


class _Quiet:
    """Says a failure when it changes, and the same one again at most every ``_LOG_EVERY_S``."""

    def __init__(self) -> None:
        self._said: dict[str, float] = {}

    def warn(self, what: str, reason: str) -> None:
        now = time.monotonic()
        last = self._said.get(what + reason)
        if last is None or now - last >= _LOG_EVERY_S:
            if len(self._said) > 100:  # reasons that keep changing must not grow it without end
                self._said.clear()
            self._said[what + reason] = now
            log.warning("TPU telemetry: %s: %s", what, reason)


class TelemetrySampler:
    """Reads every ``interval_s``, publishes each reading and keeps the recent ones; never dies of an error."""

    def __init__(
        self, read: Callable[[], TpuTelemetry], publish: Callable[[str], None], *, interval_s: float = 30.0
    ) -> None:
        self._read = read
        self._publish = publish
        self.interval_s = interval_s
        self._readings: deque[TpuTelemetry] = deque(maxlen=min(10_000, max(10, int(_KEEP_S / interval_s))))
        self._lock = threading.Lock()
        self._quiet = _Quiet()

    def sample_once(self) -> TpuTelemetry:
        reading = self._read()
        with self._lock:
            self._readings.append(reading)
        if reading.error:
            self._quiet.warn("no reading", reading.error)
        try:
            self._publish(encode(reading))
        except Exception as exc:  # the metadata server is down: the next round tries again
            self._quiet.warn("guest attribute not written", f"{type(exc).__name__}: {exc}"[:300])
        return reading

    def run(self, stop: threading.Event) -> None:
        """Until ``stop``: one sample now, then one every ``interval_s``."""
        while not stop.is_set():
            try:
                self.sample_once()
            except Exception:  # a bug in one round must not end the sampling
                log.exception("TPU telemetry round failed")
            stop.wait(self.interval_s)

    def readings_between(self, start: datetime, end: datetime) -> list[TpuTelemetry]:
        with self._lock:
            return [r for r in self._readings if start <= r.sampled_at <= end]


class SamplerSettings(Protocol):
    """What :func:`start_sampler` reads of the agent's settings (``NodeAgentSettings``)."""

    @property
    def node_tpu_metrics_addr(self) -> str: ...

    @property
    def node_telemetry_interval_s(self) -> float: ...


def start_sampler(settings: SamplerSettings, clock: Clock, stop: threading.Event) -> TelemetrySampler:
    """The agent's sampler on a daemon thread of its own, until ``stop``."""
    reader = RuntimeMetricsReader(settings.node_tpu_metrics_addr, clock)
    read = with_utilisation(reader.read, TensorCoreUtilReader().read)
    sampler = TelemetrySampler(read, GuestAttributeWriter(), interval_s=settings.node_telemetry_interval_s)
    threading.Thread(target=sampler.run, args=(stop,), name="tpu-telemetry", daemon=True).start()
    return sampler


def tpu_result(sampler: TelemetrySampler | None, start: datetime, clock: Clock) -> dict[str, Any]:
    """``{"tpu": summary}`` of the readings since ``start`` (one taken now, so a short run has one), or ``{}``."""
    if sampler is None:
        return {}
    sampler.sample_once()
    summary = summarize(sampler.readings_between(start, clock.now()))
    return {"tpu": summary} if summary else {}
