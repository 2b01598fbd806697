"""``DirectoryBundles``: the ``DebugBundles`` store of the embedded default, one file per bundle under a directory.

Why: the embedded default has no bucket, and a bundle is read by a person as often as by the gateway, so it is
kept as the plain file ``root/<name>`` (``root/debug-bundles/<deployment>/<bundle id>.json``) whose path is its
location. The store keeps Cloud Storage's promises: a name is written once (the bytes go to a temporary file in
the same directory, which is then hard-linked to the name, so a reader never sees half a bundle and a second write
of the name fails instead of replacing the first), and only ``bundle_object_name`` names are taken, so no name
can reach outside ``root``.

Errors are classified ``CloudError``s naming the path and the fix: ``INVALID`` for a name of any other shape or a
bundle over ``MAX_BUNDLE_BYTES`` (nothing written), ``ALREADY_EXISTS`` for a second write, ``NOT_FOUND`` for a name
with no file, ``PERMISSION`` when the process may not read or write the directory, ``TRANSIENT`` for other I/O
failures (a full disk).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from shared.domain.debug_bundle import BUNDLE_PREFIX, MAX_BUNDLE_BYTES, is_bundle_of
from shared.domain.errors import CloudError, ErrorClass

__all__ = ["DirectoryBundles"]


class DirectoryBundles:
    """Debug bundles as files under ``root`` (made on the first write)."""

    def __init__(self, root: Path) -> None:
        self._root = Path(root).absolute()

    def put(self, name: str, data: bytes) -> str:
        path = self._path(name)
        if len(data) > MAX_BUNDLE_BYTES:
            raise CloudError(
                ErrorClass.INVALID,
                f"debug bundle {path} is {len(data)} bytes, over {MAX_BUNDLE_BYTES}: not stored "
                "(keep fewer log lines or stacks)",
            )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_once(path, data)
        except FileExistsError:
            raise CloudError(
                ErrorClass.ALREADY_EXISTS,
                f"debug bundle {path} already exists: a bundle is written once (use a new id)",
            ) from None
        except OSError as exc:
            raise _io_error("write", path, exc) from exc
        return str(path)

    def get(self, name: str) -> bytes:
        path = self._path(name)
        try:
            with path.open("rb") as file:
                data = file.read(MAX_BUNDLE_BYTES + 1)
        except FileNotFoundError:
            raise CloudError(ErrorClass.NOT_FOUND, f"no debug bundle {path}") from None
        except OSError as exc:
            raise _io_error("read", path, exc) from exc
        if len(data) > MAX_BUNDLE_BYTES:
            raise CloudError(
                ErrorClass.INVALID, f"debug bundle {path} is over {MAX_BUNDLE_BYTES} bytes: not read (delete it)"
            )
        return data

    def location(self, name: str) -> str:
        return str(self._path(name))

    def _path(self, name: str) -> Path:
        """``root/<name>`` for a ``bundle_object_name``-shaped name; INVALID for anything else."""
        parts = name.split("/")
        if len(parts) != 3 or parts[0] != BUNDLE_PREFIX or not is_bundle_of(name, parts[1], parts[2][: -len(".json")]):
            raise CloudError(
                ErrorClass.INVALID,
                f"{name!r} is not a debug bundle name (debug-bundles/<deployment>/<bundle id>.json from "
                "bundle_object_name): not taken",
            )
        return self._root.joinpath(*parts)


def _write_once(path: Path, data: bytes) -> None:
    """Write a temporary file beside ``path`` and link it in; FileExistsError when ``path`` is there already."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".partial-", suffix=".json")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.link(temporary, path)
    finally:
        os.unlink(temporary)


def _io_error(verb: str, path: Path, exc: OSError) -> CloudError:
    if isinstance(exc, PermissionError):
        return CloudError(
            ErrorClass.PERMISSION, f"cannot {verb} debug bundle {path}: {exc.strerror} (let this process use it)"
        )
    return CloudError(ErrorClass.TRANSIENT, f"cannot {verb} debug bundle {path}: {exc.strerror} (retry later)")
