"""The Storage stand-in holds VM writes to Terraform's IAM conditions: only the builder's account writes compile/.

shared/domain/compile_cache.py's trust model, over real HTTP: a serving VM's token is refused (403 ``forbidden``, in
Google's words) on a media upload, on a resumable session's start and on the final ``PUT`` of a session under
``compile/``, and nothing is written; the prewarm builder's token writes there; both still write ``weights/`` and
both read ``compile/``. Writes go through the node agent's own adapter (``WeightsCacheBucket``) where it can make
the call, and raw requests where the test needs a call the adapter would not make.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

import shared.adapters.weights_cache_bucket as bucket_module
from localcloud.vm_twin.google_apis import DEFAULT_PREFIX_WRITERS, GoogleApis
from localcloud.vm_twin.metadata_server import TokenIssuer, VmIdentity
from localcloud.vm_twin.vm import builder_service_account
from shared.adapters.file_secrets import FileSecretStore
from shared.adapters.weights_cache_bucket import WeightsCacheBucket
from shared.domain.compile_cache import COMPILE_PREFIX, archive_name, manifest_name
from shared.domain.errors import CloudError, ErrorClass

PROJECT = "tpuctl-twin"
BUCKET = "tpuctl-twin-weights-us-east5"
SERVING = "tpuctl-tpu-vm@tpuctl-twin.iam.gserviceaccount.com"
BUILDER = builder_service_account(PROJECT)
MODEL = "google/gemma-4-e4b-it"
MANIFEST = manifest_name(MODEL, "0" * 32)
ARCHIVE = archive_name(MODEL, "0" * 32, "a" * 64)
WEIGHT = "weights/models--google--gemma-4-e4b-it/blobs/" + "b" * 64
CHUNK = 256 * 1024
DENIED = (
    "{} does not have storage.objects.create access to the Google Cloud Storage object. "
    "Permission 'storage.objects.create' denied on resource (or it may not exist)."
)


def _vm(name: str, account: str) -> VmIdentity:
    return VmIdentity(PROJECT, 412345678901, "us-east5-b", name, abs(hash(name)) % 10**9, account)


class Vms:
    """The VM-side stand-in with one serving VM's and one builder's token."""

    def __init__(self, apis: GoogleApis, tokens: TokenIssuer) -> None:
        self.apis = apis
        self.serving = tokens.issue(_vm("gemma-a-g1-a0", SERVING))
        self.builder = tokens.issue(_vm("gemma-a-prewarm", BUILDER))

    def session(self, token: str) -> requests.Session:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        return session

    def bucket(self, token: str) -> WeightsCacheBucket:
        return WeightsCacheBucket(BUCKET, self.session(token), endpoint=self.apis.base_url, chunk_bytes=CHUNK)

    def upload_url(self) -> str:
        return f"{self.apis.base_url}/upload/storage/v1/b/{BUCKET}/o"

    def stored(self) -> list[str]:
        """Every file under the bucket, session state included: what a refused write must not leave."""
        root = self.apis.buckets_dir / BUCKET
        return sorted(path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file())


def _serve(tmp_path: Path, **kwargs: Any) -> Iterator[Vms]:
    tokens = TokenIssuer()
    apis = GoogleApis(PROJECT, FileSecretStore(tmp_path / "secrets"), tmp_path / "storage", tokens, **kwargs)
    apis.create_bucket(BUCKET, location="us-east5")
    apis.start()
    try:
        yield Vms(apis, tokens)
    finally:
        apis.stop()


@pytest.fixture
def vms(tmp_path: Path) -> Iterator[Vms]:
    """As the local cloud serves its VMs: the builder's account alone may write compile/."""
    yield from _serve(tmp_path, prefix_writers={COMPILE_PREFIX: {BUILDER}})


