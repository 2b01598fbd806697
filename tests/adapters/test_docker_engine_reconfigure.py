"""``DockerEngineContainer.reconfigure`` against the VM twin's Engine API, over a real unix socket.

The serving container is created the way the startup script creates it, through the twin's ``docker run``
(labels, restart policy, ``--net=none``, shm, ulimit, a device, mounts, env, ``--entrypoint /bin/sh`` and both
wrappers before ``vllm serve``); its process records the argv it was started with, so a test sees what every
recreated process really ran.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcloud.vm_twin.docker_cli import inspect
from shared.adapters.docker_engine import OVERRIDES_LABEL, PLANNED_CMD_LABEL, DockerEngineContainer
from shared.domain.errors import InvalidMessage, PermanentError
from shared.domain.serving_overrides import apply_to_argv
from tests.support.serving_container import StandIn, docker, script_run_words, serve_stand_in

VLLM_ARGV = (
    "vllm", "serve", "google/gemma-3-1b-it", "--served-model-name", "gemma",
    "--max-num-seqs", "8", "--max-num-batched-tokens", "2048", "--block-size", "32", "--enable-prefix-caching",
)  # fmt: skip
NAME = "tpuctl-vllm"


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    with serve_stand_in(tmp_path / "node", name="sleepy") as served:
        words = script_run_words("stand-in:1", VLLM_ARGV, name=NAME, device="/dev/null", hf_cache=tmp_path / "hf")
        assert docker(served.docker_host, words) == 0
        yield served


@pytest.fixture
def engine(stand_in: StandIn) -> Iterator[DockerEngineContainer]:
    client = DockerEngineContainer(stand_in.docker_host, NAME, timeout_s=10)
    try:
        yield client
    finally:
        client.close()


def _inspect(stand_in: StandIn) -> dict[str, Any]:
    found = inspect(str(stand_in.server.socket_path), NAME)
    assert found is not None
    return found


def _without(document: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key not in keys}


def _argv_of(stand_in: StandIn, pid: int | None, timeout_s: float = 10.0) -> list[str]:
    """The argv process ``pid`` recorded once it ran (it records it first thing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [argv for started, argv in stand_in.commands() if started == pid]
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError(f"no process {pid} recorded its argv")


def test_the_script_s_run_carries_its_whole_config_into_inspect(stand_in: StandIn) -> None:
    found = _inspect(stand_in)
    host = found["HostConfig"]
    assert host["NetworkMode"] == "none" and host["RestartPolicy"]["Name"] == "unless-stopped"
    assert host["ShmSize"] == 16 * 1024**3 and host["Ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}]
    assert host["Devices"] == [{"PathOnHost": "/dev/null", "PathInContainer": "/dev/null", "CgroupPermissions": "rwm"}]
    assert found["Config"]["Entrypoint"] == ["/bin/sh"] and found["Config"]["Cmd"][-3:] == [
        "--enable-prefix-caching",
        "--uds",
        "/run/tpuctl/vllm.sock",
    ]
    assert "FORWARDED_ALLOW_IPS=*" in found["Config"]["Env"]


def test_a_reconfigure_changes_only_the_vllm_words_and_the_new_process_runs_them(
    stand_in: StandIn, engine: DockerEngineContainer
) -> None:
    before_doc = _inspect(stand_in)
    before = engine.inspect()
    planned = before_doc["Config"]["Cmd"]
    assert before.command == tuple(planned) == before.planned_command and before.overrides == {}
    after = engine.reconfigure({"max_num_seqs": 16, "prefix_caching": False}, timeout_s=5)
    expected = apply_to_argv(planned, {"max_num_seqs": 16, "prefix_caching": False})
    assert after.status == "running" and after.pid not in (None, before.pid)
    assert after.command == tuple(expected) and after.planned_command == tuple(planned)
    assert after.overrides == {"max_num_seqs": 16, "prefix_caching": False} and after.image == "stand-in:1"
    assert _argv_of(stand_in, after.pid) == ["/bin/sh", *expected]  # the new process, as the engine started it
    assert "--no-enable-prefix-caching" in expected and "--enable-prefix-caching" not in expected
    assert expected[expected.index("--max-num-seqs") + 1] == "16"
    after_doc = _inspect(stand_in)
    # everything else as the script made it: image, entrypoint, env, mounts, devices, network, restart policy, shm
    assert after_doc["HostConfig"] == before_doc["HostConfig"]
    assert _without(after_doc["Config"], "Cmd", "Labels", "Hostname") == _without(
        before_doc["Config"], "Cmd", "Labels", "Hostname"
    )
    labels = after_doc["Config"]["Labels"]
    assert _without(labels, PLANNED_CMD_LABEL, OVERRIDES_LABEL) == before_doc["Config"]["Labels"]
    assert labels[OVERRIDES_LABEL] == '{"max_num_seqs": 16, "prefix_caching": false}'


def test_overrides_apply_to_the_planned_argv_and_empty_ones_give_it_back_exactly(
    stand_in: StandIn, engine: DockerEngineContainer
) -> None:
    original = _inspect(stand_in)
    planned = original["Config"]["Cmd"]
    engine.reconfigure({"max_num_seqs": 16}, timeout_s=5)
    second = engine.reconfigure({"block_size": 64}, timeout_s=5)
    assert second.command == tuple(apply_to_argv(planned, {"block_size": 64}))  # not on top of the 16 sequences
    assert second.command[second.command.index("--max-num-seqs") + 1] == "8"
    restored = engine.reconfigure({}, timeout_s=5)
    assert restored.command == tuple(planned) and restored.overrides == {}
    assert _argv_of(stand_in, restored.pid) == ["/bin/sh", *planned]
    back = _inspect(stand_in)
    assert _without(back["Config"], "Hostname") == _without(original["Config"], "Hostname")  # labels included
    assert back["HostConfig"] == original["HostConfig"]
    assert stand_in.server.runtime.names() == ["sleepy", NAME]  # recreated in place: no container left over


def test_the_same_flags_again_recreate_nothing_and_bad_flags_touch_nothing(
    stand_in: StandIn, engine: DockerEngineContainer
) -> None:
    first = engine.reconfigure({"kv_cache_dtype": "fp8"}, timeout_s=5)
    again = engine.reconfigure({"kv_cache_dtype": "fp8"}, timeout_s=5)
    assert (again.pid, again.started_at) == (first.pid, first.started_at)
    planned = engine.inspect()
    for bad in ({"model": "other/model"}, {"max_num_seqs": 0}, {"block_size": "64; rm -rf /"}):
        with pytest.raises(InvalidMessage):
            engine.reconfigure(bad, timeout_s=5)
    assert engine.inspect().pid == planned.pid == first.pid
    assert engine.reconfigure({}, timeout_s=5).pid != first.pid


def test_a_stopped_container_is_recreated_running(stand_in: StandIn, engine: DockerEngineContainer) -> None:
    runtime = stand_in.server.runtime
    assert runtime.stop(NAME, 5.0) is True and runtime.stop(NAME, 5.0) is False  # the engine's 304: not running
    assert engine.inspect().status == "exited"
    state = engine.reconfigure({}, timeout_s=5)  # the planned flags, but not running: recreated and started
    assert state.status == "running" and state.pid is not None


def test_a_broken_tune_label_never_breaks_an_inspect_but_stops_a_reconfigure(stand_in: StandIn, tmp_path: Path) -> None:
    words = script_run_words("stand-in:1", VLLM_ARGV, name="broken", device="/dev/null", hf_cache=tmp_path / "hf")
    words[1:1] = ["--label", f"{PLANNED_CMD_LABEL}=not json", "--label", f'{OVERRIDES_LABEL}={{"model": "x"}}']
    assert docker(stand_in.docker_host, words) == 0
    broken = DockerEngineContainer(stand_in.docker_host, "broken", timeout_s=10)
    try:
        state = broken.inspect()  # what a restart or a tail reads first
        assert state.status == "running" and state.overrides == {} and state.planned_command == state.command
        with pytest.raises(PermanentError, match=r"the label tpuctl\.planned-cmd is not a JSON list"):
            broken.reconfigure({}, timeout_s=5)
        assert broken.inspect().pid == state.pid  # refused before anything was stopped
    finally:
        broken.close()
