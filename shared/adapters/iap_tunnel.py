"""``IapTunnels``: reach a TPU VM's private vLLM port from a workstation through IAP TCP forwarding.

Why it exists: TPU VMs get no external IP (Cloud NAT does their egress) and vLLM listens on port 8000 of the
VM's internal address. The monitor runs inside the VPC and probes it there; the gateway and the CLI run on a
workstation, where that address does not route. With ``TPUCTL_ENDPOINT_ACCESS=iap`` the gateway opens

    gcloud compute start-iap-tunnel INSTANCE 8000 --local-host-port=127.0.0.1:PORT --zone=ZONE [--project=P]

as a child process and talks to ``http://127.0.0.1:PORT`` instead (docs/deploy.md, "Reaching a deployment
from a workstation").

Rules it keeps:

- An argv list, never a shell. The instance, zone, project and ports are checked against strict patterns
  before they reach argv, so no value can become a flag or a second command. The instance of a Cloud TPU API
  node is the worker's ``hostname`` guest attribute, text the VM wrote: it is checked like the rest.
- The API key never goes to the child: it stays in the HTTP Authorization header the model client sends over
  the tunnel. The child's environment is an allow-list of this process's (``PATH``, ``HOME``, locale, proxies,
  ``CLOUDSDK_*``), without any value that holds a registered secret or a token-shaped string.
- One tunnel per deployment endpoint for the process's life, reopened if its process died; ``close`` (also run
  at exit) stops each tunnel's whole process group: SIGTERM, then SIGKILL.
- A failure is an ``EndpointAccessError`` naming the fix: install gcloud, ``roles/iap.tunnelResourceAccessor``,
  the firewall rule for IAP's range, or ``gcloud auth login``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from shared.domain.errors import CloudError, ErrorClass
from shared.domain.models import Backend
from shared.logging import REDACTED, scrub_untrusted
from shared.ports import EndpointAccessError, EndpointTarget, TpuApi

__all__ = [
    "IAP_RANGE",
    "IapTunnels",
    "child_environment",
    "tpu_vm_instance",
    "tunnel_argv",
]

log = logging.getLogger(__name__)

IAP_RANGE = "35.235.240.0/20"  # where IAP's TCP forwarding connects from (terraform/modules/network)
_DEFAULT_VLLM_PORT = 8000  # shared.domain.launch.EngineConfig.port
_LOOPBACK = "127.0.0.1"
_INSTANCE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")  # Compute Engine instance names (RFC 1035)
_ZONE = re.compile(r"^[a-z]{2,}-[a-z]+[0-9]{1,2}-[a-z]$")  # us-central1-b, europe-west4-a, ...
_PROJECT = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")  # as shared.config.Settings.project
_ENV_KEEP = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "TMPDIR",
        "XDG_CONFIG_HOME",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
    }
)
_ENV_PREFIXES = ("CLOUDSDK_",)  # gcloud's own configuration (config dir, account, Python)
_STDERR_LINES = 40
_PORT_ATTEMPTS = 3  # a port found free can be taken before gcloud binds it: pick another and retry
_POLL_S = 0.05

FIX_INSTALL = (
    "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install) and run `gcloud auth login`, "
    "or set TPUCTL_ENDPOINT_ACCESS=direct on a machine inside the VPC"
)
FIX_IAM = (
    "grant your account roles/iap.tunnelResourceAccessor on the project (Terraform: add it to "
    "endpoint_tunnel_principals), then retry"
)
FIX_FIREWALL = (
    f"allow IAP's range {IAP_RANGE} to TCP port 8000 on the TPU VMs' network tag (Terraform: allow_iap_vllm = "
    "true creates the tpuctl-allow-iap-vllm rule) and check that the VM is running"
)
FIX_LOGIN = "run `gcloud auth login` (the tunnel uses gcloud's own credentials, not Application Default Credentials)"
FIX_LOOKUP = (
    "grant your account compute.instances.get (Terraform: endpoint_tunnel_principals gets the tpuctlEndpointTunnel "
    "role) and check that the VM still exists (tpu_status(deployment_id=ID))"
)


def tunnel_argv(
    gcloud: str, instance: str, remote_port: int, local_port: int, zone: str, project: str | None
) -> list[str]:
    """The child's argv; refuses (``EndpointAccessError``, before anything runs) any value outside its pattern."""
    _check(instance, _INSTANCE, "instance", "a Compute Engine instance name: lower-case letters, digits, '-'")
    _check_place(zone, project)
    _check_port("remote_port", remote_port)
    _check_port("local_port", local_port)
    argv = [
        gcloud,
        "compute",
        "start-iap-tunnel",
        instance,
        str(remote_port),
        f"--local-host-port={_LOOPBACK}:{local_port}",
        f"--zone={zone}",
    ]
    if project is not None:
        argv.append(f"--project={project}")
    return argv


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What gcloud may see of this process's environment: an allow-list, never a secret."""
    kept: dict[str, str] = {}
    for name, value in environ.items():
        if name not in _ENV_KEEP and not name.startswith(_ENV_PREFIXES):
            continue
        scrubbed, _ = scrub_untrusted(value, len(value) + 1)
        if scrubbed.count(REDACTED) != value.count(REDACTED):
            continue  # holds a registered secret or a token-shaped string: gcloud does not need it
        kept[name] = value
    return kept


