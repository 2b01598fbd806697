"""Large cache fills go through Cloud Storage resumable sessions: the adapter against the twin's Storage stand-in.

A shard of several GB must not restart from its first byte when one request fails, and must never appear partial
or overwrite another filler's entry: the session carries the same ``ifGenerationMatch`` as a one-shot upload.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

import shared.adapters.weights_cache_bucket as bucket_module
from localcloud.vm_twin.google_apis import GoogleApis
from shared.adapters.weights_cache_bucket import WeightsCacheBucket
from shared.domain.errors import CloudError
from tests.support.stand_ins import storage_stand_in

BUCKET = "tpuctl-twin-weights-us-east5"
CHUNK = 256 * 1024
NAME = "weights/models--google--gemma/blobs/" + "a" * 64


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[GoogleApis]:
    with storage_stand_in(tmp_path, {BUCKET: "us-east5"}) as apis:
        yield apis


@pytest.fixture(autouse=True)
def small_single_uploads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything over 64 KiB is "large" here, so a test file of a few chunks takes the resumable path."""
    monkeypatch.setattr(bucket_module, "SINGLE_UPLOAD_BYTES", 64 * 1024)
    monkeypatch.setattr(bucket_module.time, "sleep", lambda seconds: None)  # resumes back off; not in a test


class DroppingSession(requests.Session):
    """A session whose chosen chunk PUTs (by their order) fail in transit: the bytes never reach the service."""

    def __init__(self, drop: set[int]) -> None:
        super().__init__()
        self.drop = drop
        self.chunk_puts = 0
        self.status_queries = 0

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        if method == "PUT":
            if str((kwargs.get("headers") or {}).get("Content-Range", "")).startswith("bytes */"):
                self.status_queries += 1
            else:
                self.chunk_puts += 1
                if self.chunk_puts in self.drop:
                    raise requests.ConnectionError("connection reset by peer")
        return super().request(method, url, *args, **kwargs)


def cache(storage: GoogleApis, session: requests.Session | None = None) -> WeightsCacheBucket:
    return WeightsCacheBucket(BUCKET, session or requests.Session(), endpoint=storage.base_url, chunk_bytes=CHUNK)


def shard(tmp_path: Path, size: int = 4 * CHUNK + 1234) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = tmp_path / "shard.safetensors"
    path.write_bytes(data)
    return path, data


def stored(storage: GoogleApis) -> bytes:
    return (storage.buckets_dir / BUCKET / NAME).read_bytes()


def test_a_large_file_is_stored_whole_through_a_session_in_chunks(tmp_path: Path, storage: GoogleApis) -> None:
    path, data = shard(tmp_path)
    session = DroppingSession(drop=set())
    assert cache(storage, session).write_from(NAME, path, if_generation=0) is True
    assert stored(storage) == data
    assert session.chunk_puts == 5 and session.status_queries == 0
    assert not [p.name for p in (storage.buckets_dir / BUCKET).iterdir() if p.name.startswith(".upload-")]


def test_a_chunk_lost_in_transit_is_sent_again_from_the_committed_offset(tmp_path: Path, storage: GoogleApis) -> None:
    path, data = shard(tmp_path)
    session = DroppingSession(drop={3})  # the third chunk never arrives
    assert cache(storage, session).write_from(NAME, path, if_generation=0) is True
    assert stored(storage) == data
    assert session.status_queries == 1, "one status query after the failure"
    assert session.chunk_puts == 6, "only the lost chunk was sent twice"


def test_an_upload_gives_up_after_the_resumes_and_leaves_no_object(tmp_path: Path, storage: GoogleApis) -> None:
    path, _ = shard(tmp_path)
    session = DroppingSession(drop=set(range(2, 100)))
    with pytest.raises(CloudError, match="unreachable"):
        cache(storage, session).write_from(NAME, path, if_generation=0)
    assert session.chunk_puts == 1 + 1 + bucket_module.RESUMES
    assert storage.object_generation(BUCKET, NAME) is None, "never a partial object"


