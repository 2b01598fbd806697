"""The node-agent bundle for the VM twin: built as ``make package`` builds it, uploaded as Terraform uploads it.

Why: on Google Cloud, ``make package`` builds ``tpuctl-node-agent-<version>.tar.gz`` (our wheel and its
dependencies' wheels for the image's Python), Terraform uploads it under ``node-agent/`` and gives the functions
its ``gs://`` URI and SHA-256, and every VM's startup script fetches, checks and installs it. The local cloud
does the same with ``scripts/package_node_agent.py all`` for the twin image's Python (the vLLM-on-CPU venv's:
this machine's version and architecture) and the Cloud Storage stand-in, so the twin's node agent comes from the
bundle as on a TPU VM. The third-party wheels are downloaded once (``make setup-local``) and cached.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from localcloud.vllm_cpu import REPO_ROOT
from localcloud.vm_twin.google_apis import GoogleApis

__all__ = ["PublishedBundle", "build_node_agent", "bundle_dir", "local_platforms", "publish_node_agent"]

PACKAGER = REPO_ROOT / "scripts" / "package_node_agent.py"
TWIN_PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"  # the vLLM venv's is the same (3.11)


@dataclass(frozen=True)
class PublishedBundle:
    uri: str
    sha256: str


def local_platforms() -> list[str]:
    """Wheel platform tags this machine's Python installs (glibc Linux)."""
    machine = platform.machine()
    return [f"manylinux_2_28_{machine}", f"manylinux_2_17_{machine}", f"manylinux2014_{machine}"]


def bundle_dir(cache_dir: Path) -> Path:
    return cache_dir / f"node-agent-py{TWIN_PYTHON_VERSION}"


def publish_node_agent(apis: GoogleApis, cache_dir: Path, bucket: str) -> PublishedBundle:
    """Build the bundle (third-party wheels from the cache, or downloaded once) and put it in ``bucket``.

    Raises:
        RuntimeError: the build failed; the message has the packager's own words (e.g. no index reachable).
    """
    built = build_node_agent(cache_dir)
    path = Path(str(built["bundle"]))
    uri = apis.put_object(bucket, f"node-agent/{built['sha256']}-{path.name}", path.read_bytes())
    return PublishedBundle(uri=uri, sha256=str(built["sha256"]))


def build_node_agent(cache_dir: Path) -> dict[str, object]:
    """Build the twin's bundle into the cache (what ``make setup-local`` runs, so later starts need no index)."""
    argv = [sys.executable, str(PACKAGER), "all", "--python-version", TWIN_PYTHON_VERSION]
    argv += [word for tag in local_platforms() for word in ("--platform", tag)]
    argv += ["--out", str(bundle_dir(cache_dir))]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False, cwd=REPO_ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"node-agent bundle: {(result.stderr or result.stdout).strip()[-800:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    print(json.dumps(build_node_agent(Path(sys.argv[1]))))
