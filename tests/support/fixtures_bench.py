"""Fixtures for the load generator: a streaming stub server with a known first-token delay, in its own process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.stub_server import StubBehaviour, StubProcess, spawn_stub

STUB_FIRST_TOKEN_S = 0.020
STUB_INTER_TOKEN_S = 0.001


@pytest.fixture(scope="module")
def timed_stub() -> Iterator[StubProcess]:
    """A stub that sends the first token 20 ms after reading a request, then one token per millisecond."""
    stub = spawn_stub(StubBehaviour(first_token_delay_s=STUB_FIRST_TOKEN_S, inter_token_s=STUB_INTER_TOKEN_S))
    try:
        yield stub
    finally:
        stub.stop()
