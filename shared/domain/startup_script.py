"""Render the TPU VM startup script from a launch and a few deployment values.

Why: the script is the only code that runs on the VM before vLLM. Every value a user or a config can influence
goes through ``shlex.quote`` into a values block at the top; the rest of the template is fixed text, so no input
can change what the script does. Secrets are referenced by Secret Manager resource name only; the renderer
never sees a secret value.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from shared.domain.compile_cache import checked_key
from shared.domain.errors import InvalidMessage
from shared.domain.launch import API_KEY_MOUNT_DIR, KEY_WRAPPER, VllmLaunch
from shared.domain.startup_script_template import TEMPLATE
from shared.domain.weights_cache import check_cache_buckets

__all__ = [
    "BOOT_LOG_PREFIX",
    "BOOT_PHASES",
    "GUEST_ATTRIBUTE_NAMESPACE",
    "NODE_AGENT_DISTRIBUTION",
    "NODE_AGENT_MODULE",
    "SECRET_RESOURCE_PATTERN",
    "StartupScriptInputs",
    "node_agent_bundle_problem",
    "render_startup_script",
    "secret_resource",
    "sha256_problem",
    "values_block",
]

BOOT_LOG_PREFIX = "tpuctl-boot"
GUEST_ATTRIBUTE_NAMESPACE = "tpuctl"  # guest attributes tpuctl/phase and tpuctl/detail
BOOT_PHASES = (
    "booting",
    "installing",
    "secrets",
    "image",
    "weights",
    "starting",
    "node-agent",
    "compiling",
    "serving",
    "prewarmed",  # a prewarm builder filled the compile cache and stopped its engine: its deployment is done
    "failed",
)
NODE_AGENT_MODULE = "node_agent.agent"
# The wheel scripts/package_node_agent.py builds; the template installs it by this name (a test holds them equal).
NODE_AGENT_DISTRIBUTION = "tpuctl-node-agent"
NODE_AGENT_PREFIX = "node-agent/"  # the only prefix the TPU VM's account may read (terraform/modules/identities)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9_.-]{1,61}[a-z0-9]$")
_OBJECT_SEGMENT = re.compile(r"^[A-Za-z0-9_+=-][A-Za-z0-9._+=-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
SECRET_RESOURCE_PATTERN = re.compile(
    r"^projects/[a-z0-9-]{1,63}/secrets/[A-Za-z0-9_-]{1,255}/versions/([1-9][0-9]*|latest)$"
)
_SLOT = re.compile(r"@@[A-Z][A-Z0-9_]*@@")
VALUES_START = "# ---- values (rendered; every value is shell-quoted) ----"
VALUES_END = "# ---- end of values ----"
TPU_METRICS_PORT = 8431  # libtpu's runtime metrics service in the serving process: what tpu-info and the agent read
# First, so a launch's own env could still override it (docker keeps the last --env of a name).
SERVING_CONTAINER_ENV = (("TPU_RUNTIME_METRICS_PORTS", str(TPU_METRICS_PORT)),)


def secret_resource(project: str, secret: str, version: str = "latest") -> str:
    """``projects/P/secrets/S/versions/V``, checked, so the VM only ever holds a name."""
    resource = f"projects/{project}/secrets/{secret}/versions/{version}"
    if not SECRET_RESOURCE_PATTERN.fullmatch(resource):
        raise InvalidMessage(
            "secret", f"{resource!r} is not a Secret Manager version name", "projects/P/secrets/S/versions/N|latest"
        )
    return resource


def node_agent_bundle_problem(uri: str) -> str | None:
    """Why ``uri`` is not a ``gs://BUCKET/node-agent/...`` object the VM can fetch, or None when it is one."""
    if not uri.startswith("gs://"):
        return f"{uri!r} is not a gs:// URI"
    bucket, _, name = uri[len("gs://") :].partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket or bucket.startswith("goog"):
        return f"{bucket!r} is not a Cloud Storage bucket name (3-63 of a-z 0-9 - _ .)"
    if not name.startswith(NODE_AGENT_PREFIX) or len(name.encode()) > 1024:
        return f"object {name!r} is not under {NODE_AGENT_PREFIX} (the only prefix TPU VMs may read)"
    if not all(_OBJECT_SEGMENT.fullmatch(part) for part in name.split("/")):
        return f"object {name!r} has an empty, dot-leading or unusual path segment (use A-Z a-z 0-9 . _ + = -)"
    return None


def sha256_problem(digest: str) -> str | None:
    """Why ``digest`` is not a lower-case hex SHA-256, or None."""
    return None if _SHA256.fullmatch(digest) else f"{digest!r} is not 64 lower-case hex digits"


@dataclass(frozen=True, slots=True)
class StartupScriptInputs:
    """Everything the script needs. Plain strings: the renderer quotes each one; the plan validates them."""

    deployment_id: str
    launch: VllmLaunch
    model: str
    model_revision: str
    hf_token_secret: str  # Secret Manager resource name, "" when the model needs no token
    api_key_secret: str  # Secret Manager resource name
    node_agent_bundle: str  # gs:// URI of the node-agent wheelhouse bundle, "" to skip the node agent
    node_agent_bundle_sha256: str  # its SHA-256 (hex); the VM refuses a bundle with another digest
    node_agent_env: tuple[tuple[str, str], ...] = ()
    container_name: str = "tpuctl-vllm"
    weights_cache_buckets: tuple[tuple[str, str], ...] = ()  # (region, bucket): the VM reads its region's
    weights_cache_cross_region: bool = False
    compile_cache_key: str = ""  # shared.domain.compile_cache.compile_key of this plan and slice; "" = no cache
    prewarm: bool = False  # a builder: compile, fill the compile cache, serve nothing (COMPILE_CACHE_ROLE=fill)


