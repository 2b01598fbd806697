"""Lease and fence rules shared by both state-store adapters, so SQLite and Firestore decide alike.

A lease is never deleted: releasing it clears the holder but keeps the epoch, so epochs never repeat and a
fence taken before a release can never match a later holder's epoch.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shared.adapters._store_documents import check_aware
from shared.domain.models import Lease
from shared.ports import Fence

__all__ = ["RELEASED_HOLDER", "fence_violation", "next_lease", "released"]

RELEASED_HOLDER = ""
_RELEASED_AT = datetime(1970, 1, 1, tzinfo=UTC)


def next_lease(current: Lease | None, name: str, holder: str, ttl_s: float, now: datetime) -> Lease | None:
    """The lease after ``holder`` asks for it at ``now``, or None while someone else holds it unexpired."""
    if not holder:
        raise ValueError("holder: must be a non-empty name of the acquiring process")
    if ttl_s <= 0:
        raise ValueError(f"ttl_s: must be positive (got {ttl_s})")
    check_aware("now", now)
    if current is not None and current.holder not in (holder, RELEASED_HOLDER) and current.expires_at > now:
        return None
    return Lease(
        name=name,
        holder=holder,
        epoch=(current.epoch if current else 0) + 1,
        expires_at=now + timedelta(seconds=ttl_s),
    )


def released(current: Lease, holder: str, epoch: int) -> Lease | None:
    """The lease after ``holder`` gives it up at ``epoch``; None when it is no longer theirs (nothing to do)."""
    if current.holder != holder or current.epoch != epoch:
        return None
    return current.model_copy(update={"holder": RELEASED_HOLDER, "expires_at": _RELEASED_AT})


def fence_violation(fence: Fence, lease: Lease | None) -> str | None:
    """Why a write fenced by ``fence`` must be refused given the lease's current state; None if it may go."""
    if lease is None:
        return f"lease {fence.lease_name!r} does not exist; acquire it before writing with fence epoch {fence.epoch}"
    if lease.epoch != fence.epoch:
        return (
            f"lease {fence.lease_name!r} moved on to epoch {lease.epoch} (holder {lease.holder!r}); "
            f"this write was fenced at epoch {fence.epoch}, so another reconciler took over"
        )
    if lease.holder == RELEASED_HOLDER:
        return f"lease {fence.lease_name!r} was released at epoch {lease.epoch}; acquire it again before writing"
    return None
