"""The GCE metadata server as one TPU VM sees it: the VM twin's stand-in for ``metadata.google.internal``.

Why: the startup script, google-auth and gcloud on a TPU VM learn who and where they are, get access tokens and
report boot progress through the metadata server. The VM twin runs the real script, so it needs the real wire:
``GET /`` answers 200 with ``Metadata-Flavor: Google`` (google-auth's ping), every other path needs the
``Metadata-Flavor: Google`` request header (403 without it, as Google answers), a request carrying
``X-Forwarded-For`` is refused (a proxied request is not from the VM), and guest attributes take PUT, GET and
DELETE. Paths and shapes follow the metadata server's documentation (``instance/zone`` is
``projects/NUMBER/zones/ZONE``; ``service-accounts/default/?recursive=true`` is JSON with ``email``).

Instance attributes (the startup script among them) are read from the simulator on every request, so a metadata
update by the controller is seen at once. Access tokens are minted by a :class:`TokenIssuer` and bound to this
VM; the local Google API stand-ins accept only tokens it issued.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from localcloud.vm_twin.loopback_http import LoopbackStandIn, StandInServer

__all__ = ["GuestAttributes", "MetadataServer", "TokenIssuer", "VmIdentity"]

_PREFIX = "/computeMetadata/v1/"
_TOKEN_LIFETIME_S = 3599
_MAX_GUEST_VALUE = 64 * 1024
_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


@dataclass(frozen=True)
class VmIdentity:
    """Who the VM is: what the metadata server tells about the instance."""

    project: str
    project_number: int
    zone: str
    name: str
    instance_id: int
    service_account: str


class TokenIssuer:
    """Access tokens handed out by the VMs' metadata servers, each bound to the VM that asked for it."""

    def __init__(self) -> None:
        self._tokens: dict[str, VmIdentity] = {}
        self._lock = threading.Lock()

    def issue(self, vm: VmIdentity) -> str:
        token = "ya29.twin-" + secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = vm
        return token

    def identity(self, authorization: str | None) -> VmIdentity | None:
        """The VM a ``Bearer`` token was issued to, or None for no token or one nobody issued."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        with self._lock:
            return self._tokens.get(authorization.removeprefix("Bearer ").strip())

    def revoke(self, vm: VmIdentity) -> None:
        """Forget every token of a VM (it was deleted)."""
        with self._lock:
            for token in [token for token, owner in self._tokens.items() if owner == vm]:
                del self._tokens[token]


class GuestAttributes:
    """Where a VM's guest attributes go: the simulator's World in the local cloud (``put``, ``get``, ``delete``)."""

    def __init__(
        self,
        put: Callable[[str, str, str], None],
        read: Callable[[], list[tuple[str, str, str]]],
        delete: Callable[[str, str], None],
    ) -> None:
        self.put, self.read, self.delete = put, read, delete


class MetadataServer(LoopbackStandIn):
    """One VM's metadata server on a loopback port. ``start()`` returns ``host:port`` (``GCE_METADATA_HOST``)."""

    def __init__(
        self,
        vm: VmIdentity,
        attributes: Callable[[], Mapping[str, str]],
        guest: GuestAttributes,
        tokens: TokenIssuer,
        *,
        host: str = "127.0.0.1",
    ) -> None:
        self.vm = vm
        self._attributes = attributes
        self._guest = guest
        self._tokens = tokens
        self._server = StandInServer(_Handler, self, name="metadata-server", host=host)

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> str:
        self._server.start()
        return self.host_port

    def stop(self) -> None:
        self._server.stop()
        self._tokens.revoke(self.vm)

    # ------------------------------------------------------------------ what the paths answer

    def read(self, path: str, query: Mapping[str, str]) -> tuple[int, str | dict[str, Any]]:
        """The answer to ``GET /computeMetadata/v1/<path>``: (status, text or JSON)."""
        vm = self.vm
        fixed: dict[str, str] = {
            "project/project-id": vm.project,
            "project/numeric-project-id": str(vm.project_number),
            "instance/zone": f"projects/{vm.project_number}/zones/{vm.zone}",
            "instance/name": vm.name,
            "instance/hostname": f"{vm.name}.{vm.zone}.c.{vm.project}.internal",
            "instance/id": str(vm.instance_id),
            "universe/universe-domain": "googleapis.com",
            "instance/service-accounts/": f"default/\n{vm.service_account}/\n",
        }
        if path in fixed:
            return 200, fixed[path]
        if path.startswith("instance/attributes/"):
            return self._attribute(path.removeprefix("instance/attributes/"))
        if path.startswith("instance/service-accounts/"):
            return self._service_account(path.removeprefix("instance/service-accounts/"), query)
        if path.startswith("instance/guest-attributes/"):
            return self._guest_read(path.removeprefix("instance/guest-attributes/"))
        return 404, "not found"

    def _attribute(self, key: str) -> tuple[int, str | dict[str, Any]]:
        attributes = dict(self._attributes())
        if key == "":
            return 200, "".join(f"{name}\n" for name in sorted(attributes))
        if key in attributes:
            return 200, attributes[key]
        return 404, "not found"

    def _service_account(self, rest: str, query: Mapping[str, str]) -> tuple[int, str | dict[str, Any]]:
        account, _, leaf = rest.partition("/")
        if account not in ("default", self.vm.service_account):
            return 404, "not found"
        email = self.vm.service_account
        if leaf == "" and query.get("recursive") == "true":
            return 200, {"aliases": ["default"], "email": email, "scopes": list(_SCOPES)}
        if leaf == "email":
            return 200, email
        if leaf == "scopes":
            return 200, "\n".join(_SCOPES) + "\n"
        if leaf == "token":
            token = self._tokens.issue(self.vm)
            return 200, {"access_token": token, "expires_in": _TOKEN_LIFETIME_S, "token_type": "Bearer"}
        if leaf == "identity":
            if not query.get("audience"):
                return 400, "non-empty audience parameter required"
            return 200, _unsigned_id_token(email, query["audience"])
        return 404, "not found"

    def _guest_read(self, path: str) -> tuple[int, str | dict[str, Any]]:
        namespace, _, key = path.partition("/")
        for found_namespace, found_key, value in self._guest.read():
            if found_namespace == namespace and found_key == key:
                return 200, value
        if key == "":
            listed = [k for ns, k, _ in self._guest.read() if ns == namespace]
            return (200, "".join(f"{k}\n" for k in listed)) if listed else (404, "not found")
        return 404, "not found"

    def write_guest(self, path: str, value: str) -> int:
        namespace, _, key = path.partition("/")
        if not namespace or not key or "/" in key:
            return 400
        self._guest.put(namespace, key, value)
        return 200

    def delete_guest(self, path: str) -> int:
        namespace, _, key = path.partition("/")
        if not namespace or not key:
            return 400
        self._guest.delete(namespace, key)
        return 200


