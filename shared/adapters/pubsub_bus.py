"""The command bus on Google Cloud Pub/Sub (google-cloud-pubsub), the production twin of ``LocalBus``.

- Publishing goes through a ``PublisherClient`` with message ordering enabled; the ordering key is the one
  given (by convention the deployment id). ``publish`` waits for the server's message id, so a returned id
  means the message is stored. A failed publish pauses its ordering key inside the client; the key is resumed
  at once so the caller's retry can go through.
- Subscriptions are created with ordering, the filter, a retry policy with exponential backoff, an ack
  deadline and, when asked, a dead-letter policy. Their topic and filter are immutable in Pub/Sub: creating an
  existing subscription with a different one is an error; the dead-letter policy is updated in place.
- ``pull`` is a synchronous pull: each message goes to the handler in order; return acks it, raise nacks it
  (ack deadline 0, so the subscription's retry policy applies). After a failure, later messages of the same
  ordering key in the batch are nacked without being handled, so order holds.
- ``Delivery.attempt`` is Pub/Sub's ``delivery_attempt``, which the service fills in only on subscriptions with
  a dead-letter policy; elsewhere it is 1.
- Names are short (``tpuctl-commands``); the adapter builds ``projects/P/topics/...`` paths. Input is checked
  with the same rules as ``LocalBus`` (``_pubsub_rules``) before any call.

Errors from google-api-core are translated once, here (:func:`error_family`): rate limits, 5xx, aborted and
cancelled calls and publish timeouts become ``TransientError`` (retry later); not found, invalid argument,
permission and authentication problems become ``PermanentError``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from google.cloud.pubsub_v1.publisher import exceptions as publisher_exceptions

from shared.adapters._pubsub_rules import (
    check_max_delivery_attempts,
    check_message,
    check_resource_name,
    parse_filter,
)
from shared.domain.errors import PermanentError, TransientError
from shared.ports import Delivery, Handler, MissingSubscription
from shared.tracing import with_trace_context

__all__ = ["PubSubBus", "error_family"]

log = logging.getLogger(__name__)

_MAX_PULL_MESSAGES = 1000
_MIN_PULL_DEADLINE_S = 0.5  # a synchronous pull needs some deadline; timeout_s=0 means "what is ready now"

# First match wins: subclasses before their parents (Aborted is a Conflict, MethodNotImplemented a ServerError).
_ERROR_FAMILIES: tuple[tuple[type[BaseException], type[PermanentError] | type[TransientError]], ...] = (
    (api_exceptions.Aborted, TransientError),
    (api_exceptions.Cancelled, TransientError),
    (api_exceptions.TooManyRequests, TransientError),  # ResourceExhausted over gRPC
    (api_exceptions.MethodNotImplemented, PermanentError),
    (api_exceptions.ServerError, TransientError),  # 500, 502, 503, 504 (DeadlineExceeded), Unknown, DataLoss
    (api_exceptions.RetryError, TransientError),
    (api_exceptions.ClientError, PermanentError),  # NotFound, AlreadyExists, InvalidArgument, PermissionDenied, ...
    (api_exceptions.GoogleAPICallError, TransientError),  # anything else the service answered: try again later
    (api_exceptions.GoogleAPIError, PermanentError),  # client-side configuration (e.g. duplicate credentials)
    (auth_exceptions.GoogleAuthError, PermanentError),  # no or bad credentials
    (publisher_exceptions.PublishToPausedOrderingKeyException, TransientError),
    (publisher_exceptions.FlowControlLimitError, TransientError),
    (TimeoutError, TransientError),  # the publish future did not resolve in time
)

_FIXES: tuple[tuple[type[BaseException], str], ...] = (
    (api_exceptions.NotFound, "create it with ensure_topic / ensure_subscription first"),
    (api_exceptions.Forbidden, "grant the caller's service account the Pub/Sub role it needs"),
    (api_exceptions.Unauthorized, "check the credentials (gcloud auth application-default login)"),
    (auth_exceptions.DefaultCredentialsError, "run gcloud auth application-default login or set PUBSUB_EMULATOR_HOST"),
    (TimeoutError, "the message may still be published later; retry with the same command_id"),
)


def error_family(exc: BaseException) -> type[PermanentError] | type[TransientError] | None:
    """Which of our error families a Pub/Sub client exception belongs to; None when it is not one of theirs."""
    for vendor_class, family in _ERROR_FAMILIES:
        if isinstance(exc, vendor_class):
            return family
    return None


@contextmanager
def _translated(action: str) -> Iterator[None]:
    """Re-raise Pub/Sub client exceptions as ``PermanentError`` / ``TransientError`` naming the action."""
    try:
        yield
    except (PermanentError, TransientError, ValueError):
        raise
    except Exception as exc:
        family = error_family(exc)
        if family is None:
            raise
        fix = next((text for vendor_class, text in _FIXES if isinstance(exc, vendor_class)), "")
        message = f"pubsub {action}: {type(exc).__name__}: {exc}" + (f" ({fix})" if fix else "")
        raise family(message) from exc


class PubSubBus:
    """A ``CommandBus`` on Pub/Sub. Clients are created on first use unless given (tests, emulator wiring)."""

    def __init__(
        self,
        project: str,
        *,
        publisher: pubsub_v1.PublisherClient | None = None,
        subscriber: pubsub_v1.SubscriberClient | None = None,
        ack_deadline_s: int = 60,
        backoff_min_s: float = 10.0,
        backoff_max_s: float = 600.0,
        publish_timeout_s: float = 30.0,
    ) -> None:
        if not project or not isinstance(project, str):
            raise ValueError("project: a Google Cloud project id is required (set TPUCTL_PROJECT)")
        if isinstance(ack_deadline_s, bool) or not isinstance(ack_deadline_s, int) or not 10 <= ack_deadline_s <= 600:
            raise ValueError(f"ack_deadline_s: {ack_deadline_s!r} (Pub/Sub accepts whole seconds from 10 to 600)")
        if not 0 <= backoff_min_s <= backoff_max_s <= 600:
            raise ValueError(
                f"backoff_min_s/backoff_max_s: {backoff_min_s!r}/{backoff_max_s!r} "
                "(Pub/Sub needs 0 <= backoff_min_s <= backoff_max_s <= 600)"
            )
        if publish_timeout_s <= 0:
            raise ValueError(f"publish_timeout_s: {publish_timeout_s!r} must be positive")
        self.project = project
        self.ack_deadline_s = ack_deadline_s
        self.backoff_min_s = float(backoff_min_s)
        self.backoff_max_s = float(backoff_max_s)
        self.publish_timeout_s = float(publish_timeout_s)
        self._publisher = publisher
        self._subscriber = subscriber
        self._owns_publisher = publisher is None
        self._owns_subscriber = subscriber is None
        self._clients_lock = threading.Lock()

    # --- paths and clients -------------------------------------------------------------------------------

    def topic_path(self, topic: str) -> str:
        return f"projects/{self.project}/topics/{check_resource_name('topic', topic)}"

    def subscription_path(self, subscription: str) -> str:
        return f"projects/{self.project}/subscriptions/{check_resource_name('subscription', subscription)}"

    def _publisher_client(self) -> pubsub_v1.PublisherClient:
        with self._clients_lock:
            if self._publisher is None:
                with _translated("create the publisher client"):
                    options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
                    self._publisher = pubsub_v1.PublisherClient(publisher_options=options)
            return self._publisher

    def _subscriber_client(self) -> pubsub_v1.SubscriberClient:
        with self._clients_lock:
            if self._subscriber is None:
                with _translated("create the subscriber client"):
                    self._subscriber = pubsub_v1.SubscriberClient()
            return self._subscriber

    def close(self) -> None:
        """Flush and stop the clients this bus created (given clients belong to the caller)."""
        with self._clients_lock:
            if self._owns_publisher and self._publisher is not None:
                self._publisher.stop()
                self._publisher = None
            if self._owns_subscriber and self._subscriber is not None:
                self._subscriber.close()
                self._subscriber = None

    # --- CommandBus ----------------------------------------------------------------------------------------

    def ensure_topic(self, topic: str) -> None:
        path = self.topic_path(topic)
        with _translated(f"create topic {topic!r}"):
            try:
                self._publisher_client().create_topic(request={"name": path})
            except api_exceptions.Conflict as exc:
                if isinstance(exc, api_exceptions.Aborted):
                    raise
                log.debug("topic already exists", extra={"topic": topic})

    def ensure_subscription(
        self,
        topic: str,
        subscription: str,
        *,
        filter: str | None = None,
        dead_letter_topic: str | None = None,
        max_delivery_attempts: int = 5,
    ) -> None:
        """Create the subscription if absent (ordering on, retry backoff, optional filter and dead letters)."""
        topic_path = self.topic_path(topic)
        path = self.subscription_path(subscription)
        parsed = parse_filter(filter)
        check_max_delivery_attempts(max_delivery_attempts)
        dead_letter_policy: dict[str, Any] = {}
        if dead_letter_topic is not None:
            if dead_letter_topic == topic:
                raise ValueError(
                    f"dead_letter_topic: {dead_letter_topic!r} is the subscription's own topic (use a separate topic)"
                )
            dead_letter_policy = {
                "dead_letter_topic": self.topic_path(dead_letter_topic),
                "max_delivery_attempts": max_delivery_attempts,
            }
        request: dict[str, Any] = {
            "name": path,
            "topic": topic_path,
            "ack_deadline_seconds": self.ack_deadline_s,
            "enable_message_ordering": True,
            "retry_policy": {
                "minimum_backoff": timedelta(seconds=self.backoff_min_s),
                "maximum_backoff": timedelta(seconds=self.backoff_max_s),
            },
        }
        if parsed is not None:
            request["filter"] = parsed.text
        if dead_letter_policy:
            request["dead_letter_policy"] = dead_letter_policy
        subscriber = self._subscriber_client()
        with _translated(f"create subscription {subscription!r}"):
            try:
                subscriber.create_subscription(request=request)
                return
            except api_exceptions.Conflict as exc:
                if isinstance(exc, api_exceptions.Aborted):
                    raise
            existing = subscriber.get_subscription(request={"subscription": path})
            wanted_filter = parsed.text if parsed else ""
            if existing.topic != topic_path or existing.filter != wanted_filter:
                raise PermanentError(
                    f"subscription {subscription!r} already exists on {existing.topic!r} with filter "
                    f"{existing.filter!r}; its topic and filter cannot change (use another subscription name)"
                )
            current = existing.dead_letter_policy
            current_policy = (
                {"dead_letter_topic": current.dead_letter_topic, "max_delivery_attempts": current.max_delivery_attempts}
                if current.dead_letter_topic
                else {}
            )
            if current_policy != dead_letter_policy:
                subscriber.update_subscription(
                    request={
                        "subscription": {"name": path, "dead_letter_policy": dead_letter_policy},
                        "update_mask": {"paths": ["dead_letter_policy"]},
                    }
                )

    def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str], *, ordering_key: str | None = None
    ) -> str:
        """Publish and wait for the message id (the message is stored once the id is back)."""
        path = self.topic_path(topic)
        attributes = with_trace_context(attributes)
        check_message(data, attributes, ordering_key)
        key = ordering_key or ""
        publisher = self._publisher_client()
        with _translated(f"publish to topic {topic!r}"):
            future = publisher.publish(path, bytes(data), ordering_key=key, **dict(attributes))
            try:
                return str(future.result(timeout=self.publish_timeout_s))
            except TimeoutError:
                raise
            except Exception:
                if key:
                    self._resume(publisher, path, key)
                raise

    def pull(self, subscription: str, handler: Handler, *, max_messages: int = 10, timeout_s: float = 1.0) -> int:
        """One synchronous pull of up to ``max_messages``; each goes to ``handler``. Returns how many were acked."""
        path = self.subscription_path(subscription)
        if isinstance(max_messages, bool) or not 1 <= max_messages <= _MAX_PULL_MESSAGES:
            raise ValueError(f"max_messages: {max_messages!r} (use 1 to {_MAX_PULL_MESSAGES})")
        if timeout_s < 0:
            raise ValueError(f"timeout_s: {timeout_s!r} must not be negative")
        subscriber = self._subscriber_client()
        with _translated(f"pull from subscription {subscription!r}"):
            try:
                response = subscriber.pull(
                    request={"subscription": path, "max_messages": max_messages},
                    timeout=max(timeout_s, _MIN_PULL_DEADLINE_S),
                    retry=None,
                )
            except api_exceptions.DeadlineExceeded:
                return 0  # nothing arrived within timeout_s
            except api_exceptions.NotFound as exc:
                raise MissingSubscription(
                    f"pubsub pull from subscription {subscription!r}: it does not exist: {exc.message}"
                ) from exc
        acked = 0
        failed_keys: set[str] = set()
        for received in response.received_messages:
            message = received.message
            delivery = Delivery(
                message_id=message.message_id,
                data=bytes(message.data),
                attributes=dict(message.attributes),
                attempt=received.delivery_attempt or 1,
                subscription=subscription,
                ordering_key=message.ordering_key,
                publish_time=message.publish_time,
            )
            key = delivery.ordering_key
            if key and key in failed_keys:
                self._nack(subscriber, path, received.ack_id, delivery)  # keep the order: redeliver after the failure
                continue
            try:
                handler(delivery)
            except Exception as exc:
                log.warning(
                    "handler failed, nacking: %s: %s",
                    type(exc).__name__,
                    exc,
                    extra={
                        "subscription": subscription,
                        "message_id": delivery.message_id,
                        "attempt": delivery.attempt,
                    },
                )
                self._nack(subscriber, path, received.ack_id, delivery)
                if key:
                    failed_keys.add(key)
                continue
            if self._ack(subscriber, path, received.ack_id, delivery):
                acked += 1
        return acked

    # --- helpers -------------------------------------------------------------------------------------------

    @staticmethod
    def _resume(publisher: pubsub_v1.PublisherClient, path: str, key: str) -> None:
        # RuntimeError: not paused (the failure did not come from the sequencer); ValueError: ordering disabled.
        with suppress(RuntimeError, ValueError):
            publisher.resume_publish(path, key)

    @staticmethod
    def _ack(subscriber: pubsub_v1.SubscriberClient, path: str, ack_id: str, delivery: Delivery) -> bool:
        try:
            subscriber.acknowledge(request={"subscription": path, "ack_ids": [ack_id]})
        except (api_exceptions.GoogleAPIError, auth_exceptions.GoogleAuthError) as exc:
            log.warning(
                "ack failed, the message will be delivered again: %s",
                exc,
                extra={"subscription": delivery.subscription, "message_id": delivery.message_id},
            )
            return False
        return True

    @staticmethod
    def _nack(subscriber: pubsub_v1.SubscriberClient, path: str, ack_id: str, delivery: Delivery) -> None:
        try:
            subscriber.modify_ack_deadline(
                request={"subscription": path, "ack_ids": [ack_id], "ack_deadline_seconds": 0}
            )
        except (api_exceptions.GoogleAPIError, auth_exceptions.GoogleAuthError) as exc:
            log.warning(
                "nack failed, the message returns when its ack deadline passes: %s",
                exc,
                extra={"subscription": delivery.subscription, "message_id": delivery.message_id},
            )