def tpu_vm_instance(tpu: TpuApi) -> Callable[[EndpointTarget], str]:
    """The Compute Engine instance name IAP tunnels to, for a target on either back end.

    Compute Engine: the instance is the node. Cloud TPU API: the TPU VM's worker-0 ``hostname`` guest attribute,
    which is what ``gcloud compute tpus tpu-vm ssh --tunnel-through-iap`` tunnels to (googlecloudsdk
    ``command_lib/compute/tpus/tpu_vm/ssh.py``). The value is the VM's text; ``tunnel_argv`` checks it.
    """

    def instance(target: EndpointTarget) -> str:
        if target.backend is Backend.COMPUTE_ENGINE:
            return target.node
        try:
            attributes = tpu.guest_attributes(target.zone, target.node, "")
        except CloudError as exc:
            if exc.error_class is ErrorClass.PERMISSION:
                raise EndpointAccessError(
                    ErrorClass.PERMISSION,
                    "endpoint_access",
                    f"reading the hostname of TPU node {target.node} (nodes.getGuestAttributes) was refused",
                    "grant your account tpu.nodes.get (Terraform: endpoint_tunnel_principals gets the "
                    "tpuctlEndpointTunnel role)",
                ) from None
            if exc.error_class is ErrorClass.NOT_FOUND:
                raise EndpointAccessError(
                    ErrorClass.NOT_FOUND,
                    "deployment_id",
                    f"TPU node {target.node} in {target.zone} no longer exists",
                    f"check tpu_status(deployment_id='{target.deployment_id}'); the controller is replacing it",
                ) from None
            raise EndpointAccessError(
                ErrorClass.TRANSIENT,
                "endpoint_access",
                f"could not read the hostname of TPU node {target.node}: {exc.error_class.value}",
                "retry in a few seconds",
            ) from None
        for attribute in attributes:
            if attribute.worker == 0 and attribute.key == "hostname" and attribute.value.strip():
                return attribute.value.strip()
        raise EndpointAccessError(
            ErrorClass.FAILED_PRECONDITION,
            "endpoint_access",
            f"TPU node {target.node} has not published its hostname guest attribute, which IAP needs",
            "wait until the VM has booted; the organisation policy compute.disableGuestAttributesAccess must not be "
            "enforced",
        )

    return instance


@dataclass
class _Tunnel:
    process: subprocess.Popen[bytes]
    local_port: int
    instance: str
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=_STDERR_LINES))
    reader: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def stderr_text(self) -> str:
        return "\n".join(self.stderr)


