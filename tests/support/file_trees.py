"""Files under a folder as a dict and back, for tests of what a restore or fill leaves on a disk."""

from __future__ import annotations

from pathlib import Path

__all__ = ["read_tree", "write_tree"]


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    """``files`` (relative path to bytes) written under ``root``; returns ``root``."""
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def read_tree(root: Path, only: tuple[str, ...] | None = None) -> dict[str, bytes]:
    """Every file under ``root`` (or under its top-level folders ``only``), by relative path, in name order."""
    tops = [root / top for top in only] if only is not None else [root]
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for top in tops
        for path in sorted(top.rglob("*"))
        if path.is_file()
    }
