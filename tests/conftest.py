"""Test-wide setup: every ``tests/support/fixtures_*.py`` module is loaded as a pytest plugin."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = sorted(
    f"tests.support.{path.stem}" for path in (Path(__file__).parent / "support").glob("fixtures_*.py")
)
