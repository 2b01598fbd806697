"""A token bucket for TPU create calls, pure: the state goes in and comes back out.

Why: the TPU API allows about 90 creates per project per minute and answers a burst with 429
(docs/reference/tpu-api.md §5.2). Fan-out across many deployments must be throttled on our side, and a 429 must
empty the bucket so nobody retries before tokens come back. The caller keeps the state (in memory
or in a store); nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

__all__ = ["BucketState", "TokenBucket"]


@dataclass(frozen=True)
class BucketState:
    """Tokens left at ``updated_at``; ``blocked_until`` holds the bucket empty after a 429."""

    tokens: float
    updated_at: datetime
    blocked_until: datetime | None = None


@dataclass(frozen=True)
class TokenBucket:
    """``capacity`` tokens at most, refilled at ``refill_per_s``; one create costs one token."""

    capacity: float
    refill_per_s: float

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError("capacity: must be at least 1 token (e.g. 10)")
        if self.refill_per_s <= 0:
            raise ValueError("refill_per_s: must be positive (e.g. 1.0 for 60 creates a minute)")

    @classmethod
    def per_minute(cls, creates_per_minute: float, *, burst: float | None = None) -> TokenBucket:
        """A bucket that allows ``creates_per_minute`` on average and ``burst`` at once."""
        return cls(capacity=burst if burst is not None else creates_per_minute, refill_per_s=creates_per_minute / 60)

    def full(self, now: datetime) -> BucketState:
        """A fresh, full bucket."""
        return BucketState(tokens=self.capacity, updated_at=now)

    def refill(self, state: BucketState, now: datetime) -> BucketState:
        """Credit the time since ``updated_at`` (none while blocked); time never runs backwards here."""
        start = state.updated_at
        if state.blocked_until is not None:
            if now <= state.blocked_until:
                return replace(state, tokens=0.0, updated_at=max(now, state.updated_at))
            start = max(start, state.blocked_until)
        elapsed = max(0.0, (now - start).total_seconds())
        tokens = min(self.capacity, state.tokens + elapsed * self.refill_per_s)
        return BucketState(tokens=tokens, updated_at=max(now, state.updated_at), blocked_until=None)

    def available(self, state: BucketState, now: datetime) -> int:
        """Whole tokens that can be spent right now."""
        return int(self.refill(state, now).tokens + 1e-9)

    def take(self, state: BucketState, now: datetime, count: int = 1) -> tuple[bool, BucketState]:
        """Spend ``count`` tokens if there are enough; returns (granted, new state)."""
        if count < 0:
            raise ValueError("count: must be zero or more")
        current = self.refill(state, now)
        if current.tokens + 1e-9 < count:
            return False, current
        return True, replace(current, tokens=current.tokens - count)

    def drain(self, state: BucketState, now: datetime, *, hold_s: float = 60.0) -> BucketState:
        """The API said 429: empty the bucket and keep it empty for ``hold_s`` seconds."""
        until = now + timedelta(seconds=hold_s)
        blocked = max(until, state.blocked_until) if state.blocked_until else until
        return BucketState(tokens=0.0, updated_at=max(now, state.updated_at), blocked_until=blocked)

    def wait_s(self, state: BucketState, now: datetime, count: int = 1) -> float:
        """Seconds until ``count`` tokens are available (0 when they are now)."""
        current = self.refill(state, now)
        if current.tokens + 1e-9 >= count:
            return 0.0
        blocked_s = (current.blocked_until - now).total_seconds() if current.blocked_until else 0.0
        return max(0.0, blocked_s) + (count - current.tokens) / self.refill_per_s
