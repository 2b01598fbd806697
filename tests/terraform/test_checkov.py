"""checkov over terraform/, offline, with zero failed checks and a written reason for every skip.

checkov lives in its own cached venv (it pins packaging, cachetools and boto3 against ours):
``make checkov-env`` builds it under ``${XDG_CACHE_HOME:-~/.cache}/tpuctl/``. Without that venv
the test is skipped with that instruction. ``--skip-download`` keeps it from calling home.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.support.cached_venv import CHECKOV_REQUIREMENTS, is_complete, venv_bin, venv_dir
from tests.support.terraform_config import REPO_ROOT, TERRAFORM_ROOT

MIN_REASON_CHARS = 20


@pytest.fixture(scope="module")
def checkov_report() -> dict[str, Any]:
    venv = venv_dir("checkov", CHECKOV_REQUIREMENTS)
    if not is_complete(venv):
        pytest.skip(
            f"checkov venv missing at {venv}: run `make checkov-env` (builds it from {CHECKOV_REQUIREMENTS.name})"
        )
    result = subprocess.run(
        [
            str(venv_bin(venv, "checkov")),
            "--directory",
            str(TERRAFORM_ROOT),
            "--framework",
            "terraform",
            "--skip-download",
            "--compact",
            "--output",
            "json",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode in (0, 1), f"checkov crashed (exit {result.returncode}): {result.stderr[-2000:]}"
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    [terraform] = [r for r in reports if r.get("check_type") == "terraform"]
    return dict(terraform)


def test_checkov_finds_no_failed_check(checkov_report: dict[str, Any]) -> None:
    summary = checkov_report["summary"]
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}:{c['file_line_range'][0]}): {c['check_name']}"
        for c in checkov_report["results"]["failed_checks"]
    ]
    assert summary["failed"] == 0, "\n".join(failed)
    assert summary["parsing_errors"] == 0
    assert summary["passed"] > 50 and summary["resource_count"] > 50, f"checkov scanned too little: {summary}"


def test_every_skipped_check_has_a_written_reason(checkov_report: dict[str, Any]) -> None:
    for check in checkov_report["results"]["skipped_checks"]:
        reason = (check.get("check_result") or {}).get("suppress_comment") or ""
        assert len(reason.strip()) >= MIN_REASON_CHARS, (
            f"{check['check_id']} on {check['resource']} is skipped without a reason: "
            "write #checkov:skip=ID:<why this is acceptable> inside the resource"
        )