class StuckSession(DroppingSession):
    """A service that answers every chunk 308 and keeps nothing: no progress, ever."""

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        if method == "PUT" and "upload_id=" in str(url):
            self.chunk_puts += 1
            stuck = requests.Response()
            stuck.status_code, stuck._content, stuck._content_consumed = 308, b"", True
            return stuck
        return super().request(method, url, *args, **kwargs)


def test_a_session_that_never_advances_is_given_up_instead_of_looping(tmp_path: Path, storage: GoogleApis) -> None:
    path, _ = shard(tmp_path)
    session = StuckSession(drop=set())
    with pytest.raises(CloudError, match="upload stuck at 0"):
        cache(storage, session).write_from(NAME, path, if_generation=0)
    assert session.chunk_puts == 2 * (bucket_module.RESUMES + 1) - 1  # each failure: a status query, then the chunk
    assert storage.object_generation(BUCKET, NAME) is None


def test_an_existing_entry_is_never_overwritten_by_a_second_filler(tmp_path: Path, storage: GoogleApis) -> None:
    first = storage.put_object(BUCKET, NAME, b"the first filler's bytes")
    path, _ = shard(tmp_path)
    assert cache(storage).write_from(NAME, path, if_generation=0) is False  # refused when the session opens
    assert stored(storage) == b"the first filler's bytes" and first.endswith(NAME)


def test_a_filler_that_lands_during_the_upload_wins_and_the_session_ends_412(
    tmp_path: Path, storage: GoogleApis
) -> None:
    path, _ = shard(tmp_path)

    class RacedSession(DroppingSession):
        def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
            if method == "PUT" and self.chunk_puts == 4:  # before the last chunk, another VM stores the entry
                storage.put_object(BUCKET, NAME, b"the other VM's bytes")
            return super().request(method, url, *args, **kwargs)

    assert cache(storage, RacedSession(drop=set())).write_from(NAME, path, if_generation=0) is False
    assert stored(storage) == b"the other VM's bytes"


def test_the_stand_in_takes_only_the_bytes_it_lacks_and_refuses_what_a_session_cannot_take(
    storage: GoogleApis,
) -> None:
    start = requests.post(
        f"{storage.base_url}/upload/storage/v1/b/{BUCKET}/o",
        params={"uploadType": "resumable", "name": NAME, "ifGenerationMatch": "0"},
        headers={"X-Upload-Content-Length": str(2 * CHUNK)},
        timeout=10,
    )
    assert start.status_code == 200
    session = start.headers["Location"]
    data = os.urandom(2 * CHUNK)

    def put(first: int, last: int, body: bytes) -> requests.Response:
        headers = {"Content-Range": f"bytes {first}-{last}/{2 * CHUNK}"}
        return requests.put(session, data=body, headers=headers, timeout=10, allow_redirects=False)

    assert put(CHUNK, 2 * CHUNK - 1, data[CHUNK:]).status_code == 308, "past the committed offset: not taken"
    status = requests.put(session, headers={"Content-Range": f"bytes */{2 * CHUNK}"}, timeout=10)
    assert status.status_code == 308 and "Range" not in status.headers
    assert put(0, 99, data[:100]).status_code == 400, "a chunk other than the last must be a multiple of 256 KiB"
    first = put(0, CHUNK - 1, data[:CHUNK])
    assert first.status_code == 308 and first.headers["Range"] == f"bytes=0-{CHUNK - 1}"
    overlap = put(CHUNK - 10, 2 * CHUNK - 1, data[CHUNK - 10 :])  # 10 bytes it has already
    assert overlap.status_code == 200 and overlap.json()["size"] == str(2 * CHUNK)
    assert stored(storage) == data
    gone = requests.put(session, headers={"Content-Range": f"bytes */{2 * CHUNK}"}, timeout=10)
    assert gone.status_code == 404, "a finished session is gone"
