"""The Gemini CLI extension (``integrations/gemini-extension``) installs into the real Gemini CLI, its MCP server
connects, and the model is offered every tool of the toolset with the extension's context.

The CLI (npm, pinned by ``tests/support/gemini_cli/package-lock.json``) is installed by ``make gemini-cli`` in the
cache outside the clone. It runs headless with its own HOME; its model calls go to a local stand-in of the Gemini
API that keeps what the CLI sent (``tests/support/gemini_api_standin.py``), so no account and no network are needed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.mcp.test_tool_contract import EXPECTED
from tests.support.gemini_api_standin import GeminiApiStandIn

REPO_ROOT = Path(__file__).resolve().parents[2]
EXTENSION = REPO_ROOT / "integrations" / "gemini-extension"
LOCK = REPO_ROOT / "tests" / "support" / "gemini_cli" / "package-lock.json"
READ_ONLY = {name for name, (read_only, *_) in EXPECTED.items() if read_only}
TOOL_PREFIX = "mcp_tpuctl_"
# An API key (the stand-in's), and nothing that calls out: no usage statistics, telemetry or update checks.
_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


def _gemini_cli() -> Path:
    cache = Path(
        os.environ.get("TPUCTL_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tpuctl"
    )
    return (
        cache / f"gemini-cli-{hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]}" / "node_modules" / ".bin" / "gemini"
    )


@dataclass
class Cli:
    """The real Gemini CLI with its own HOME, a trusted workspace and the stand-in model API."""

    binary: Path
    home: Path
    workspace: Path
    api: GeminiApiStandIn

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        base = {
            "HOME": str(self.home),
            "PATH": os.pathsep.join(
                [
                    str(Path(sys.executable).parent),
                    str(Path(shutil.which("node") or "/usr/bin/node").parent),
                    "/usr/bin",
                    "/bin",
                ]
            ),
            "GEMINI_API_KEY": "standin-key",
            "GOOGLE_GEMINI_BASE_URL": self.api.base_url,
            "NO_COLOR": "1",
            "TPUCTL_DATA_DIR": str(self.home / "var"),
        }
        return subprocess.run(
            [str(self.binary), *args],
            cwd=self.workspace,
            env=base | env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    binary = _gemini_cli()
    if not binary.exists():
        pytest.skip(f"the Gemini CLI is not installed at {binary}: run `make gemini-cli` (needs npm)")
    home = tmp_path_factory.mktemp("gemini-home")
    workspace = tmp_path_factory.mktemp("workspace")
    settings = home / ".gemini"
    settings.mkdir()
    (settings / "settings.json").write_text(json.dumps(_SETTINGS))
    (settings / "trustedFolders.json").write_text(
        json.dumps({str(EXTENSION): "TRUST_FOLDER", str(workspace): "TRUST_FOLDER"})
    )
    api = GeminiApiStandIn()
    found = Cli(binary, home, workspace, api)
    installed = found.run("extensions", "install", str(EXTENSION), "--consent", "--skip-settings")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    try:
        yield found
    finally:
        api.close()


def test_the_extension_installs_with_its_context_skill_and_server(cli: Cli) -> None:
    listed = cli.run("extensions", "list")
    out = listed.stdout + listed.stderr
    assert "tpuctl (0.1.0)" in out, out
    assert str(cli.home / ".gemini" / "extensions" / "tpuctl" / "GEMINI.md") in out
    assert re.search(r"MCP servers:\s+tpuctl", out), out
    installed = cli.home / ".gemini" / "extensions" / "tpuctl"
    assert (installed / "skills" / "tpuctl" / "SKILL.md").read_text() == (
        EXTENSION / "skills" / "tpuctl" / "SKILL.md"
    ).read_text()


def test_the_server_connects(cli: Cli) -> None:
    listed = cli.run("mcp", "list")
    assert re.search(r"tpuctl \(from tpuctl\): tpuctl mcp \(stdio\) - Connected", listed.stdout + listed.stderr), (
        listed.stdout + listed.stderr
    )


def _one_turn(cli: Cli, **env: str) -> dict[str, dict[str, object]]:
    """One headless prompt; the tpuctl function declarations the model was offered. A named model skips the CLI's
    router, whose classifier wants JSON the stand-in does not give."""
    cli.api.requests.clear()
    turn = cli.run(
        "-p",
        "Which TPU deployments do I have?",
        "--model",
        "gemini-2.5-flash",
        "--approval-mode",
        "yolo",
        "--output-format",
        "json",
        **env,
    )
    assert turn.returncode == 0, turn.stdout + turn.stderr
    return {
        name.removeprefix(TOOL_PREFIX): decl
        for name, decl in cli.api.declared_functions().items()
        if name.startswith(TOOL_PREFIX)
    }


def test_the_model_is_offered_every_tool_with_the_extension_context(cli: Cli) -> None:
    declared = _one_turn(cli)
    assert set(declared) == set(EXPECTED)
    sent = json.dumps([body for _, body in cli.api.requests])
    assert "# tpuctl: Gemma 4 on Cloud TPU v6e with vLLM" in sent, "the extension's GEMINI.md did not reach the model"
    assert "tpuctl serves Gemma 4 on Cloud TPU with vLLM." in sent, "the server's instructions did not reach the model"
    assert (cli.home / "var").is_dir(), "TPUCTL_DATA_DIR (a declared setting) did not reach the server"


def test_the_toolset_setting_reaches_the_server(cli: Cli) -> None:
    assert set(_one_turn(cli, TPUCTL_TOOLSET="read-only")) == READ_ONLY


_PUBLISHED = re.compile(r"all (\d+) tools: ([\d,]+) characters of function declarations, about ([\d,]+) tokens")


def test_the_tool_list_size_in_the_docs_is_what_the_model_receives(cli: Cli) -> None:
    declared = _one_turn(cli)
    size = len(json.dumps(list(declared.values())))
    found = _PUBLISHED.search(" ".join((REPO_ROOT / "docs" / "gateway.md").read_text().split()))
    assert found, "docs/gateway.md no longer publishes the tool list's size"
    count, chars, tokens = (int(group.replace(",", "")) for group in found.groups())
    assert count == len(declared)
    assert abs(chars - size) <= 0.05 * size, (
        f"docs say {chars} characters, the model receives {size}: update docs/gateway.md"
    )
    assert tokens == round(chars / 4, -2)
    assert size / 4 < 3_000, f"the tool list is about {size / 4:.0f} tokens, over issue #23's 3,000"
