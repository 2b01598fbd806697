"""One contract for both ``DebugBundles`` stores: ``CloudStorageBundles`` against the VM twin's Cloud Storage
stand-in served over HTTP, and ``DirectoryBundles`` on a temporary directory.

Cloud Storage is used as it is on Google Cloud: the node agent writes with its VM's token (from the twin's token
issuer, as its metadata server hands them out) to the token-requiring stand-in, and the gateway reads anonymously
from the controller-side instance (``require_token=False``); both serve the same ``buckets/<B>/<O>`` files, which
the tests read directly to see what was stored and where.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path

import pytest
import requests
from google.oauth2.credentials import Credentials as TokenCredentials

from localcloud.vm_twin.google_apis import MAX_UPLOAD_BYTES, GoogleApis
from localcloud.vm_twin.metadata_server import TokenIssuer, VmIdentity
from shared.adapters.cloud_storage_bundles import CloudStorageBundles
from shared.adapters.directory_bundles import DirectoryBundles
from shared.adapters.file_secrets import FileSecretStore
from shared.domain.debug_bundle import MAX_BUNDLE_BYTES, bundle_object_name
from shared.domain.errors import CloudError, ErrorClass, PermanentError
from shared.ports import DebugBundles

PROJECT = "tpuctl-twin"
BUCKET = "tpuctl-twin-debug-bundles"
VM = VmIdentity(PROJECT, 412345678901, "us-east5-b", "gemma-a-1", 4242, "vm@tpuctl-twin.iam.gserviceaccount.com")
NAME = bundle_object_name("gemma-a", "restart-7f3a")
BUNDLE = json.dumps({"version": 1, "stacks": 'Thread 0x7f (most recent call first):\n  File "é.py"'}).encode()
ESCAPES = ["debug-bundles/../../escape.json", "../escape.json", "/tmp/escape.json", "debug-bundles/gemma-a/../x.json"]


@dataclass
class Twin:
    """The VM side (tokens required) and the controller side (anonymous) of one installation's stand-in."""

    vm_side: GoogleApis
    controller: GoogleApis
    storage: Path

    def uploads(self) -> int:
        return sum(1 for method, path in self.vm_side.calls + self.controller.calls if path.startswith("/upload/"))


@dataclass
class Store:
    """A store under test: who writes, who reads, where its bytes land, and the location form it promises."""

    writer: DebugBundles
    reader: DebugBundles
    root: Path
    expected_location: Callable[[str], str]
    uploads: Callable[[], int]  # writes that reached a server (none for a directory)


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[Twin]:
    tokens = TokenIssuer()
    secrets = FileSecretStore(tmp_path / "secrets")
    storage = tmp_path / "storage"
    (storage / BUCKET).mkdir(parents=True)  # what terraform apply makes
    vm_side = GoogleApis(PROJECT, secrets, storage, tokens)
    controller = GoogleApis(PROJECT, secrets, storage, tokens, require_token=False)
    vm_side.start()
    controller.start()
    try:
        yield Twin(vm_side, controller, storage)
    finally:
        vm_side.stop()
        controller.stop()


