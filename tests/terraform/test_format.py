"""``terraform fmt`` without terraform: hclfmt (the HCL v2 formatter behind it) finds no change and no syntax error.

hclfmt is built offline from Debian's HCL sources into ``.tools/hclfmt`` by ``make hclfmt``
(docs/reference/gcp-local.md §7). Without it the test is skipped with that instruction.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.terraform_config import REPO_ROOT, TERRAFORM_ROOT

HCL_FILES = sorted(
    p for p in TERRAFORM_ROOT.rglob("*") if p.suffix in (".tf", ".example") and ".terraform" not in p.parts
)


def _hclfmt() -> Path:
    local = REPO_ROOT / ".tools" / "hclfmt"
    if local.is_file():
        return local
    found = shutil.which("hclfmt")
    if found:
        return Path(found)
    pytest.skip(
        "hclfmt not built: run `make hclfmt` (needs apt packages golang-go and golang-github-hashicorp-hcl-v2-dev)"
    )


@pytest.mark.parametrize("path", HCL_FILES, ids=lambda p: p.relative_to(TERRAFORM_ROOT).as_posix())
def test_terraform_files_are_formatted_and_valid_hcl(path: Path) -> None:
    hclfmt = _hclfmt()
    check = subprocess.run([str(hclfmt), "-check", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0, f"{path}: syntax error\n{check.stderr}"
    unchanged = subprocess.run(
        [str(hclfmt), "-require-no-change", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert unchanged.returncode == 0, f"{path}: not formatted; run `.tools/hclfmt -w {path.relative_to(REPO_ROOT)}`"
