"""The GKE manifest: a Deployment and Service that would run on a TPU node pool, with no secret in env."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from shared.domain.gke import GkeOptions
from shared.domain.launch import API_KEY_MOUNT_DIR
from shared.domain.models import ACCELERATOR_TYPES, MODEL_PRESET_NAMES, DeploymentSpec
from shared.domain.serving_plan import ServingEnvironment, ServingPlan, build_serving_plan

ENVIRONMENT = ServingEnvironment(project="tpuctl-test")


def plan_for(model: str, accelerator: str) -> ServingPlan:
    spec = DeploymentSpec(deployment_id="gke-check", model=model, accelerator=accelerator, zones=("us-east5-b",))
    return build_serving_plan(spec, ENVIRONMENT)


def documents(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment, service = yaml.safe_load_all(text)
    return deployment, service


@pytest.mark.parametrize("accelerator", ACCELERATOR_TYPES)
@pytest.mark.parametrize("model", MODEL_PRESET_NAMES)
def test_every_preset_renders_a_tpu_deployment_and_service(model: str, accelerator: str) -> None:
    plan = plan_for(model, accelerator)
    text = plan.gke_manifest()
    deployment, service = documents(text)
    pod = deployment["spec"]["template"]["spec"]
    (serving,) = pod["containers"]
    assert deployment["kind"] == "Deployment" and service["kind"] == "Service"
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": plan.slice.gke_accelerator,
        "cloud.google.com/gke-tpu-topology": plan.slice.topology,
    }
    assert serving["resources"]["limits"]["google.com/tpu"] == str(plan.slice.chips)
    assert serving["resources"]["requests"] == serving["resources"]["limits"]
    assert serving["image"] == plan.launch.image
    assert serving["command"] == list(plan.launch.command)
    expected_args = list(plan.launch.argv)
    expected_args[expected_args.index("--host") + 1] = "0.0.0.0"
    assert serving["args"] == expected_args
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert serving[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup = serving["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600
    assert "nightly" not in text and "latest" not in text
    assert "--api-key" not in text
    assert "privileged" not in text


@pytest.mark.parametrize("model", MODEL_PRESET_NAMES)
def test_no_container_gets_a_secret_through_its_environment(model: str) -> None:
    deployment, _ = documents(plan_for(model, "v6e-4").gke_manifest())
    pod = deployment["spec"]["template"]["spec"]
    for container in (*pod["initContainers"], *pod["containers"]):
        for variable in container.get("env", []):
            assert set(variable) == {"name", "value"}, "no valueFrom: secrets arrive as files"
            assert variable["name"] not in {"HF_TOKEN", "VLLM_API_KEY", "HUGGING_FACE_HUB_TOKEN"}
        assert "envFrom" not in container


def test_secrets_are_mounted_read_only_as_files() -> None:
    deployment, _ = documents(plan_for("gemma-4-31b", "v6e-8").gke_manifest(GkeOptions(name="g31")))
    pod = deployment["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["api-key"]["secret"]["secretName"] == "tpuctl-vllm-api-key"
    assert volumes["api-key"]["secret"]["defaultMode"] == 0o400
    assert volumes["hf-token"]["secret"]["items"] == [{"key": "hf-token", "path": "hf-token"}]
    (serving,) = pod["containers"]
    (download,) = pod["initContainers"]
    mounts = {mount["name"]: mount for mount in serving["volumeMounts"]}
    assert mounts["api-key"] == {"name": "api-key", "mountPath": API_KEY_MOUNT_DIR, "readOnly": True}
    assert "hf-token" not in mounts, "the serving container never sees the Hugging Face token"
    assert {m["name"] for m in download["volumeMounts"]} >= {"hf-token", "cache"}
    assert {e["name"]: e["value"] for e in download["env"]}["HF_TOKEN_PATH"].endswith("/hf-token")
    assert {e["name"]: e["value"] for e in serving["env"]}["HF_HUB_OFFLINE"] == "1"
    assert pod["automountServiceAccountToken"] is False


def test_the_service_selects_the_pods_and_exposes_the_vllm_port() -> None:
    deployment, service = documents(plan_for("gemma-4-e4b", "v6e-1").gke_manifest())
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_a_persistent_volume_claim_keeps_the_caches_across_pods() -> None:
    text = plan_for("gemma-4-e2b", "v6e-1").gke_manifest(GkeOptions(name="e2b", cache_claim="vllm-cache"))
    deployment, _ = documents(text)
    volumes = {volume["name"]: volume for volume in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["cache"] == {"name": "cache", "persistentVolumeClaim": {"claimName": "vllm-cache"}}
    assert "&id" not in text and "*id" not in text, "plain YAML without anchors"