@pytest.fixture(params=["cloud_storage", "directory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "directory":
        root = tmp_path / "bundles"
        bundles = DirectoryBundles(root)
        yield Store(bundles, bundles, root, lambda name: str(root / name), lambda: 0)
        return
    served: Twin = request.getfixturevalue("twin")
    credentials = TokenCredentials(served.vm_side.tokens.issue(VM))
    writer = CloudStorageBundles(BUCKET, endpoint=served.vm_side.base_url, credentials=credentials)
    reader = CloudStorageBundles(BUCKET, endpoint=served.controller.base_url)
    try:
        yield Store(writer, reader, served.storage / BUCKET, lambda name: f"gs://{BUCKET}/{name}", served.uploads)
    finally:
        writer.close()
        reader.close()


def stored_files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file()) if root.exists() else []


# ------------------------------------------------------------------ the contract, for both stores


def test_a_bundle_put_is_read_back_whole_from_the_location_put_returned(store: Store) -> None:
    location = store.writer.put(NAME, BUNDLE)
    assert location == store.expected_location(NAME) == store.writer.location(NAME) == store.reader.location(NAME)
    assert store.reader.get(NAME) == BUNDLE
    assert (store.root / NAME).read_bytes() == BUNDLE, "stored as the named file under the store's root"
    assert stored_files(store.root) == [store.root / NAME], "no temporary file is left behind"


def test_a_name_is_written_once_and_the_first_bytes_stay(store: Store) -> None:
    store.writer.put(NAME, BUNDLE)
    with pytest.raises(CloudError) as again:
        store.writer.put(NAME, b'{"version": 1, "stacks": "forged"}')
    assert again.value.error_class is ErrorClass.ALREADY_EXISTS
    assert isinstance(again.value, PermanentError), "a second write is never retried"
    assert "already exists" in str(again.value) and NAME in str(again.value)
    assert store.reader.get(NAME) == BUNDLE
    assert stored_files(store.root) == [store.root / NAME]


def test_a_name_with_no_bundle_is_not_found(store: Store) -> None:
    store.writer.put(NAME, BUNDLE)
    missing = bundle_object_name("gemma-a", "restart-0000")
    with pytest.raises(CloudError) as gone:
        store.reader.get(missing)
    assert gone.value.error_class is ErrorClass.NOT_FOUND and missing in str(gone.value)


def test_an_oversized_bundle_is_refused_before_anything_is_written(store: Store) -> None:
    with pytest.raises(CloudError) as big:
        store.writer.put(NAME, b"x" * (MAX_BUNDLE_BYTES + 1))
    assert big.value.error_class is ErrorClass.INVALID and str(MAX_BUNDLE_BYTES) in str(big.value)
    assert stored_files(store.root) == [] and store.uploads() == 0
    store.writer.put(NAME, BUNDLE)  # the name was not taken by the refused write
    assert store.reader.get(NAME) == BUNDLE


def test_a_bundle_larger_than_the_bound_is_not_read(store: Store) -> None:
    (store.root / NAME).parent.mkdir(parents=True)
    (store.root / NAME).write_bytes(b"y" * (MAX_BUNDLE_BYTES + 1))  # written around the store (the VM's own token)
    with pytest.raises(CloudError) as big:
        store.reader.get(NAME)
    assert big.value.error_class is ErrorClass.INVALID


@pytest.mark.parametrize("name", ESCAPES)
def test_a_name_that_climbs_is_refused_and_nothing_lands_outside_the_root(
    store: Store, tmp_path: Path, name: str
) -> None:
    with pytest.raises(CloudError) as refused:
        store.writer.put(name, BUNDLE)
    assert refused.value.error_class is ErrorClass.INVALID
    assert [path for path in tmp_path.rglob("*") if path.is_file() and path.name in ("escape.json", "x.json")] == []
    assert stored_files(store.root) == []


# ------------------------------------------------------------------ Cloud Storage: identity and the wire


def test_an_upload_without_a_vm_token_is_a_permission_error_naming_the_fix(twin: Twin) -> None:
    anonymous = CloudStorageBundles(BUCKET, endpoint=twin.vm_side.base_url)
    try:
        with pytest.raises(CloudError) as denied:
            anonymous.put(NAME, BUNDLE)
    finally:
        anonymous.close()
    assert denied.value.error_class is ErrorClass.PERMISSION and denied.value.code == 401
    assert "roles/storage.objectCreator" in str(denied.value) and f"gs://{BUCKET}/{NAME}" in str(denied.value)
    assert stored_files(twin.storage) == [] and twin.uploads() == 1, "refused by the stand-in, not before it"


def test_a_read_cannot_climb_out_of_the_object_path_to_another_bucket(twin: Twin) -> None:
    twin.controller.put_object("other", "secret.json", b'{"other": "bucket"}')
    reader = CloudStorageBundles(BUCKET, endpoint=twin.controller.base_url)
    try:
        with pytest.raises(CloudError) as refused:
            reader.get("../../other/o/secret.json")  # unquoted, a client would normalise it to b/other/o/...
    finally:
        reader.close()
    assert refused.value.error_class in (ErrorClass.INVALID, ErrorClass.NOT_FOUND)
    assert twin.controller.calls[-1] == ("GET", f"/storage/v1/b/{BUCKET}/o/..%2F..%2Fother%2Fo%2Fsecret.json")


def test_the_stand_in_answers_uploads_on_google_wire(twin: Twin) -> None:
    url = f"{twin.vm_side.base_url}/upload/storage/v1/b/{BUCKET}/o"
    auth = {"Authorization": f"Bearer {twin.vm_side.tokens.issue(VM)}", "Content-Type": "application/json"}
    once = {"uploadType": "media", "name": NAME, "ifGenerationMatch": "0"}
    with requests.Session() as http:
        made = http.post(url, params=once, data=BUNDLE, headers=auth, timeout=10)
        assert made.status_code == 200
        body = made.json()
        assert {k: body[k] for k in ("kind", "bucket", "name", "size")} == {
            "kind": "storage#object", "bucket": BUCKET, "name": NAME, "size": str(len(BUNDLE)),
        }  # fmt: skip
        assert int(body["generation"]) > 0
        clash = http.post(url, params=once, data=b"{}", headers=auth, timeout=10)
        assert clash.status_code == 412
        error = clash.json()["error"]
        assert error["message"] == "At least one of the pre-conditions you specified did not hold."
        assert error["code"] == 412 and error["errors"][0]["reason"] == "conditionNotMet"
        replaced = http.post(url, params={"uploadType": "media", "name": NAME}, data=b"{}", headers=auth, timeout=10)
        assert replaced.status_code == 200, "without the precondition an upload replaces, as on Google Cloud"
        assert (twin.storage / BUCKET / NAME).read_bytes() == b"{}"
        other = {"uploadType": "media", "name": "big.json"}
        big = http.post(url, params=other, data=b"z" * (MAX_UPLOAD_BYTES + 1), headers=auth, timeout=30)
        assert big.status_code == 413 and not (twin.storage / BUCKET / "big.json").exists()
        nowhere = f"{twin.vm_side.base_url}/upload/storage/v1/b/no-such-bucket/o"
        missing = http.post(nowhere, params=other, data=b"{}", headers=auth, timeout=10)
        assert missing.status_code == 404 and not (twin.storage / "no-such-bucket").exists()
    raw = HTTPConnection("127.0.0.1", twin.vm_side.port, timeout=10)  # sent as is, not normalised
    try:
        raw.request("POST", "/upload/storage/v1/b/../o?uploadType=media&name=climbed.json", b"{}", auth)
        assert raw.getresponse().status == 404
    finally:
        raw.close()
    assert not (twin.storage.parent / "climbed.json").exists()
