"""Work for child processes that share one SQLite state store (spawned, so it must be importable)."""

from __future__ import annotations

from datetime import UTC, datetime

from shared.adapters.sqlite_store import SqliteStateStore
from shared.domain.errors import ConflictError
from shared.domain.models import CommandRecord

RECEIVED_AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def hammer_store(path: str, rounds: int) -> int:
    """Record commands ``c0..c{rounds-1}`` and bump the deployment ``gemma-a`` once per round by compare-and-set.

    Returns how many of the commands this process created (another process may have created the rest).
    """
    created = 0
    with SqliteStateStore(path) as store:
        for index in range(rounds):
            first, _ = store.record_command(
                CommandRecord(
                    command_id=f"c{index}", kind="deployment.update", deployment_id="gemma-a", received_at=RECEIVED_AT
                )
            )
            created += first
            while True:
                current = store.get_deployment("gemma-a")
                if current is None:
                    raise LookupError("deployment 'gemma-a': the test must create it before starting workers")
                bumped = current.status.model_copy(update={"next_attempt": current.status.next_attempt + 1})
                try:
                    store.put_deployment(
                        current.model_copy(update={"status": bumped}), expected_version=current.version
                    )
                    break
                except ConflictError:
                    continue  # another process won this round: re-read and try again
    return created