@pytest.fixture
def big(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file the adapter sends through a resumable session in three chunks."""
    monkeypatch.setattr(bucket_module, "SINGLE_UPLOAD_BYTES", CHUNK)
    path = tmp_path / "archive.tar"
    path.write_bytes(bytes(range(256)) * (CHUNK * 3 // 256 - 7))
    return path


def _refused(response: requests.Response, account: str) -> None:
    with response:
        assert response.status_code == 403, response.text
        error = response.json()["error"]
    assert error["code"] == 403 and error["message"] == DENIED.format(account)
    assert error["errors"][0]["reason"] == "forbidden"


# --- the serving VM -----------------------------------------------------------------------------


def test_a_serving_vm_is_refused_a_media_upload_under_compile_and_nothing_is_written(vms: Vms, tmp_path: Path) -> None:
    serving = vms.session(vms.serving)
    for name in (MANIFEST, ARCHIVE):
        answer = serving.post(
            vms.upload_url(), params={"uploadType": "media", "name": name, "ifGenerationMatch": "0"}, data=b"{}"
        )
        _refused(answer, SERVING)
    small = tmp_path / "manifest.json"
    small.write_bytes(b'{"key": "x"}')
    with pytest.raises(CloudError) as refused:
        vms.bucket(vms.serving).write_from(MANIFEST, small, if_generation=0)  # the node agent's own call
    assert refused.value.error_class is ErrorClass.PERMISSION and "storage.objects.create" in str(refused.value)
    assert vms.stored() == []
    assert vms.apis.object_generation(BUCKET, MANIFEST) is None


def test_a_serving_vm_is_refused_a_resumable_session_under_compile_and_nothing_is_written(vms: Vms, big: Path) -> None:
    answer = vms.session(vms.serving).post(
        vms.upload_url(),
        params={"uploadType": "resumable", "name": ARCHIVE, "ifGenerationMatch": "0"},
        headers={"X-Upload-Content-Length": str(big.stat().st_size)},
    )
    assert "Location" not in answer.headers
    _refused(answer, SERVING)
    with pytest.raises(CloudError) as refused:
        vms.bucket(vms.serving).write_from(ARCHIVE, big, if_generation=0)
    assert refused.value.error_class is ErrorClass.PERMISSION
    assert vms.stored() == [], "no session was opened"


def test_the_final_put_of_a_session_is_held_to_its_own_token(vms: Vms, big: Path) -> None:
    """A builder's session URI in a serving VM's hands does not let it finish the upload."""
    data = big.read_bytes()
    total = len(data)
    opened = vms.session(vms.builder).post(
        vms.upload_url(),
        params={"uploadType": "resumable", "name": ARCHIVE, "ifGenerationMatch": "0"},
        headers={"X-Upload-Content-Length": str(total)},
    )
    assert opened.status_code == 200, opened.text
    session_uri = opened.headers["Location"]
    first = vms.session(vms.builder).put(
        session_uri, data=data[:CHUNK], headers={"Content-Range": f"bytes 0-{CHUNK - 1}/{total}"}
    )
    assert first.status_code == 308 and first.headers["Range"] == f"bytes=0-{CHUNK - 1}"
    last = vms.session(vms.serving).put(
        session_uri, data=data[CHUNK:], headers={"Content-Range": f"bytes {CHUNK}-{total - 1}/{total}"}
    )
    _refused(last, SERVING)
    assert vms.apis.object_generation(BUCKET, ARCHIVE) is None
    assert vms.stored() == [], "the refused session is dropped with its bytes"


# --- the builder --------------------------------------------------------------------------------


def test_the_builder_writes_compile_by_media_and_resumable_uploads(vms: Vms, big: Path, tmp_path: Path) -> None:
    builder = vms.bucket(vms.builder)
    assert builder.write_from(ARCHIVE, big, if_generation=0)  # a resumable session, three chunks
    manifest = tmp_path / "manifest.json"
    manifest.write_bytes(b'{"key": "0"}')
    assert builder.write_from(MANIFEST, manifest, if_generation=0)
    generation = vms.apis.object_generation(BUCKET, MANIFEST)
    assert generation is not None
    assert builder.write_from(MANIFEST, manifest, if_generation=generation), "a refill replaces on its generation"
    assert (vms.apis.buckets_dir / BUCKET / ARCHIVE).read_bytes() == big.read_bytes()
    assert vms.stored() == sorted([ARCHIVE, MANIFEST])


def test_a_session_finished_without_a_token_counts_as_its_opener(vms: Vms, big: Path) -> None:
    data = big.read_bytes()
    opened = vms.session(vms.builder).post(
        vms.upload_url(),
        params={"uploadType": "resumable", "name": ARCHIVE},
        headers={"X-Upload-Content-Length": str(len(data))},
    )
    done = requests.put(
        opened.headers["Location"],
        data=data,
        headers={"Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}"},
        timeout=30,
    )
    assert done.status_code == 200, done.text
    assert vms.stored() == [ARCHIVE]


# --- what both may do ---------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["serving", "builder"])
def test_both_still_write_weights_by_media_and_resumable_uploads(vms: Vms, big: Path, tmp_path: Path, who: str) -> None:
    bucket = vms.bucket(getattr(vms, who))
    small = tmp_path / "config.json"
    small.write_bytes(b'{"model_type": "gemma4"}')
    assert bucket.write_from("weights/models--google--gemma-4-e4b-it/blobs/" + "c" * 64, small, if_generation=0)
    assert bucket.write_from(WEIGHT, big, if_generation=0)
    assert vms.apis.object_generation(BUCKET, WEIGHT) is not None


@pytest.mark.parametrize("who", ["serving", "builder"])
def test_both_read_compile(vms: Vms, big: Path, tmp_path: Path, who: str) -> None:
    assert vms.bucket(vms.builder).write_from(ARCHIVE, big, if_generation=0)
    reader = vms.bucket(getattr(vms, who))
    found = reader.stat(ARCHIVE)
    assert found is not None and found[0] == big.stat().st_size
    reader.read_to(ARCHIVE, found[1], found[0], tmp_path / f"{who}.tar")
    assert (tmp_path / f"{who}.tar").read_bytes() == big.read_bytes()


# --- the defaults -------------------------------------------------------------------------------


def test_by_default_no_vm_token_writes_compile_and_the_controller_side_is_not_held(tmp_path: Path) -> None:
    assert dict(DEFAULT_PREFIX_WRITERS) == {COMPILE_PREFIX: frozenset()}
    for vms in _serve(tmp_path / "vm-side"):
        for token, account in ((vms.serving, SERVING), (vms.builder, BUILDER)):
            answer = vms.session(token).post(
                vms.upload_url(), params={"uploadType": "media", "name": MANIFEST}, data=b"{}"
            )
            _refused(answer, account)
        assert vms.stored() == []
        weights = vms.session(vms.serving).post(
            vms.upload_url(), params={"uploadType": "media", "name": WEIGHT}, data=b"w"
        )
        assert weights.status_code == 200, "weights/ stays open to every VM"
    for controller in _serve(tmp_path / "controller-side", require_token=False):
        url, params = controller.upload_url(), {"uploadType": "media", "name": MANIFEST}
        answer = requests.post(url, params=params, data=b"{}", timeout=30)
        assert answer.status_code == 200, "an anonymous controller-side instance keeps its behaviour"
