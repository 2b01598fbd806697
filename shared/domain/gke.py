"""Render a Kubernetes Deployment and Service that serve the plan's vLLM launch on a GKE TPU node pool.

Why: the reference agent shipped a manifest that could not run. This one is the same launch as the TPU VM
(``shared.domain.launch``) adapted to a pod: TPU node selectors and ``google.com/tpu`` limits, an init
container that downloads the weights with the Hugging Face token mounted from a Secret (``HF_TOKEN_PATH``,
never an env value), the serving container offline with the API key read from a mounted Secret by the same
wrapper as on the VM, and distinct startup, readiness and liveness probes on ``/health``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from shared.domain.catalog import AcceleratorSpec
from shared.domain.launch import API_KEY_MOUNT_DIR, VllmLaunch

__all__ = ["GkeOptions", "render_gke_manifest"]

HF_TOKEN_MOUNT_DIR = "/run/secrets/tpuctl-hf"  # noqa: S105 - a mount path, not a secret


class _PlainDumper(yaml.SafeDumper):
    """Safe dumper that writes repeated values out instead of YAML anchors (kubectl diff reads cleaner)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


STARTUP_PROBE_PERIOD_S = 10


@dataclass(frozen=True, slots=True)
class GkeOptions:
    """Names in the cluster; the Secrets must exist (created from Secret Manager by the operator or ESO)."""

    name: str
    namespace: str = "default"
    api_key_secret: str = "tpuctl-vllm-api-key"  # noqa: S105 - name of a Secret with key "vllm-api-key"
    hf_token_secret: str = "tpuctl-hf-token"  # noqa: S105 - name of a Secret with key "hf-token"
    cache_claim: str | None = None  # a PersistentVolumeClaim for the HF and XLA caches; None = emptyDir
    cache_size_gi: int = 200


def _labels(options: GkeOptions) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": options.name, "managed-by": "tpuctl"}


def _probe(path: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _pod_argv(launch: VllmLaunch) -> list[str]:
    """The launch argv with the bind address opened to the pod network (the Service fronts it)."""
    argv = list(launch.argv)
    host_at = argv.index("--host") + 1
    argv[host_at] = "0.0.0.0"
    return argv


def render_gke_manifest(launch: VllmLaunch, slice_: AcceleratorSpec, model_revision: str, options: GkeOptions) -> str:
    """Deployment + Service YAML (two documents) for one serving plan."""
    labels = _labels(options)
    cache_mounts = [
        {"name": "cache", "mountPath": launch.hf_cache_dir, "subPath": "hf"},
        {"name": "cache", "mountPath": launch.vllm_cache_dir, "subPath": "vllm"},
    ]
    pod_spec = {
        "nodeSelector": {
            "cloud.google.com/gke-tpu-accelerator": slice_.gke_accelerator,
            "cloud.google.com/gke-tpu-topology": slice_.topology,
        },
        "terminationGracePeriodSeconds": 60,
        "automountServiceAccountToken": False,
        "initContainers": [_download_container(launch, model_revision, cache_mounts)],
        "containers": [_serving_container(launch, slice_, cache_mounts)],
        "volumes": _volumes(options),
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": options.name, "namespace": options.namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # the TPU slice cannot hold two pods at once
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": options.name, "namespace": options.namespace, "labels": labels},
        "spec": {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [{"name": "http", "port": launch.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return yaml.dump_all([deployment, service], Dumper=_PlainDumper, sort_keys=False, default_flow_style=False)


def _download_container(launch: VllmLaunch, model_revision: str, cache_mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The init container: fetch the weights with the token from a mounted Secret, so serving runs offline."""
    return {
        "name": "download-weights",
        "image": launch.image,
        "command": [
            "python3",
            "-c",
            "import sys; from huggingface_hub import snapshot_download; "
            "snapshot_download(repo_id=sys.argv[1], revision=sys.argv[2] or None)",
            launch.argv[2],
            model_revision,
        ],
        "env": [
            {"name": "HF_HOME", "value": launch.hf_cache_dir},
            {"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_MOUNT_DIR}/hf-token"},
            {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        ],
        "volumeMounts": [*cache_mounts, {"name": "hf-token", "mountPath": HF_TOKEN_MOUNT_DIR, "readOnly": True}],
    }


def _serving_container(
    launch: VllmLaunch, slice_: AcceleratorSpec, cache_mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    """The vLLM container: the VM's launch on the pod network, holding the slice's chips, with its probes."""
    tpu = {"google.com/tpu": str(slice_.chips)}
    return {
        "name": "vllm",
        "image": launch.image,
        "command": list(launch.command),
        "args": _pod_argv(launch),
        "env": [{"name": name, "value": value} for name, value in launch.env],
        "ports": [{"name": "http", "containerPort": launch.port}],
        "resources": {"requests": dict(tpu), "limits": dict(tpu)},
        "volumeMounts": [
            *cache_mounts,
            {"name": "api-key", "mountPath": API_KEY_MOUNT_DIR, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},  # noqa: S108 - the pod's own memory-backed volume
        ],
        # First start compiles for 10-40 min (docs/reference/vllm.md §8.3): the startup probe allows the engine timeout.
        "startupProbe": _probe("/health", STARTUP_PROBE_PERIOD_S, launch.ready_timeout_s // STARTUP_PROBE_PERIOD_S),
        "readinessProbe": _probe("/health", 10, 3),
        "livenessProbe": _probe("/health", 30, 5, timeout=10),
    }


def _secret_volume(name: str, secret: str, key: str) -> dict[str, Any]:
    """A Secret mounted read-only by its owner, one key as one file."""
    return {"name": name, "secret": {"secretName": secret, "defaultMode": 0o400, "items": [{"key": key, "path": key}]}}


def _volumes(options: GkeOptions) -> list[dict[str, Any]]:
    """The caches (a claim, or scratch space), both Secrets and a memory-backed /dev/shm."""
    cache_volume: dict[str, Any] = (
        {"name": "cache", "persistentVolumeClaim": {"claimName": options.cache_claim}}
        if options.cache_claim
        else {"name": "cache", "emptyDir": {"sizeLimit": f"{options.cache_size_gi}Gi"}}
    )
    return [
        cache_volume,
        _secret_volume("api-key", options.api_key_secret, "vllm-api-key"),
        _secret_volume("hf-token", options.hf_token_secret, "hf-token"),
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
    ]
