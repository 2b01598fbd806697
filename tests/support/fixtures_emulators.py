"""Session fixtures for the real Firestore and Pub/Sub emulators (google-cloud-cli), shared by every test folder.

``firestore_emulator`` and ``pubsub_emulator`` each start their emulator once per session, on a free loopback
port, the first time a test asks for them; they yield a :class:`~tests.support.emulators.RunningEmulator` with

- ``host_port`` (``"127.0.0.1:PORT"``), ``host``, ``port``, ``base_url`` (``"http://127.0.0.1:PORT"``),
- ``project`` (``"demo-tpuctl"``: pass it to the clients), ``env_var`` (the variable that was set).

While the session runs, ``FIRESTORE_EMULATOR_HOST`` / ``PUBSUB_EMULATOR_HOST`` point at them, so
``firestore.Client(project=emulator.project)`` and ``pubsub_v1.PublisherClient()`` need no credentials. At the
end the variables are restored and the emulator's whole process group is stopped.

When google-cloud-cli, its emulator component or java is missing, every test using them is skipped with a
reason that names the missing piece. Mark such tests ``@pytest.mark.emulator``.

Pub/Sub has no reset: name topics and subscriptions with :func:`~tests.support.emulators.unique_name`.
Firestore is emptied before each test that takes ``firestore_client``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.cloud import firestore

from tests.support.emulators import (
    FIRESTORE,
    PUBSUB,
    EmulatorKind,
    Missing,
    RunningEmulator,
    locate,
    reset_firestore,
    start,
)

EMULATOR_PROJECT = "demo-tpuctl"


def _run_emulator(kind: EmulatorKind, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    found = locate(kind)
    if isinstance(found, Missing):
        pytest.skip(found.reason)
    emulator = start(found, project=EMULATOR_PROJECT, log_dir=tmp_path_factory.mktemp(f"{kind.name}-emulator"))
    patch = pytest.MonkeyPatch()
    try:
        patch.setenv(kind.env_var, emulator.host_port)
        yield emulator
    finally:
        patch.undo()
        emulator.stop()


@pytest.fixture(scope="session")
def firestore_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    """The Firestore emulator for this session; ``FIRESTORE_EMULATOR_HOST`` is set while it runs."""
    yield from _run_emulator(FIRESTORE, tmp_path_factory)


@pytest.fixture(scope="session")
def pubsub_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    """The Pub/Sub emulator for this session; ``PUBSUB_EMULATOR_HOST`` is set while it runs."""
    yield from _run_emulator(PUBSUB, tmp_path_factory)


@pytest.fixture
def firestore_client(firestore_emulator: RunningEmulator) -> Iterator[firestore.Client]:
    """A Firestore client on an emptied emulator database (reset before the test, closed after it)."""
    reset_firestore(firestore_emulator)
    client = firestore.Client(project=firestore_emulator.project)
    try:
        yield client
    finally:
        client.close()