class IapTunnels:
    """Implements ``EndpointAccess`` with ``gcloud compute start-iap-tunnel`` child processes.

    ``instance_of`` names the instance for a target (``tpu_vm_instance``); ``environ`` is the environment the
    child's is filtered from (default: this process's); ``gcloud`` is looked up on its ``PATH``.
    """

    def __init__(
        self,
        *,
        project: str | None,
        instance_of: Callable[[EndpointTarget], str],
        gcloud: str = "gcloud",
        environ: Mapping[str, str] | None = None,
        open_timeout_s: float = 30.0,
        stop_timeout_s: float = 5.0,
    ) -> None:
        self._project = project
        self._instance_of = instance_of
        self._gcloud = gcloud
        self._environ = environ
        self.open_timeout_s = open_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._tunnels: dict[tuple[str, str, str, str], _Tunnel] = {}
        self._lock = threading.Lock()
        self._at_exit = False

    def base_url(self, target: EndpointTarget) -> str:
        scheme, remote_port = _scheme_and_port(target.endpoint)
        key = (target.zone, target.node, target.endpoint, target.deployment_id)
        with self._lock:
            tunnel = self._tunnels.get(key)
            if tunnel is None or not tunnel.alive:
                if tunnel is not None:
                    log.warning(
                        "iap tunnel ended; reopening",
                        extra={"deployment_id": target.deployment_id, "detail": _last_error(tunnel.stderr_text())},
                    )
                    self._stop(tunnel)
                tunnel = self._open(target, remote_port)
                self._tunnels[key] = tunnel
        return f"{scheme}://{_LOOPBACK}:{tunnel.local_port}"

    def close(self) -> None:
        with self._lock:
            tunnels = list(self._tunnels.values())
            self._tunnels.clear()
        for tunnel in tunnels:
            self._stop(tunnel)

    def pids(self) -> list[int]:
        """Process ids of the open tunnels (their process groups carry the same ids)."""
        with self._lock:
            return [t.process.pid for t in self._tunnels.values() if t.alive]

    # ---- opening and stopping

    def _open(self, target: EndpointTarget, remote_port: int) -> _Tunnel:
        # Every value is checked before anything is asked (the TPU API) or started (gcloud).
        _check_place(target.zone, self._project)
        _check_port("remote_port", remote_port)
        instance = self._instance_of(target)
        _check(instance, _INSTANCE, "instance", "a Compute Engine instance name: lower-case letters, digits, '-'")
        environ = dict(os.environ if self._environ is None else self._environ)
        executable = shutil.which(self._gcloud, path=environ.get("PATH", os.defpath))
        if executable is None:
            raise EndpointAccessError(
                ErrorClass.FAILED_PRECONDITION, "gcloud", f"'{self._gcloud}' was not found on PATH", FIX_INSTALL
            )
        child_env = child_environment(environ)
        failure: EndpointAccessError | None = None
        for _ in range(_PORT_ATTEMPTS):
            local_port = _free_port()
            argv = tunnel_argv(executable, instance, remote_port, local_port, target.zone, self._project)
            tunnel = self._start(argv, child_env, instance, local_port)
            failure = self._wait_until_listening(tunnel, target)
            if failure is None:
                log.info(
                    "iap tunnel open",
                    extra={
                        "deployment_id": target.deployment_id,
                        "instance": instance,
                        "zone": target.zone,
                        "local_port": tunnel.local_port,
                    },
                )
                return tunnel
            self._stop(tunnel)
            if "address already in use" not in tunnel.stderr_text().lower():
                break
        assert failure is not None
        raise failure

    def _start(self, argv: list[str], env: dict[str, str], instance: str, local_port: int) -> _Tunnel:
        try:
            process = subprocess.Popen(  # an argv list of checked values, never a shell
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,  # its own process group, stopped as a whole
                close_fds=True,
            )
        except OSError as exc:
            raise EndpointAccessError(
                ErrorClass.FAILED_PRECONDITION, "gcloud", f"could not start gcloud ({exc.strerror})", FIX_INSTALL
            ) from None
        if not self._at_exit:
            atexit.register(self.close)
            self._at_exit = True
        tunnel = _Tunnel(process=process, local_port=local_port, instance=instance)
        tunnel.reader = threading.Thread(target=_drain, args=(process, tunnel.stderr), daemon=True, name="iap-stderr")
        tunnel.reader.start()
        return tunnel

    def _wait_until_listening(self, tunnel: _Tunnel, target: EndpointTarget) -> EndpointAccessError | None:
        deadline = time.monotonic() + self.open_timeout_s
        while time.monotonic() < deadline:
            if not tunnel.alive:
                if tunnel.reader is not None:
                    tunnel.reader.join(timeout=1.0)
                return _classify(tunnel.stderr_text(), tunnel.instance, target)
            if _accepts(tunnel.local_port) and tunnel.alive:
                return None
            time.sleep(_POLL_S)
        return EndpointAccessError(
            ErrorClass.TRANSIENT,
            "endpoint_access",
            f"the IAP tunnel to {tunnel.instance} ({target.zone}) did not open within {self.open_timeout_s:g} s"
            + _detail(tunnel.stderr_text()),
            f"check `gcloud compute start-iap-tunnel {tunnel.instance} 8000 --zone={target.zone}` by hand; "
            + FIX_FIREWALL,
        )

    def _stop(self, tunnel: _Tunnel) -> None:
        process = tunnel.process
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=self.stop_timeout_s)
        # The group may outlive its leader (gcloud's wrapper and its Python): make sure nothing of it remains.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        if tunnel.reader is not None:
            tunnel.reader.join(timeout=1.0)
            if tunnel.reader.is_alive():
                # Something outside the group still holds the pipe: closing it now would block on the reader.
                log.warning("iap tunnel stopped but its stderr is still open", extra={"pid": process.pid})
                return
        if process.stderr is not None:
            process.stderr.close()


