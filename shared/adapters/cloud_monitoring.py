"""``CloudMonitoringWriter``: the ``MetricWriter`` on Google Cloud, over google-cloud-monitoring (gRPC).

Each point becomes one ``TimeSeries`` on the ``global`` resource of the project, with one gauge point (DOUBLE),
written by ``projects.timeSeries.create`` in requests of at most 200 series (the API's limit), each series once
per request (the API refuses a request that names a series twice). Metric descriptors are Terraform's
(``terraform/modules/monitoring``), so units and descriptions are declared once, not inferred from the first write.

``endpoint`` (``TPUCTL_MONITORING_ENDPOINT``, ``host:port``) points the client elsewhere over a plain channel with
anonymous credentials, as the other adapters with an endpoint do (the twin's stand-in, ``localcloud``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from shared.domain.errors import CloudError, ErrorClass
from shared.domain.sli_metrics import MetricPoint

__all__ = ["MAX_SERIES_PER_REQUEST", "CloudMonitoringWriter", "batches"]

MAX_SERIES_PER_REQUEST = 200
_TIMEOUT_S = 5.0  # the monitor's tick waits for it: a slow Monitoring API must not hold the tick


def batches(points: Sequence[MetricPoint]) -> list[list[MetricPoint]]:
    """Requests of at most 200 points in which no series (metric type and labels) appears twice, in order."""
    out: list[list[MetricPoint]] = []
    seen: list[set[tuple[str, tuple[tuple[str, str], ...]]]] = []
    for point in points:
        key = (point.metric_type, tuple(sorted(point.labels.items())))
        for batch, keys in zip(out, seen, strict=True):
            if key not in keys and len(batch) < MAX_SERIES_PER_REQUEST:
                batch.append(point)
                keys.add(key)
                break
        else:
            out.append([point])
            seen.append({key})
    return out


class CloudMonitoringWriter:
    """Writes gauge points of one project; the SDK client is built on first use."""

    def __init__(self, project: str, *, endpoint: str | None = None, client: Any | None = None) -> None:
        if not project:
            raise ValueError("project: required (the GCP project id, e.g. my-project)")
        self._project = project
        self._endpoint = endpoint
        self._client = client

    def write(self, points: Sequence[MetricPoint]) -> None:
        for batch in batches(points):
            series = [self._series(point) for point in batch]
            with _mapped("Cloud Monitoring: timeSeries.create"):
                self._sdk().create_time_series(name=f"projects/{self._project}", time_series=series, timeout=_TIMEOUT_S)

    def _series(self, point: MetricPoint) -> Any:
        from google.cloud import monitoring_v3

        return monitoring_v3.TimeSeries(
            metric={"type": point.metric_type, "labels": dict(point.labels)},
            resource={"type": "global", "labels": {"project_id": self._project}},
            points=[{"interval": {"end_time": point.at}, "value": {"double_value": point.value}}],
        )

    def _sdk(self) -> Any:
        if self._client is None:
            from google.cloud import monitoring_v3

            if self._endpoint is None:
                self._client = monitoring_v3.MetricServiceClient()
            else:
                import grpc
                from google.cloud.monitoring_v3.services.metric_service.transports import MetricServiceGrpcTransport

                channel = grpc.insecure_channel(self._endpoint)
                self._client = monitoring_v3.MetricServiceClient(transport=MetricServiceGrpcTransport(channel=channel))
        return self._client


@contextmanager
def _mapped(what: str) -> Iterator[None]:
    """google-api-core's gRPC errors as ``CloudError``: INVALID is final, the rest may pass on a later tick."""
    from google.api_core import exceptions as gexc

    try:
        yield
    except gexc.InvalidArgument as exc:
        raise CloudError(ErrorClass.INVALID, f"{what}: {exc.message}", code=400) from exc
    except (gexc.PermissionDenied, gexc.Unauthenticated) as exc:
        fix = " (the monitor's account needs roles/monitoring.metricWriter)"
        raise CloudError(ErrorClass.PERMISSION, f"{what}: {exc.message}{fix}", code=exc.code) from exc
    except gexc.NotFound as exc:
        raise CloudError(ErrorClass.NOT_FOUND, f"{what}: {exc.message}", code=404) from exc
    except gexc.ResourceExhausted as exc:
        raise CloudError(ErrorClass.RATE_LIMIT, f"{what}: {exc.message}", code=429) from exc
    except (gexc.ServerError, gexc.DeadlineExceeded, gexc.RetryError, gexc.Cancelled) as exc:
        raise CloudError(ErrorClass.TRANSIENT, f"{what}: {type(exc).__name__}: {exc}") from exc
    except gexc.GoogleAPICallError as exc:
        raise CloudError(ErrorClass.UNKNOWN, f"{what}: {exc.message}", code=exc.code) from exc
