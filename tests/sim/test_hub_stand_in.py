"""The Hugging Face Hub stand-in, over real HTTP and driven by the real ``huggingface_hub`` client.

The VM twin proves a warm boot never reached the Hub by counting the stand-in's downloads, so the stand-in must be
the Hub as a download sees it: listings whose ids match git's and LFS's, resolve headers ``huggingface_hub`` checks,
errors it maps to its exceptions, and a ``snapshot_download`` that yields the very files it serves.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path

import pytest
import requests

from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir
from localcloud.vm_twin.hub_api import HubStandIn, catalog_repos
from shared.domain.catalog.presets import PRESETS
from tests.support.stand_ins import hub_stand_in

REPO = "twin-org/tiny-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONFIG = b'{"architectures": ["TinyForCausalLM"], "hidden_size": 8}\n'
WEIGHTS = bytes(range(256)) * 40


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_bytes(CONFIG)
    (directory / "model.safetensors").write_bytes(WEIGHTS)
    return directory


@pytest.fixture
def hub(model_dir: Path) -> Iterator[HubStandIn]:
    with hub_stand_in({REPO: (model_dir, COMMIT)}) as served:
        yield served


def git_hash_object(data: bytes) -> str:
    """``git hash-object``'s id, computed here independently of the stand-in (by git itself when it is installed)."""
    try:
        done = subprocess.run(["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True)
        return done.stdout.decode().strip()
    except (FileNotFoundError, subprocess.CalledProcessError):
        header = f"blob {len(data)}".encode() + b"\x00"
        return hashlib.sha1(header + data).hexdigest()  # noqa: S324 - git's object id


def test_the_listing_carries_the_commit_and_git_and_lfs_ids(hub: HubStandIn) -> None:
    for revision in (COMMIT, "main"):
        answer = requests.get(f"{hub.base_url}/api/models/{REPO}/revision/{revision}?blobs=true", timeout=5)
        assert answer.status_code == 200
        info = answer.json()
        assert (info["id"], info["modelId"], info["sha"]) == (REPO, REPO, COMMIT)
    siblings = {sibling["rfilename"]: sibling for sibling in info["siblings"]}
    assert set(siblings) == {"config.json", "model.safetensors"}

    config = siblings["config.json"]
    assert (config["blobId"], config["size"]) == (git_hash_object(CONFIG), len(CONFIG))
    assert "lfs" not in config

    weights = siblings["model.safetensors"]
    sha256 = hashlib.sha256(WEIGHTS).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(WEIGHTS)}\n".encode()
    assert weights["lfs"] == {"sha256": sha256, "size": len(WEIGHTS), "pointerSize": len(pointer)}
    assert weights["blobId"] == git_hash_object(pointer)
    assert weights["size"] == len(WEIGHTS)


def test_resolve_serves_the_bytes_with_the_hub_headers(hub: HubStandIn) -> None:
    url = f"{hub.base_url}/{REPO}/resolve/{COMMIT}"
    weights = requests.get(f"{url}/model.safetensors", timeout=5)
    assert weights.status_code == 200
    assert weights.content == WEIGHTS
    sha256 = hashlib.sha256(WEIGHTS).hexdigest()
    assert weights.headers["X-Repo-Commit"] == COMMIT
    assert weights.headers["ETag"] == f'"{sha256}"'
    assert weights.headers["X-Linked-Etag"] == f'"{sha256}"'
    assert weights.headers["X-Linked-Size"] == str(len(WEIGHTS))
    assert weights.headers["Content-Length"] == str(len(WEIGHTS))

    config = requests.head(f"{hub.base_url}/{REPO}/resolve/main/config.json", timeout=5)
    assert config.status_code == 200
    assert config.headers["ETag"] == f'"{git_hash_object(CONFIG)}"'
    assert config.headers["Content-Length"] == str(len(CONFIG))
    assert "X-Linked-Etag" not in config.headers

    resumed = requests.get(f"{url}/model.safetensors", headers={"Range": "bytes=100-"}, timeout=5)
    assert (resumed.status_code, resumed.content) == (206, WEIGHTS[100:])


def test_unknown_repos_revisions_and_files_are_404_with_the_hub_error_codes(hub: HubStandIn) -> None:
    cases = {
        f"/api/models/nobody/nothing/revision/{COMMIT}": "RepoNotFound",
        f"/api/models/{REPO}/revision/{'f' * 40}": "RevisionNotFound",
        f"/{REPO}/resolve/{COMMIT}/missing.json": "EntryNotFound",
        "/nobody/nothing/resolve/main/config.json": "RepoNotFound",
        f"/{REPO}/resolve/v9/config.json": "RevisionNotFound",
    }
    for path, code in cases.items():
        answer = requests.get(f"{hub.base_url}{path}", timeout=5)
        assert (answer.status_code, answer.headers.get("X-Error-Code")) == (404, code), path
    assert requests.get(f"{hub.base_url}/api/models/nobody/nothing", timeout=5).json() == {
        "error": "Repository not found"
    }
    for bad in ("a//config.json", "sub/../config.json", "%2E%2E/model/config.json"):
        connection = HTTPConnection("127.0.0.1", hub.port, timeout=5)  # sent as written: requests drops '..'
        try:
            connection.request("GET", f"/{REPO}/resolve/main/{bad}")
            assert connection.getresponse().status == 400, bad
        finally:
            connection.close()


def test_downloads_count_gets_of_files_only(hub: HubStandIn) -> None:
    base = f"{hub.base_url}/{REPO}/resolve/{COMMIT}"
    requests.head(f"{base}/model.safetensors", timeout=5)
    requests.get(f"{hub.base_url}/api/models/{REPO}/revision/main", timeout=5)
    requests.get(f"{base}/missing.json", timeout=5)
    assert sum(hub.downloads.values()) == 0
    requests.get(f"{base}/model.safetensors", timeout=5)
    requests.get(f"{base}/model.safetensors", timeout=5)
    requests.get(f"{base}/config.json", timeout=5)
    assert hub.downloads == {(REPO, "model.safetensors"): 2, (REPO, "config.json"): 1}


def test_catalog_repos_serve_every_hub_preset_at_the_commit_the_twin_cache_uses(model_dir: Path) -> None:
    repos = catalog_repos(model_dir)
    with_hub_ids = [preset for preset in PRESETS.values() if "/" in preset.hub_id]
    assert set(repos) == {preset.hub_id for preset in with_hub_ids}
    for preset in with_hub_ids:
        commit = preset.revision or hashlib.sha1(preset.hub_id.encode()).hexdigest()  # noqa: S324 - a name
        assert repos[preset.hub_id] == (model_dir, commit)
    assert HubStandIn.catalog_repos(model_dir) == repos


_SNAPSHOT = "import sys, huggingface_hub; print(huggingface_hub.snapshot_download(sys.argv[1], revision=sys.argv[2], \
cache_dir=sys.argv[3], endpoint=sys.argv[4]))"


def test_the_real_huggingface_hub_snapshot_download_gets_every_file(
    hub: HubStandIn, model_dir: Path, tmp_path: Path
) -> None:
    """The real client, from the vLLM-on-CPU venv (the twin image's Python, which carries huggingface_hub)."""
    tier = VllmCpuTier(default_cache_dir())
    if tier.unavailable_reason():
        pytest.skip(f"needs the vLLM-on-CPU venv for huggingface_hub: {tier.unavailable_reason()}")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "HF_HUB_DISABLE_TELEMETRY": "1"}
    for revision in (COMMIT, "main"):
        cache = tmp_path / f"cache-{revision}"
        done = subprocess.run(
            [str(tier.python), "-c", _SNAPSHOT, REPO, revision, str(cache), hub.base_url],
            env=env, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        folder = Path(done.stdout.strip().splitlines()[-1])
        assert folder.name == COMMIT and folder.is_relative_to(cache)
        assert sorted(path.name for path in folder.iterdir()) == ["config.json", "model.safetensors"]
        for source in model_dir.iterdir():
            assert (folder / source.name).read_bytes() == source.read_bytes()
    assert hub.downloads == {(REPO, "config.json"): 2, (REPO, "model.safetensors"): 2}
