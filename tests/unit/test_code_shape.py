"""The limits docs/architecture.md states: no module over 800 lines, no function over 80, no import cycle.

Counted by ``scripts/code_shape.py`` over the non-test code of every package; a failure names the offenders.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _code_shape() -> ModuleType:
    spec = importlib.util.spec_from_file_location("code_shape", ROOT / "scripts" / "code_shape.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("code_shape", module)
    spec.loader.exec_module(module)
    return module


def test_no_module_over_800_lines_no_function_over_80_and_no_import_cycle() -> None:
    shape = _code_shape().measure(ROOT)
    assert len(shape.modules) > 100, "the count reads the packages"
    assert shape.long_modules() == {}, "split these modules along their seams"
    assert shape.long_functions() == {}, "split these functions along their seams (tables are not functions)"
    assert shape.cycles == [], "break these import cycles"


def test_the_counter_sees_a_long_function_and_a_cycle(tmp_path: Path) -> None:
    code_shape = _code_shape()
    package = tmp_path / "shared"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from shared import b\n\n\ndef long():\n" + "    x = 1\n" * 90)
    (package / "b.py").write_text("from shared import a\n")
    shape = code_shape.measure(tmp_path, cycles=False)
    assert shape.long_functions() == {"shared/a.py:long": 91}
    assert code_shape._strongly_connected(["a", "b", "c"], {"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [("a", "b")]
