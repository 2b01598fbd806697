"""The Cloud Storage stand-in's generations, preconditions, ranged reads and bucket locations, over real HTTP.

The weights cache fills a regional bucket with ``ifGenerationMatch`` writes and restores with ranged, generation-
pinned reads; these tests hold the stand-in to Google's JSON API on exactly those points, so a restore program that
passes against the twin would pass against Cloud Storage.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from localcloud.vm_twin.google_apis import GoogleApis
from tests.support.stand_ins import storage_stand_in

PROJECT = "tpuctl-twin"
BUCKET = "tpuctl-twin-weights-us-east5"
NAME = "weights/org--model/abc123/model.safetensors"


@pytest.fixture
def apis(tmp_path: Path) -> Iterator[GoogleApis]:
    with storage_stand_in(tmp_path, {BUCKET: "us-east5"}, PROJECT) as served:
        yield served


def upload(
    apis: GoogleApis, data: bytes, name: str = NAME, if_generation_match: int | None = None
) -> requests.Response:
    params: dict[str, str | int] = {"uploadType": "media", "name": name}
    if if_generation_match is not None:
        params["ifGenerationMatch"] = if_generation_match
    return requests.post(f"{apis.base_url}/upload/storage/v1/b/{BUCKET}/o", params=params, data=data, timeout=5)


def object_url(apis: GoogleApis, name: str = NAME) -> str:
    return f"{apis.base_url}/storage/v1/b/{BUCKET}/o/{quote(name, safe='')}"


def test_each_write_makes_a_higher_generation_that_reads_and_metadata_agree_on(apis: GoogleApis) -> None:
    first = upload(apis, b"one")
    assert first.status_code == 200
    generation = int(first.json()["generation"])
    assert apis.object_generation(BUCKET, NAME) == generation

    metadata = requests.get(object_url(apis), timeout=5).json()
    assert metadata["kind"] == "storage#object"
    assert (metadata["bucket"], metadata["name"], metadata["size"]) == (BUCKET, NAME, "3")
    assert metadata["generation"] == str(generation)
    assert requests.get(object_url(apis), timeout=5).json()["generation"] == str(generation)  # stable across reads

    second = upload(apis, b"two!")
    assert second.status_code == 200
    assert int(second.json()["generation"]) > generation
    media = requests.get(object_url(apis), params={"alt": "media"}, timeout=5)
    assert media.content == b"two!"
    assert media.headers["x-goog-generation"] == second.json()["generation"]


def test_objects_put_directly_have_a_generation_too(apis: GoogleApis) -> None:
    apis.put_object(BUCKET, "seeded.bin", b"seed")
    generation = apis.object_generation(BUCKET, "seeded.bin")
    assert generation is not None and generation > 0
    assert requests.get(object_url(apis, "seeded.bin"), timeout=5).json()["generation"] == str(generation)
    assert apis.object_generation(BUCKET, "absent.bin") is None


def test_if_generation_match_replaces_only_the_current_generation(apis: GoogleApis) -> None:
    assert upload(apis, b"late", if_generation_match=12345).status_code == 412  # no object yet, N > 0
    created = upload(apis, b"first", if_generation_match=0)
    assert created.status_code == 200
    generation = int(created.json()["generation"])
    refused = upload(apis, b"again", if_generation_match=0)
    assert refused.status_code == 412
    assert refused.json()["error"]["errors"][0]["reason"] == "conditionNotMet"

    assert upload(apis, b"stale", if_generation_match=generation - 1).status_code == 412
    replaced = upload(apis, b"second", if_generation_match=generation)
    assert replaced.status_code == 200
    assert upload(apis, b"third", if_generation_match=generation).status_code == 412  # that generation is gone
    assert requests.get(object_url(apis), params={"alt": "media"}, timeout=5).content == b"second"
    assert upload(apis, b"plain").status_code == 200  # no precondition: replace
    assert upload(apis, b"x", if_generation_match="abc").status_code == 400  # type: ignore[arg-type]


@pytest.mark.parametrize("precondition", ["current", "zero"])
def test_two_writers_racing_one_precondition_cannot_both_win(apis: GoogleApis, precondition: str) -> None:
    name = f"race/{precondition}.bin"
    expected = int(upload(apis, b"base", name=name).json()["generation"]) if precondition == "current" else 0
    start = threading.Barrier(2)
    statuses: list[int] = []

    def write(data: bytes) -> None:
        start.wait()
        statuses.append(upload(apis, data, name=name, if_generation_match=expected).status_code)

    writers = [threading.Thread(target=write, args=(data,)) for data in (b"writer-a", b"writer-b")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=10)
    assert sorted(statuses) == [200, 412]
    assert requests.get(object_url(apis, name), params={"alt": "media"}, timeout=5).content in (
        b"writer-a",
        b"writer-b",
    )


def test_a_range_read_returns_just_those_bytes_with_content_range(apis: GoogleApis) -> None:
    data = bytes(range(256)) * 4
    generation = upload(apis, data).json()["generation"]
    url = object_url(apis)

    ranged = requests.get(url, params={"alt": "media"}, headers={"Range": "bytes=10-19"}, timeout=5)
    assert ranged.status_code == 206
    assert ranged.content == data[10:20]
    assert ranged.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    assert ranged.headers["x-goog-generation"] == generation

    tail = requests.get(
        url, params={"alt": "media", "generation": generation}, headers={"Range": "bytes=1000-"}, timeout=5
    )
    assert (tail.status_code, tail.content) == (206, data[1000:])
    assert tail.headers["Content-Range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"

    past = requests.get(url, params={"alt": "media"}, headers={"Range": f"bytes={len(data)}-"}, timeout=5)
    assert past.status_code == 416
    whole = requests.get(url, params={"alt": "media"}, timeout=5)
    assert (whole.status_code, whole.content) == (200, data)
    download_url = f"{apis.base_url}/download/storage/v1/b/{BUCKET}/o/{quote(NAME, safe='')}"
    download = requests.get(download_url, params={"alt": "media"}, timeout=5)
    assert download.content == data


def test_a_read_pinned_to_a_stale_generation_is_not_found(apis: GoogleApis) -> None:
    old = upload(apis, b"old").json()["generation"]
    new = upload(apis, b"new").json()["generation"]
    url = object_url(apis)
    assert requests.get(url, params={"alt": "media", "generation": old}, timeout=5).status_code == 404
    assert requests.get(url, params={"generation": old}, timeout=5).status_code == 404
    assert requests.get(url, params={"alt": "media", "generation": new}, timeout=5).content == b"new"


def test_bucket_metadata_carries_its_location(apis: GoogleApis) -> None:
    regional = requests.get(f"{apis.base_url}/storage/v1/b/{BUCKET}", timeout=5).json()
    assert (regional["location"], regional["locationType"]) == ("US-EAST5", "region")
    apis.create_bucket("tpuctl-twin-debug-bundles")
    default = requests.get(f"{apis.base_url}/storage/v1/b/tpuctl-twin-debug-bundles", timeout=5).json()
    assert (default["location"], default["locationType"]) == ("US", "multi-region")