def _check(value: object, pattern: re.Pattern[str], name: str, expected: str) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        shown = scrub_untrusted(str(value), 80)[0]
        raise EndpointAccessError(
            ErrorClass.INVALID,
            name,
            f"{shown!r} is not {expected}; nothing was started",
            "check the deployment with tpu_status(deployment_id=ID); a recorded value outside this pattern is never "
            "passed to gcloud",
        )


def _check_place(zone: str, project: str | None) -> None:
    _check(zone, _ZONE, "zone", "a zone such as us-central1-b")
    if project is not None:
        _check(project, _PROJECT, "project", "a project id (TPUCTL_PROJECT)")


def _check_port(name: str, port: object) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise EndpointAccessError(
            ErrorClass.INVALID, name, f"{port!r} is not a TCP port", "the endpoint must name a port 1-65535"
        )


def _scheme_and_port(endpoint: str) -> tuple[str, int]:
    """``http://10.0.0.5:8000`` -> (http, 8000); a bare ``host[:port]`` (Compute Engine) is http on 8000."""
    text = endpoint.strip()
    parts = urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise EndpointAccessError(
            ErrorClass.INVALID,
            "endpoint",
            "the recorded endpoint is not an http(s) URL with a host",
            "check the deployment with tpu_status(deployment_id=ID)",
        )
    return parts.scheme, port or _DEFAULT_VLLM_PORT


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((_LOOPBACK, 0))
        return int(probe.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((_LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _drain(process: subprocess.Popen[bytes], lines: deque[str]) -> None:
    stream = process.stderr
    if stream is None:
        return
    with contextlib.suppress(ValueError, OSError):
        for raw in iter(stream.readline, b""):
            lines.append(raw.decode("utf-8", errors="replace").rstrip())


def _last_error(stderr: str) -> str:
    """gcloud's last error with the lines that continue it (or the last line), one line, bounded, scrubbed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    starts = [index for index, line in enumerate(lines) if line.startswith("ERROR")]
    chosen = lines[starts[-1] :] if starts else lines[-1:]
    return scrub_untrusted(" ".join(chosen), 300)[0]


def _detail(stderr: str) -> str:
    last = _last_error(stderr)
    return f" (gcloud: {last})" if last else ""


def _classify(stderr: str, instance: str, target: EndpointTarget) -> EndpointAccessError:
    """gcloud ended before it listened: say why, by what its error says (IAP's close codes are in it)."""
    text = stderr.lower()
    detail = _detail(stderr)
    if "4033" in text or "not authorized" in text or "iap.tunnelinstances.accessviaiap" in text:
        return EndpointAccessError(
            ErrorClass.PERMISSION, "endpoint_access", f"IAP refused the tunnel to {instance}{detail}", FIX_IAM
        )
    if "4003" in text or "failed to connect to backend" in text:
        return EndpointAccessError(
            ErrorClass.FAILED_PRECONDITION,
            "endpoint_access",
            f"IAP could not reach port 8000 on {instance}{detail}",
            FIX_FIREWALL,
        )
    if "gcloud auth login" in text or "no credentialed accounts" in text or "reauthentication" in text:
        return EndpointAccessError(
            ErrorClass.PERMISSION, "endpoint_access", f"gcloud has no usable login{detail}", FIX_LOGIN
        )
    if "compute.instances.get" in text or "was not found" in text:
        return EndpointAccessError(
            ErrorClass.FAILED_PRECONDITION,
            "endpoint_access",
            f"gcloud could not look up instance {instance} in {target.zone}{detail}",
            FIX_LOOKUP,
        )
    return EndpointAccessError(
        ErrorClass.TRANSIENT,
        "endpoint_access",
        f"the IAP tunnel to {instance} ({target.zone}) ended before it listened{detail}",
        f"retry; if it persists run `gcloud compute start-iap-tunnel {instance} 8000 --zone={target.zone}` "
        "by hand to see why",
    )
