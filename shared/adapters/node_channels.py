"""``NodeChannels``: each deployment's own subscription on the node-tasks topic, made by the controller.

A node channel is ``tpuctl-node-<deployment>`` on the node-tasks topic, filtered on ``attributes.deployment_id``.
The provisioner opens it before it creates the deployment's node and closes it once the deployment is DELETED;
the node agent on the VM only pulls from it (``node_agent.agent``). So the VM's service account needs no
Pub/Sub right at project level: it holds ``roles/pubsub.subscriber`` on its own channel, granted here.

* ``PubSubNodeChannels``: google-cloud-pubsub's ``SubscriberClient`` (``create_subscription``,
  ``get_subscription``, ``delete_subscription``; it honours ``PUBSUB_EMULATOR_HOST``) for the subscription, and a
  ``SubscriptionIam`` (``shared.adapters.pubsub_iam``) for the grant to each reader. Subscriptions get what
  ``PubSubBus.ensure_subscription`` gives the agent's old self-made one: ordering, a 60 s ack deadline, retry
  backoff 10-600 s, no dead-letter policy, and labels ``managed-by=tpuctl`` and ``tpuctl-deployment``.
* ``LocalBusNodeChannels``: the same on the embedded ``LocalBus``, which has no identities, so no grant.

Transient failures (5xx, rate limits, the network) are tried ``attempts`` times with a short wait; what is still
failing is raised as a classified ``CloudError`` and the provisioner tries again on its next reconcile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import google.api_core.exceptions as gexc
import google.cloud.pubsub_v1 as pubsub_v1
from google.auth import exceptions as auth_exceptions

from shared.adapters._pubsub_rules import check_resource_name, parse_filter
from shared.adapters.local_bus import LocalBus
from shared.domain.cloud import LABEL_DEPLOYMENT, LABEL_MANAGED_BY
from shared.domain.errors import CloudError, ErrorClass, PermanentError
from shared.ports import SubscriptionIam, node_channel, node_channel_filter

__all__ = ["SUBSCRIBER_ROLE", "LocalBusNodeChannels", "PubSubNodeChannels"]

log = logging.getLogger(__name__)

SUBSCRIBER_ROLE = "roles/pubsub.subscriber"
_T = TypeVar("_T")


@contextmanager
def _mapped(what: str) -> Iterator[None]:
    """google-api-core errors of the gRPC client as ``CloudError`` (subclasses before their parents)."""
    try:
        yield
    except CloudError:
        raise
    except gexc.Aborted as exc:
        raise CloudError(ErrorClass.TRANSIENT, f"{what}: {exc.message}", code=409) from exc
    except gexc.AlreadyExists as exc:
        raise CloudError(ErrorClass.ALREADY_EXISTS, f"{what}: {exc.message}", code=409) from exc
    except gexc.NotFound as exc:
        raise CloudError(ErrorClass.NOT_FOUND, f"{what}: {exc.message}", code=404) from exc
    except (gexc.Forbidden, gexc.Unauthorized) as exc:
        fix = " (the controller needs the tpuctlNodeChannels role and attach on the node-tasks topic)"
        raise CloudError(ErrorClass.PERMISSION, f"{what}: {exc.message}{fix}", code=exc.code) from exc
    except gexc.TooManyRequests as exc:
        raise CloudError(ErrorClass.RATE_LIMIT, f"{what}: {exc.message}", code=429) from exc
    except (gexc.BadRequest, gexc.MethodNotImplemented) as exc:
        raise CloudError(ErrorClass.INVALID, f"{what}: {exc.message}", code=exc.code) from exc
    except (gexc.ServerError, gexc.DeadlineExceeded, gexc.RetryError, gexc.Cancelled) as exc:
        raise CloudError(ErrorClass.TRANSIENT, f"{what}: {type(exc).__name__}: {exc}") from exc
    except gexc.GoogleAPICallError as exc:
        raise CloudError(ErrorClass.UNKNOWN, f"{what}: {exc.message}", code=exc.code) from exc
    except auth_exceptions.DefaultCredentialsError as exc:
        raise CloudError(ErrorClass.PERMISSION, f"{what}: no credentials: {exc}") from exc
    except (auth_exceptions.TransportError, OSError) as exc:
        raise CloudError(ErrorClass.TRANSIENT, f"{what}: {type(exc).__name__}: {exc}") from exc


class PubSubNodeChannels:
    """Node channels on Pub/Sub; the subscriber client is made on first use unless given."""

    def __init__(
        self,
        project: str,
        topic: str,
        *,
        iam: SubscriptionIam | None = None,
        readers: Sequence[str] = (),
        subscriber: pubsub_v1.SubscriberClient | None = None,
        ack_deadline_s: int = 60,
        backoff_min_s: float = 10.0,
        backoff_max_s: float = 600.0,
        timeout_s: float = 30.0,
        attempts: int = 3,
        retry_wait_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not project:
            raise ValueError("project: required (the GCP project id, e.g. my-project)")
        check_resource_name("topic", topic)
        if readers and iam is None:
            raise ValueError("iam: required to grant the readers subscriber on their channel")
        for member in readers:
            if not member.startswith(("serviceAccount:", "user:", "group:")):
                raise ValueError(f"readers: {member!r} is not an IAM member (serviceAccount:EMAIL)")
        if attempts < 1:
            raise ValueError(f"attempts: {attempts!r} must be at least 1")
        self.project = project
        self.topic = topic
        self.readers = tuple(readers)
        self._iam = iam
        self._subscriber = subscriber
        self._owns_subscriber = subscriber is None
        self._ack_deadline_s = ack_deadline_s
        self._backoff = (timedelta(seconds=backoff_min_s), timedelta(seconds=backoff_max_s))
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._retry_wait_s = retry_wait_s
        self._sleep = sleep

    # --- NodeChannels ----------------------------------------------------------------------------------------

    def open(self, deployment_id: str) -> str:
        name = node_channel(deployment_id)
        path = self._subscription_path(name)
        wanted_filter = _filter_text(deployment_id)
        request: dict[str, Any] = {
            "name": path,
            "topic": self._topic_path(),
            "filter": wanted_filter,
            "ack_deadline_seconds": self._ack_deadline_s,
            "enable_message_ordering": True,
            "retry_policy": {"minimum_backoff": self._backoff[0], "maximum_backoff": self._backoff[1]},
            "labels": {LABEL_MANAGED_BY: "tpuctl", LABEL_DEPLOYMENT: deployment_id},
        }
        created = self._retrying(lambda: self._create(request, name, wanted_filter))
        for member in self.readers:
            if self._retrying(self._granter(name, member)):
                log.info("granted %s on %s to %s", SUBSCRIBER_ROLE, name, member)
        if created:
            log.info("opened node channel %s on %s", name, self.topic)
        return name

    def close(self, deployment_id: str) -> bool:
        name = node_channel(deployment_id)
        path = self._subscription_path(name)

        def delete() -> bool:
            try:
                with _mapped(f"delete subscription {name!r}"):
                    self._client().delete_subscription(
                        request={"subscription": path}, retry=None, timeout=self._timeout_s
                    )
            except CloudError as exc:
                if exc.error_class is ErrorClass.NOT_FOUND:
                    return False
                raise
            return True

        existed = self._retrying(delete)
        if existed:
            log.info("closed node channel %s", name)
        return existed

    def close_client(self) -> None:
        """Stop the subscriber client this object made (a given client belongs to the caller) and the IAM session."""
        if self._owns_subscriber and self._subscriber is not None:
            self._subscriber.close()
            self._subscriber = None
        closer = getattr(self._iam, "close", None)
        if callable(closer):
            closer()

    # --- helpers ---------------------------------------------------------------------------------------------

    def _create(self, request: dict[str, Any], name: str, wanted_filter: str) -> bool:
        """True when created now; an existing channel must be on our topic with our filter."""
        client = self._client()
        try:
            with _mapped(f"create subscription {name!r}"):
                client.create_subscription(request=request, retry=None, timeout=self._timeout_s)
            return True
        except CloudError as exc:
            if exc.error_class is not ErrorClass.ALREADY_EXISTS:
                raise
        with _mapped(f"get subscription {name!r}"):
            existing = client.get_subscription(
                request={"subscription": request["name"]}, retry=None, timeout=self._timeout_s
            )
        if existing.topic != request["topic"] or existing.filter != wanted_filter:
            raise CloudError(
                ErrorClass.INVALID,
                f"subscription {name!r} already exists on {existing.topic!r} with filter {existing.filter!r}, not "
                f"on {request['topic']!r} with {wanted_filter!r}; delete it (gcloud pubsub subscriptions delete "
                f"{name}) and the next reconcile opens the channel again",
            )
        return False

    def _granter(self, name: str, member: str) -> Callable[[], bool]:
        iam = self._iam
        assert iam is not None  # checked in __init__ when there are readers
        return lambda: iam.grant(name, SUBSCRIBER_ROLE, member)

    def _retrying(self, call: Callable[[], _T]) -> _T:
        for attempt in range(1, self._attempts + 1):
            try:
                return call()
            except CloudError as exc:
                if not exc.transient or attempt == self._attempts:
                    raise
                log.info("node channel call failed (%s); trying again", exc)
                self._sleep(self._retry_wait_s * attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _client(self) -> pubsub_v1.SubscriberClient:
        if self._subscriber is None:
            with _mapped("create the subscriber client"):
                self._subscriber = pubsub_v1.SubscriberClient()
        return self._subscriber

    def _topic_path(self) -> str:
        return f"projects/{self.project}/topics/{self.topic}"

    def _subscription_path(self, name: str) -> str:
        return f"projects/{self.project}/subscriptions/{check_resource_name('subscription', name)}"


class LocalBusNodeChannels:
    """Node channels on the embedded bus: the same subscription and filter; the local bus has no identities."""

    def __init__(self, bus: LocalBus, topic: str) -> None:
        self.bus = bus
        self.topic = check_resource_name("topic", topic)

    def open(self, deployment_id: str) -> str:
        name = node_channel(deployment_id)
        try:
            self.bus.ensure_subscription(self.topic, name, filter=_filter_text(deployment_id))
        except PermanentError as exc:
            raise CloudError(ErrorClass.INVALID, f"open node channel {name!r}: {exc}") from exc
        return name

    def close(self, deployment_id: str) -> bool:
        try:
            return self.bus.delete_subscription(node_channel(deployment_id))
        except PermanentError as exc:
            raise CloudError(ErrorClass.INVALID, f"close node channel {deployment_id!r}: {exc}") from exc


def _filter_text(deployment_id: str) -> str:
    parsed = parse_filter(node_channel_filter(deployment_id))
    assert parsed is not None
    return parsed.text