def _check(field: str, value: str) -> str:
    if "\x00" in value:
        raise InvalidMessage(field, "contains a NUL byte", "remove it; bash strings cannot hold NUL")
    return value


def _quote(field: str, value: str) -> str:
    return shlex.quote(_check(field, value))


def _words(field: str, words: Iterable[str]) -> str:
    return "\n".join(f"  {_quote(field, word)}" for word in words)


def _env_flags(flag: str, field: str, pairs: Iterable[tuple[str, str]]) -> list[str]:
    words: list[str] = []
    for name, value in pairs:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise InvalidMessage(field, f"{name!r} is not an environment variable name", "use [A-Za-z_][A-Za-z0-9_]*")
        words += [flag, f"{name}={value}"]
    return words


def _weights_cache_args(inputs: StartupScriptInputs) -> list[str]:
    """``--cache REGION=BUCKET`` per cache (checked names), and ``--cross-region`` when allowed."""
    try:
        buckets = check_cache_buckets(dict(inputs.weights_cache_buckets))
    except ValueError as exc:
        raise InvalidMessage("weights_cache_buckets", str(exc), "use Terraform's weights_cache_buckets output") from exc
    words = [word for region, bucket in sorted(buckets.items()) for word in ("--cache", f"{region}={bucket}")]
    return [*words, "--cross-region"] if buckets and inputs.weights_cache_cross_region else words


def _compile_key(key: str) -> str:
    """The plan's compile cache key as the compile cache checks it; "" (no cache) passes."""
    try:
        return checked_key(key) if key else key
    except ValueError as exc:
        raise InvalidMessage("compile_cache_key", str(exc), "use compile_cache.compile_key") from exc


def plan_hash(launch: VllmLaunch, model_revision: str) -> str:
    """A short digest of what the container runs: a changed hash means the container must be replaced."""
    text = "\x1f".join((launch.image, *launch.argv, *(f"{k}={v}" for k, v in launch.env), model_revision))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _health_url(launch: VllmLaunch) -> str:
    host = "127.0.0.1" if launch.host == "0.0.0.0" else launch.host
    return f"http://{host}:{launch.port}/health"


def _first_token_body(launch: VllmLaunch) -> str:
    """The script's first request: one token of a fixed prompt, as a user's first completion would ask."""
    return json.dumps({"model": launch.served_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0})


def render_startup_script(inputs: StartupScriptInputs) -> str:
    """The bash startup script for one deployment."""
    launch = inputs.launch
    marker = "weights-" + hashlib.sha256(f"{inputs.model}\x1f{inputs.model_revision}".encode()).hexdigest()[:16]
    values = {
        "DEPLOYMENT_ID": _quote("deployment_id", inputs.deployment_id),
        "PLAN_HASH": _quote("plan_hash", plan_hash(launch, inputs.model_revision)),
        "IMAGE": _quote("image", launch.image),
        "MODEL": _quote("model", inputs.model),
        "MODEL_REVISION": _quote("model_revision", inputs.model_revision),
        "HF_TOKEN_SECRET": _quote("hf_token_secret", inputs.hf_token_secret),
        "API_KEY_SECRET": _quote("api_key_secret", inputs.api_key_secret),
        "CONTAINER": _quote("container_name", inputs.container_name),
        "HEALTH_URL": _quote("health_url", _health_url(launch)),
        "FIRST_TOKEN_BODY": _quote("served_name", _first_token_body(launch)),
        "SERVING_LISTEN": _quote("serving_listen", f"{launch.host}:{launch.port}"),
        "READY_TIMEOUT_S": _quote("ready_timeout_s", str(launch.ready_timeout_s)),
        "WEIGHTS_MARKER": _quote("weights_marker", marker),
        "COMPILE_CACHE_KEY": _quote("compile_cache_key", _compile_key(inputs.compile_cache_key)),
        "COMPILE_CACHE_ROLE": "fill" if inputs.prewarm else "serve",
        "NODE_AGENT_BUNDLE": _quote("node_agent_bundle", inputs.node_agent_bundle),
        "NODE_AGENT_BUNDLE_SHA256": _quote("node_agent_bundle_sha256", inputs.node_agent_bundle_sha256),
        "CONTAINER_HF_CACHE": _quote("hf_cache_dir", launch.hf_cache_dir),
        "CONTAINER_VLLM_CACHE": _quote("vllm_cache_dir", launch.vllm_cache_dir),
        "CONTAINER_KEY_DIR": _quote("api_key_dir", API_KEY_MOUNT_DIR),
        "KEY_WRAPPER": _quote("key_wrapper", KEY_WRAPPER),
        "KEY_WRAPPER_NAME": _quote("key_wrapper", launch.command[-1]),
        "VLLM_ARGV": _words("argv", launch.argv),
        "CONTAINER_ENV": _words("env", _env_flags("--env", "env", (*SERVING_CONTAINER_ENV, *launch.env))),
        "NODE_AGENT_ENV": _words("node_agent_env", _env_flags("--env", "node_agent_env", inputs.node_agent_env)),
        "WEIGHTS_CACHE_ARGS": _words("weights_cache_buckets", _weights_cache_args(inputs)),
        "LOG_PREFIX": BOOT_LOG_PREFIX,
        "TPU_METRICS_PORT": str(TPU_METRICS_PORT),
    }
    script = _SLOT.sub(lambda match: values[match.group(0)[2:-2]], TEMPLATE)
    leftover = _SLOT.search(script)
    if leftover:
        raise ValueError(f"startup script template: slot {leftover.group(0)} has no value")
    return script


def values_block(script: str) -> str:
    """The rendered values block (assignments only): what tests evaluate in bash to prove the quoting."""
    start = script.index(VALUES_START)
    end = script.index(VALUES_END)
    return script[start:end]
