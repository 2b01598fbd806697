"""``HubFiles``: the Hugging Face Hub's listing of a revision and its files, over the Hub's HTTP API.

Why not ``huggingface_hub``: the restore must know each file's digest before it trusts a byte from the cache, and it
writes the Hub cache's layout itself (blobs named by digest, snapshot links); two calls of the Hub's wire do that
without depending on the version of huggingface_hub a serving image carries:

* ``GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true``: the commit and every file's size and digest;
* ``GET {endpoint}/{repo}/resolve/{commit}/{path}``: the bytes (redirects to the Hub's CDN are followed; requests
  drops the token on a redirect to another host).

The token (a gated model's) is read from the file ``HF_TOKEN_PATH`` names, sent only as ``Authorization``, and
never logged. ``endpoint``: ``HF_ENDPOINT`` as huggingface_hub reads it (a VM twin points it at a stand-in).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import requests

from shared.domain.errors import CloudError, ErrorClass
from shared.domain.weights_cache import HubFile, HubListing, check_repo_id, parse_hub_listing

__all__ = ["DEFAULT_ENDPOINT", "HubFiles"]

DEFAULT_ENDPOINT = "https://huggingface.co"


class HubFiles:
    """Listings and downloads of one Hub (``endpoint``), with an optional token."""

    def __init__(
        self, endpoint: str | None = None, *, token: str | None = None, session: requests.Session | None = None
    ):
        self._endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        self._session = session or requests.Session()
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"

    @classmethod
    def from_environment(cls, environ: dict[str, str]) -> HubFiles:
        """As huggingface_hub would be set up by ``HF_ENDPOINT`` and ``HF_TOKEN_PATH`` (a missing file: no token)."""
        token_path = environ.get("HF_TOKEN_PATH")
        token = None
        if token_path and Path(token_path).is_file():
            token = Path(token_path).read_text(encoding="utf-8").strip() or None
        return cls(environ.get("HF_ENDPOINT"), token=token)

    def listing(self, repo_id: str, revision: str) -> HubListing:
        """The revision's commit and files; ``CloudError`` says whether the model, the revision or access is wrong."""
        try:
            check_repo_id(repo_id)
        except ValueError as exc:
            raise CloudError(ErrorClass.INVALID, str(exc)) from exc
        url = f"{self._endpoint}/api/models/{repo_id}/revision/{quote(revision or 'main', safe='')}"
        response = self._get(url, repo_id, params={"blobs": "true"})
        with response:
            if response.status_code != 200:
                raise _classified(response, f"{repo_id}@{revision or 'main'}")
            try:
                return parse_hub_listing(repo_id, response.json())
            except ValueError as exc:
                raise CloudError(ErrorClass.INVALID, f"the Hub's listing of {repo_id}: {exc}") from exc

    def download_to(self, repo_id: str, commit: str, file: HubFile, path: Path) -> None:
        """The file's bytes at ``commit`` into ``path`` (the caller checks the digest)."""
        url = f"{self._endpoint}/{repo_id}/resolve/{commit}/{quote(file.path)}"
        with self._get(url, f"{repo_id}/{file.path}", stream=True) as response:
            if response.status_code != 200:
                raise _classified(response, f"{repo_id}/{file.path}@{commit[:12]}")
            try:
                with path.open("wb") as out:
                    for chunk in response.iter_content(chunk_size=1024 * 1024):
                        out.write(chunk)
            except requests.RequestException as exc:
                raise CloudError(ErrorClass.TRANSIENT, f"the Hub's {file.path}: download cut short: {exc}") from exc

    def _get(self, url: str, what: str, **kwargs: object) -> requests.Response:
        try:
            return self._session.get(url, timeout=(10, 120), **kwargs)  # type: ignore[arg-type]
        except requests.RequestException as exc:
            raise CloudError(ErrorClass.TRANSIENT, f"the Hub is unreachable for {what}: {type(exc).__name__}") from exc


def _classified(response: requests.Response, what: str) -> CloudError:
    code = response.status_code
    kind = response.headers.get("X-Error-Code", "")
    if code in (401, 403):
        fix = "accept the model's licence on the Hub and save a token that can read it (tpu_save_hf_token)"
        return CloudError(ErrorClass.PERMISSION, f"the Hub refused {what} (HTTP {code}): {fix}", code=code)
    if code == 404:
        found = {"RevisionNotFound": "no such revision", "EntryNotFound": "no such file"}.get(kind, "no such model")
        return CloudError(ErrorClass.NOT_FOUND, f"the Hub has {found}: {what} (check the model id and revision)")
    if code == 429 or code >= 500:
        return CloudError(ErrorClass.TRANSIENT, f"the Hub answered {code} for {what} (retry later)", code=code)
    return CloudError(ErrorClass.INVALID, f"the Hub answered {code} for {what}", code=code)
