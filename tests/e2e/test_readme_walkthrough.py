"""The README's "Your first hour" walkthrough, run as written against the local cloud with a real vLLM.

The commands come from the README itself (between the ``first-hour`` markers), so the README cannot drift from
what ``tpuctl`` does: plan, deploy and wait for SERVING, status, query, benchmark, show, plot, compare, metrics,
logs, an in-place update and the teardown. Each must exit 0 and say what a person would look for; no secret may
appear in anything printed. Skipped, with the reason, when the vLLM CPU tier is not built here.
"""

from __future__ import annotations

import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcloud.demo import DemoSpec, LocalDemo
from localcloud.runner import LocalCloud, LocalCloudOptions
from localcloud.vllm_cpu import VllmCpuTier, default_cache_dir
from mcp_client_gateway.cli import EXIT_OK, run
from mcp_client_gateway.composition import build_ports
from mcp_client_gateway.core import GatewayCore, GatewayPorts
from shared.domain.models import Phase

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

README = Path(__file__).resolve().parents[2] / "README.md"
DEPLOYMENT = "first"


def walkthrough() -> list[list[str]]:
    """The ``tpuctl`` commands of the README's first-hour block, as argv lists (comments dropped)."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- first-hour:begin -->\s*```sh\n(.*?)```\s*<!-- first-hour:end -->", text, re.S)
    assert block, "README.md lost its first-hour block"
    commands = [shlex.split(line, comments=True) for line in block.group(1).splitlines() if line.strip()]
    assert all(argv[0] == "tpuctl" for argv in commands), "every line of the walkthrough is a tpuctl command"
    return [argv[1:] for argv in commands]


def test_the_walkthrough_names_the_day_one_loop() -> None:
    verbs = [" ".join(argv[:2]) if argv[0] == "bench" else argv[0] for argv in walkthrough()]
    for verb in ("plan", "deploy", "status", "query", "bench run", "bench compare", "metrics", "logs", "delete"):
        assert verb in verbs, f"the first hour should show {verb}"
    assert verbs[-1] == "delete", "it ends with the teardown"


@pytest.fixture(scope="module")
def tier() -> VllmCpuTier:
    found = VllmCpuTier(default_cache_dir())
    reason = found.unavailable_reason()
    if reason:
        pytest.skip(f"the walkthrough needs the vLLM CPU tier: {reason}")
    return found


@pytest.fixture
def stack(tier: VllmCpuTier, tmp_path: Path) -> Iterator[tuple[LocalCloud, GatewayPorts]]:
    cloud = LocalCloud(LocalCloudOptions(data_dir=tmp_path / "cloud", cache_dir=tier.cache_dir, time_scale=60.0))
    try:
        cloud.start()
        ports = build_ports(cloud.settings)
        LocalDemo(cloud, GatewayCore(ports), DemoSpec(deployment_id=DEPLOYMENT)).save_canary_token()
        yield cloud, ports
    finally:
        report = cloud.stop()
    assert report.survivors == (), f"process groups alive after stop: {report.survivors}"


@pytest.mark.timeout(900)
def test_the_first_hour_runs_as_the_readme_says(
    stack: tuple[LocalCloud, GatewayPorts], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud, ports = stack
    monkeypatch.chdir(tmp_path)  # bench plot writes where a person runs it
    printed: dict[str, str] = {}
    for argv in walkthrough():
        stdout, stderr = io.StringIO(), io.StringIO()
        code = run(argv, ports=ports, stdout=stdout, stderr=stderr)
        shown = stdout.getvalue() + stderr.getvalue()
        assert code == EXIT_OK, f"tpuctl {shlex.join(argv)} exited {code}:\n{shown[-3000:]}"
        printed[" ".join(argv[:2]) if argv[0] == "bench" else argv[0]] = shown

    assert "search scope" in printed["plan"] and "x60" in printed["plan"], "the plan shows scope and the fast clock"
    assert "SERVING" in printed["deploy"] or "serving" in printed["deploy"].lower()
    assert printed["query"].strip() and "TTFT" in printed["query"]
    assert "Knee" in printed["bench show"] and "out tok/s" in printed["bench show"]
    assert list((tmp_path / "bench-plots").glob("benchmark-*.html")), "bench plot wrote a page"
    assert DEPLOYMENT in printed["bench compare"]
    assert "in place" in printed["update"].lower() or "kept" in printed["update"]
    record = cloud.store.get_deployment(DEPLOYMENT)
    assert record is not None and record.status.phase is Phase.DELETED and record.generation == 1

    api_key = cloud.secrets.get(cloud.settings.vllm_api_key_secret) or ""
    assert api_key and all(api_key not in text for text in printed.values()), "no secret in anything printed"
