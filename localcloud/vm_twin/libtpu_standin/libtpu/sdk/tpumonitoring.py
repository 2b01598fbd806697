"""``libtpu.sdk.tpumonitoring`` for the twin: ``tensorcore_util`` from the VM's stand-in device file.

The device file (``localcloud/vm_twin/tpu_device.py``, at ``$TPUCTL_TWIN_TPU_DEVICE_FILE``) holds each chip's
``tensorcore_util_pct``, kept from the serving vLLM's load or pinned by a test. As the SDK does, ``data()`` gives
one value per core as text; a runtime that is not up (no device file yet) raises ``RuntimeError``, and a metric
the device does not report raises ``ValueError``. Standard library only: it runs on the image's Python.
"""

from __future__ import annotations

import json
import os

__all__ = ["get_metric", "list_supported_metrics"]

_SUPPORTED = ("tensorcore_util",)


class Metric:
    def __init__(self, name: str, values: list[str]) -> None:
        self._name = name
        self._values = values

    def description(self) -> str:
        return "TensorCore utilisation per core, in percent (the twin's stand-in device file)"

    def data(self) -> list[str]:
        return list(self._values)


def list_supported_metrics() -> list[str]:
    return list(_SUPPORTED)


def get_metric(metric_name: str) -> Metric:
    if metric_name not in _SUPPORTED:
        raise ValueError(f"metric {metric_name!r} is not supported")
    path = os.environ.get("TPUCTL_TWIN_TPU_DEVICE_FILE", "")
    try:
        with open(path, encoding="utf-8") as handle:
            chips = json.load(handle).get("chips", [])
    except (OSError, ValueError, AttributeError) as exc:
        raise RuntimeError(f"the TPU runtime is not initialised ({type(exc).__name__})") from None
    values = [chip.get("tensorcore_util_pct") for chip in chips if isinstance(chip, dict)]
    if not values or not all(isinstance(value, int | float) for value in values):
        raise ValueError(f"metric {metric_name!r} is not reported by this device")
    return Metric(metric_name, [f"{value:.2f}" for value in values])
