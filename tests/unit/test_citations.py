"""Every document the code cites is in this repository, and every section it names is in that document.

The reference material the code was written against lives in ``docs/reference/`` (copied from the team's
reference folder, which the project never reads). A citation such as ``docs/reference/tpu-api.md §5.4`` must
resolve: the file exists and has a heading numbered 5.4. A document named without its folder
is refused, so a newcomer can always follow a citation.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
NAMES = sorted(path.stem for path in REFERENCE.glob("*.md"))
_BARE = re.compile(r"(?<![\w/.-])(" + "|".join(map(re.escape, NAMES)) + r")\.md")
_CITED = re.compile(r"docs/reference/([\w-]+)\.md`*(?:\s*§\s*([0-9]+(?:\.[0-9]+)*))?")
_CODE_SUFFIXES = (".py", ".tf", ".toml", ".yaml", ".yml", ".sh")


def _code_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [
        ROOT / name
        for name in listed.split()
        if (name.endswith(_CODE_SUFFIXES) or name == "Makefile")
        and not name.startswith("docs/")
        and "/fixtures/" not in name
    ]


def _sections(name: str) -> set[str]:
    headings = re.findall(r"^#+\s+([0-9]+(?:\.[0-9]+)*)", (REFERENCE / f"{name}.md").read_text(), re.MULTILINE)
    return {heading.rstrip(".") for heading in headings}


def test_the_reference_folder_holds_the_documents() -> None:
    assert {"tpu-api", "vllm", "gcp-local", "gcp-twin", "reference-agent", "DESIGN"} <= set(NAMES)


@pytest.mark.parametrize("path", _code_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_citation_resolves_to_a_file_and_section_here(path: Path) -> None:
    text = path.read_text(encoding="utf-8", errors="replace")
    bare = [m.group(0) for m in _BARE.finditer(text)]
    assert not bare, f"{path.name}: cite docs/reference/<name>.md, not {bare[:3]}"
    for match in _CITED.finditer(text):
        name, section = match.group(1), match.group(2)
        assert (REFERENCE / f"{name}.md").is_file(), f"{path.name}: {match.group(0)} names no document here"
        if section is not None:
            known = _sections(name)
            # "§5.4" resolves to heading 5.4; "§11" to heading 11 (sub-numbers like §3.1 of a list item fall back
            # to their numbered parent heading).
            assert section in known or section.split(".")[0] in known, f"{path.name}: {match.group(0)}: no §{section}"
