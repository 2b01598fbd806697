"""``libtpu.sdk`` as far as the twin needs it: the monitoring module."""

from libtpu.sdk import tpumonitoring

__all__ = ["tpumonitoring"]
