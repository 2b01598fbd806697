"""``SecretManagerStore.put`` under least privilege: a writer that may add versions but not create secrets.

Terraform makes every secret and grants writers ``roles/secretmanager.secretVersionAdder`` on it alone, so the
create that ``put`` tries first is refused; the version must still be added. A stateful fake of the Secret Manager
client that checks the two permissions separately, as the service does.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from google.api_core import exceptions as gexc

from shared.adapters.secret_manager import SecretManagerStore
from shared.domain.errors import PermanentError

PROJECT = "p"


class LeastPrivilegeSecretManager:
    """Secrets and their versions; creating needs ``may_create``, adding needs the secret in ``adders``."""

    def __init__(self, *, may_create: bool, adders: set[str]) -> None:
        self.may_create = may_create
        self.adders = adders
        self.versions: dict[str, list[bytes]] = {}

    def create_secret(self, request: dict[str, Any]) -> None:
        if not self.may_create:
            raise gexc.PermissionDenied("secretmanager.secrets.create denied")
        if request["secret_id"] in self.versions:
            raise gexc.AlreadyExists("exists")
        self.versions[request["secret_id"]] = []

    def add_secret_version(self, request: dict[str, Any]) -> Any:
        name = request["parent"].rsplit("/", 1)[-1]
        if name not in self.adders:
            raise gexc.PermissionDenied("secretmanager.versions.add denied")
        if name not in self.versions:
            raise gexc.NotFound("no such secret")
        self.versions[name].append(request["payload"]["data"])
        return SimpleNamespace(name=f"{request['parent']}/versions/{len(self.versions[name])}")


def test_a_version_is_added_to_a_secret_terraform_made_without_the_right_to_create() -> None:
    api = LeastPrivilegeSecretManager(may_create=False, adders={"tpuctl-event-key"})
    api.versions["tpuctl-event-key"] = []  # made by terraform apply
    store = SecretManagerStore(PROJECT, client=api)
    value = "k" * 64
    assert store.put("tpuctl-event-key", value).endswith("/versions/1")
    assert api.versions["tpuctl-event-key"] == [value.encode()]


@pytest.mark.parametrize("exists", [True, False])
def test_a_secret_this_identity_cannot_write_names_the_grant_and_writes_nothing(exists: bool) -> None:
    api = LeastPrivilegeSecretManager(may_create=False, adders=set())
    if exists:
        api.versions["tpuctl-event-key"] = []
    store = SecretManagerStore(PROJECT, client=api)
    with pytest.raises(PermanentError, match="secretVersionAdder") as refused:
        store.put("tpuctl-event-key", "v" * 64)
    assert "v" * 64 not in str(refused.value)
    assert api.versions.get("tpuctl-event-key", []) == []