def _unsigned_id_token(email: str, audience: str) -> str:
    """A JWT-shaped ID token (unsigned: nothing local verifies signatures; shapes are what clients parse)."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({'aud': audience, 'email': email, 'iss': 'twin'})}."


class _Handler(BaseHTTPRequestHandler):
    server_version = "Metadata Server for VM"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the VM asks often
        return

    def _owner(self) -> MetadataServer:
        return self.server.stand_in  # type: ignore[attr-defined]

    def _refused(self) -> bool:
        if self.headers.get("X-Forwarded-For"):
            self._send(403, "request with X-Forwarded-For header is not allowed")
            return True
        flavor = self.headers.get("Metadata-Flavor")
        if flavor is None:
            self._send(403, 'Missing required header "Metadata-Flavor": "Google"')
            return True
        if flavor != "Google":
            self._send(404, "not found")
            return True
        return False

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/":
            self._send(200, "computeMetadata/\n")
            return
        if self._refused():
            return
        if not url.path.startswith(_PREFIX):
            self._send(404, "not found")
            return
        query = {name: values[-1] for name, values in parse_qs(url.query).items()}
        status, body = self._owner().read(url.path.removeprefix(_PREFIX), query)
        self._send(status, body)

    def do_PUT(self) -> None:
        path = self._guest_path()
        if path is None:
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_GUEST_VALUE:
            self._send(413, "guest attribute value too large")
            return
        value = self.rfile.read(length).decode("utf-8", errors="replace")
        self._send(self._owner().write_guest(path, value), "")

    def do_DELETE(self) -> None:
        path = self._guest_path()
        if path is not None:
            self._send(self._owner().delete_guest(path), "")

    def _guest_path(self) -> str | None:
        if self._refused():
            return None
        path = urlsplit(self.path).path
        prefix = _PREFIX + "instance/guest-attributes/"
        if not path.startswith(prefix):
            self._send(405, "method not allowed")
            return None
        return path.removeprefix(prefix)

    def _send(self, status: int, body: str | dict[str, Any]) -> None:
        if isinstance(body, dict):
            data, content_type = json.dumps(body).encode(), "application/json"
        else:
            data, content_type = body.encode(), "application/text"
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
