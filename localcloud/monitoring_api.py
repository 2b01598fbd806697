"""A local Cloud Monitoring: ``MetricService.CreateTimeSeries`` on gRPC, as google-cloud-monitoring calls it.

The twin points the monitor's ``CloudMonitoringWriter`` here (``TPUCTL_MONITORING_ENDPOINT``), so the production
client and its protos are what the tests exercise. It keeps every written series and refuses what the real API
refuses, with its status codes (INVALID_ARGUMENT unless said otherwise; limits from cloud.google.com/monitoring/quotas):

- a name other than ``projects/<project>``; more than 200 series in one request; a series named twice in one request;
- a series without exactly one point, a metric type outside ``custom.googleapis.com/`` and
  ``external.googleapis.com/``, more than 10 labels, a label key outside ``[a-z][a-z0-9_]*`` (100 characters)
  or a value over 1,024 characters;
- a point no later than the series' last point plus the 5 s sampling period ("written more frequently than the
  maximum sampling period").
"""

from __future__ import annotations

import re
import threading
from concurrent import futures
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import grpc
from google.cloud.monitoring_v3.types import CreateTimeSeriesRequest, TimeSeries
from google.protobuf import empty_pb2

__all__ = ["MonitoringStandIn", "WrittenPoint"]

_SERVICE = "google.monitoring.v3.MetricService"
_MAX_SERIES = 200
_MAX_LABELS = 10
_SAMPLING_PERIOD = timedelta(seconds=5)
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_]{0,99}$")
_CUSTOM_PREFIXES = ("custom.googleapis.com/", "external.googleapis.com/")


@dataclass(frozen=True)
class WrittenPoint:
    """One accepted point, as a test reads it back."""

    metric_type: str
    labels: dict[str, str]
    resource_type: str
    value: float
    at: datetime


class MonitoringStandIn:
    """Serves one project's ``CreateTimeSeries`` on 127.0.0.1; ``points`` holds what it took, in order."""

    def __init__(self, project: str, *, port: int = 0) -> None:
        self.project = project
        self.points: list[WrittenPoint] = []
        self.refusals: list[str] = []
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], datetime] = {}
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.unary_unary_rpc_method_handler(
            self._create,
            request_deserializer=CreateTimeSeriesRequest.deserialize,
            response_serializer=empty_pb2.Empty.SerializeToString,
        )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(_SERVICE, {"CreateTimeSeries": handler}),)
        )
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")

    @property
    def endpoint(self) -> str:
        """``host:port`` for ``Settings.monitoring_endpoint``."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> str:
        self._server.start()
        return self.endpoint

    def stop(self) -> None:
        self._server.stop(grace=1.0).wait(5.0)

    def series(self, metric_type: str) -> list[WrittenPoint]:
        with self._lock:
            return [point for point in self.points if point.metric_type == metric_type]

    def _create(self, request: CreateTimeSeriesRequest, context: Any) -> empty_pb2.Empty:
        with self._lock:
            problem = self._refusal(request)
            if problem is not None:
                self.refusals.append(problem)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            for series in request.time_series:
                self._accept(series)
        return empty_pb2.Empty()

    def _refusal(self, request: CreateTimeSeriesRequest) -> str | None:
        """Why the whole request is refused (the real API takes none of a request it refuses), or None."""
        if request.name != f"projects/{self.project}":
            return f"Field name had an invalid value of {request.name!r}: expected projects/{self.project}"
        if not 0 < len(request.time_series) <= _MAX_SERIES:
            return f"Field timeSeries had an invalid value: between 1 and {_MAX_SERIES} series per request"
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for index, series in enumerate(request.time_series):
            key = _key(series)
            if key in seen:
                return f"Field timeSeries[{index}] had an invalid value: duplicate TimeSeries in one request"
            seen.add(key)
            problem = _series_problem(series)
            if problem is None:
                last = self._last.get(key)
                at = series.points[0].interval.end_time
                if last is not None and at < last + _SAMPLING_PERIOD:
                    problem = (
                        "One or more points were written more frequently than the maximum sampling period "
                        "configured for the metric"
                    )
            if problem is not None:
                return f"Field timeSeries[{index}]: {problem}"
        return None

    def _accept(self, series: TimeSeries) -> None:
        point = series.points[0]
        at = point.interval.end_time
        self._last[_key(series)] = at
        self.points.append(
            WrittenPoint(
                metric_type=series.metric.type,
                labels=dict(series.metric.labels),
                resource_type=series.resource.type,
                value=point.value.double_value,
                at=at,
            )
        )


def _key(series: TimeSeries) -> tuple[str, tuple[tuple[str, str], ...]]:
    return series.metric.type, tuple(sorted(dict(series.metric.labels).items()))


def _series_problem(series: TimeSeries) -> str | None:
    if len(series.points) != 1:
        return "exactly one point per TimeSeries"
    if not series.metric.type.startswith(_CUSTOM_PREFIXES):
        return f"metric type {series.metric.type[:200]!r} is not a custom metric"
    labels = dict(series.metric.labels)
    if len(labels) > _MAX_LABELS:
        return f"{len(labels)} labels: at most {_MAX_LABELS}"
    for key, value in labels.items():
        if not _LABEL_KEY.match(key):
            return f"label key {key[:100]!r} is invalid"
        if len(value) > 1024:
            return f"label {key} value over 1024 characters"
    if not series.resource.type:
        return "a monitored resource is required"
    return None
