"""The embedded SecretStore: one file per secret, 0600 in a 0700 folder, versions kept as files."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from shared.domain.errors import InvalidMessage
from shared.logging import register_secret

__all__ = ["FileSecretStore"]

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,254}$")


class FileSecretStore:
    """Secrets on local disk for the embedded stack. Every value read or written is registered for log redaction."""

    def __init__(self, directory: str | Path) -> None:
        self._dir = Path(directory)
        self._lock = threading.Lock()

    def get(self, name: str) -> str | None:
        folder = self._folder(name)
        versions = sorted(folder.glob("v*"), key=lambda p: int(p.name[1:])) if folder.exists() else []
        if not versions:
            return None
        value = versions[-1].read_text(encoding="utf-8")
        register_secret(value)
        return value

    def put(self, name: str, value: str) -> str:
        if not value:
            raise InvalidMessage("value", "is empty", "give the secret's value")
        register_secret(value)
        with self._lock:
            folder = self._folder(name)
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self._dir, 0o700)
            os.chmod(folder, 0o700)
            number = 1 + max((int(p.name[1:]) for p in folder.glob("v*")), default=0)
            path = folder / f"v{number}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(value)
        return f"secrets/{name}/versions/{number}"

    def _folder(self, name: str) -> Path:
        if not _NAME.match(name):
            raise InvalidMessage("name", f"{name!r} is not a valid secret name", "use letters, digits, '-' or '_'")
        return self._dir / name
