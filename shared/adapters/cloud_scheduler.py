"""The ``SchedulerApi`` port on Cloud Scheduler (google-cloud-scheduler, REST transport).

Jobs publish on Pub/Sub topics. ``SchedulerJob.name`` is the short job id and ``topic`` the short topic
id; the adapter expands them to ``projects/P/locations/R/jobs/NAME`` and ``projects/P/topics/TOPIC``.
``endpoint`` points the client elsewhere (``localcloud.scheduler_fake`` in tests) with anonymous
credentials. Calls carry a short timeout and no client-side retry: the caller's next tick is the retry.
Errors become ``CloudError`` with the same classes the TPU adapter uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import google.api_core.exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import scheduler_v1
from google.protobuf import field_mask_pb2

from shared.domain.errors import CloudError, ErrorClass
from shared.ports import SchedulerJob

__all__ = ["CloudSchedulerApi"]

_TIMEOUT_S = 15.0
_UPDATABLE = ["schedule", "time_zone", "pubsub_target", "description"]


@contextmanager
def _mapped(what: str) -> Iterator[None]:
    """Rewrite google.api_core errors into ``CloudError`` (REST raises the HTTP-named parent classes)."""
    try:
        yield
    except gexc.TooManyRequests as exc:
        raise CloudError(ErrorClass.RATE_LIMIT, f"{what}: {exc.message}", code=429) from exc
    except gexc.Conflict as exc:
        raise CloudError(ErrorClass.ALREADY_EXISTS, f"{what}: {exc.message}", code=409) from exc
    except gexc.NotFound as exc:
        raise CloudError(ErrorClass.NOT_FOUND, f"{what}: {exc.message}", code=404) from exc
    except (gexc.Forbidden, gexc.Unauthorized) as exc:
        raise CloudError(ErrorClass.PERMISSION, f"{what}: {exc.message}", code=exc.code) from exc
    except gexc.BadRequest as exc:
        raise CloudError(ErrorClass.INVALID, f"{what}: {exc.message}", code=400) from exc
    except (gexc.ServerError, gexc.DeadlineExceeded, gexc.RetryError) as exc:
        raise CloudError(ErrorClass.TRANSIENT, f"{what}: {exc}", code=getattr(exc, "code", None)) from exc
    except gexc.GoogleAPICallError as exc:
        raise CloudError(ErrorClass.UNKNOWN, f"{what}: {exc.message}", code=exc.code) from exc
    except (OSError, ConnectionError) as exc:
        raise CloudError(ErrorClass.TRANSIENT, f"{what}: {type(exc).__name__}: {exc}") from exc


class CloudSchedulerApi:
    """Cloud Scheduler jobs in one project and region."""

    def __init__(
        self,
        project: str,
        region: str,
        *,
        endpoint: str | None = None,
        client: Any | None = None,
        time_zone: str = "Etc/UTC",
    ) -> None:
        if not project:
            raise ValueError("project: required (the GCP project id, e.g. my-project)")
        if not region:
            raise ValueError("region: required (the Scheduler location, e.g. us-central1)")
        self._project = project
        self._parent = f"projects/{project}/locations/{region}"
        self._endpoint = endpoint
        self._client = client
        self._time_zone = time_zone

    def _api(self) -> Any:
        """The client, built on first use (no credentials needed until a call is made)."""
        if self._client is None:
            if self._endpoint:
                self._client = scheduler_v1.CloudSchedulerClient(
                    transport="rest",
                    credentials=AnonymousCredentials(),
                    client_options=ClientOptions(api_endpoint=self._endpoint),
                )
            else:
                self._client = scheduler_v1.CloudSchedulerClient(transport="rest")
        return self._client

    def _name(self, short: str) -> str:
        return short if short.startswith("projects/") else f"{self._parent}/jobs/{short}"

    def _topic(self, short: str) -> str:
        return short if short.startswith("projects/") else f"projects/{self._project}/topics/{short}"

    def _to_proto(self, job: SchedulerJob) -> Any:
        return scheduler_v1.Job(
            name=self._name(job.name),
            schedule=job.schedule,
            time_zone=self._time_zone,
            pubsub_target=scheduler_v1.PubsubTarget(
                topic_name=self._topic(job.topic), data=job.data, attributes=dict(job.attributes)
            ),
        )

    def _from_proto(self, job: Any) -> SchedulerJob:
        topic = str(job.pubsub_target.topic_name)
        prefix = f"projects/{self._project}/topics/"
        return SchedulerJob(
            name=str(job.name).rsplit("/", 1)[-1],
            schedule=str(job.schedule),
            topic=topic[len(prefix) :] if topic.startswith(prefix) else topic,
            data=bytes(job.pubsub_target.data),
            paused=job.state == scheduler_v1.Job.State.PAUSED,
            attributes=dict(job.pubsub_target.attributes),
        )

    def upsert_job(self, job: SchedulerJob) -> None:
        """Create the job, or update its schedule and target; then match its paused state."""
        current = self.get_job(job.name)
        proto = self._to_proto(job)
        if current is None:
            try:
                with _mapped(f"create job {job.name}"):
                    self._api().create_job(parent=self._parent, job=proto, retry=None, timeout=_TIMEOUT_S)
            except CloudError as exc:
                if exc.error_class is not ErrorClass.ALREADY_EXISTS:
                    raise
            paused = False
        else:
            if (current.schedule, current.topic, current.data, dict(current.attributes)) != (
                job.schedule,
                job.topic,
                job.data,
                dict(job.attributes),
            ):
                with _mapped(f"update job {job.name}"):
                    self._api().update_job(
                        job=proto,
                        update_mask=field_mask_pb2.FieldMask(paths=_UPDATABLE),
                        retry=None,
                        timeout=_TIMEOUT_S,
                    )
            paused = current.paused
        if job.paused and not paused:
            self.pause_job(job.name)
        elif paused and not job.paused:
            self.resume_job(job.name)

    def get_job(self, name: str) -> SchedulerJob | None:
        try:
            with _mapped(f"get job {name}"):
                return self._from_proto(self._api().get_job(name=self._name(name), retry=None, timeout=_TIMEOUT_S))
        except CloudError as exc:
            if exc.error_class is ErrorClass.NOT_FOUND:
                return None
            raise

    def list_jobs(self, prefix: str = "") -> list[SchedulerJob]:
        with _mapped("list jobs"):
            pages = self._api().list_jobs(parent=self._parent, retry=None, timeout=_TIMEOUT_S)
            jobs = [self._from_proto(job) for job in pages]
        return sorted((job for job in jobs if job.name.startswith(prefix)), key=lambda job: job.name)

    def delete_job(self, name: str) -> None:
        try:
            with _mapped(f"delete job {name}"):
                self._api().delete_job(name=self._name(name), retry=None, timeout=_TIMEOUT_S)
        except CloudError as exc:
            if exc.error_class is not ErrorClass.NOT_FOUND:
                raise

    def pause_job(self, name: str) -> None:
        with _mapped(f"pause job {name}"):
            self._api().pause_job(name=self._name(name), retry=None, timeout=_TIMEOUT_S)

    def resume_job(self, name: str) -> None:
        with _mapped(f"resume job {name}"):
            self._api().resume_job(name=self._name(name), retry=None, timeout=_TIMEOUT_S)
