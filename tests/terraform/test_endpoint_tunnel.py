"""Workstation access to vLLM through IAP TCP forwarding, as Terraform lays it down (offline, python-hcl2).

The gateway's ``TPUCTL_ENDPOINT_ACCESS=iap`` (shared/adapters/iap_tunnel.py) needs three things in the project:
a firewall rule admitting IAP's range to the vLLM port of TPU VMs only, the IAP tunnel role for the operators
(limited to that port), and the two reads made before a tunnel opens. Its error messages name these by their
Terraform names, so the names are checked here against the code too.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest

from shared.adapters.iap_tunnel import FIX_FIREWALL, FIX_IAM, FIX_LOOKUP, IAP_RANGE
from shared.config import Settings
from shared.domain.launch import EngineConfig
from tests.support.terraform_config import TERRAFORM_ROOT, ModuleDir, load_module

ENV = TERRAFORM_ROOT / "envs" / "default"


@pytest.fixture(scope="module")
def env() -> ModuleDir:
    return load_module(ENV)


@pytest.fixture(scope="module")
def network() -> ModuleDir:
    return load_module(TERRAFORM_ROOT / "modules" / "network")


def _one(block: Any) -> dict[str, Any]:
    assert isinstance(block, list) and len(block) == 1 and isinstance(block[0], dict), block
    return block[0]


def test_iap_reaches_the_vllm_port_of_tpu_vms_and_nothing_else(env: ModuleDir, network: ModuleDir) -> None:
    rule = network.resources["google_compute_firewall", "iap_vllm"]
    assert network.locals["iap_range"] == IAP_RANGE == "35.235.240.0/20"
    assert rule["source_ranges"] == ["${local.iap_range}"], "IAP's forwarding range only"
    assert rule["target_tags"] == ["${var.node_tag}"], "tpuctl's TPU VMs only"
    assert rule["direction"] == "INGRESS"
    assert rule["allow"] == [{"protocol": "tcp", "ports": ["${tostring(var.vllm_port)}"]}], "the vLLM port only"
    assert _one(rule["log_config"])["metadata"] == "INCLUDE_ALL_METADATA"
    assert rule["count"] == "${var.allow_iap_vllm ? 1 : 0}"
    assert network.variables["allow_iap_vllm"]["default"] is True
    assert env.modules["network"]["allow_iap_vllm"] == "${var.allow_iap_vllm}"
    assert env.variables["allow_iap_vllm"]["default"] is True
    engine_port = next(f.default for f in fields(EngineConfig) if f.name == "port")
    assert env.variables["vllm_port"]["default"] == engine_port == 8000, "where the startup script's vLLM listens"


def test_the_iap_range_is_admitted_by_its_own_rule_not_by_the_general_one(env: ModuleDir, network: ModuleDir) -> None:
    assert env.variables["vllm_source_ranges"]["default"] == []
    general = network.resources["google_compute_firewall", "vllm"]
    assert general["count"] == "${length(var.vllm_source_ranges) > 0 ? 1 : 0}", "no empty rule without a range"
    assert general["source_ranges"] == "${var.vllm_source_ranges}"


def test_the_tunnel_role_is_opt_in_and_limited_to_the_vllm_port(env: ModuleDir) -> None:
    grant = env.resources["google_project_iam_member", "endpoint_tunnel"]
    assert grant["for_each"] == "${var.endpoint_tunnel_principals}"
    assert env.variables["endpoint_tunnel_principals"]["default"] == [], "nobody unless named"
    assert env.variables["endpoint_tunnel_principals"]["type"] == "${set(string)}"
    assert grant["role"] == "roles/iap.tunnelResourceAccessor" and grant["member"] == "${each.value}"
    assert _one(grant["condition"])["expression"] == "destination.port == ${var.vllm_port}", "not SSH, not any port"


def test_the_reads_before_a_tunnel_are_a_narrow_custom_role_for_the_same_principals(env: ModuleDir) -> None:
    role = env.resources["google_project_iam_custom_role", "endpoint_tunnel"]
    assert set(role["permissions"]) == {"compute.instances.get", "tpu.nodes.get"}
    assert role["count"] == "${length(var.endpoint_tunnel_principals) > 0 ? 1 : 0}"
    assert role["role_id"] == '${replace(var.name_prefix, "-", "_")}EndpointTunnel'
    lookups = env.resources["google_project_iam_member", "endpoint_tunnel_lookups"]
    assert lookups["for_each"] == "${var.endpoint_tunnel_principals}"
    assert lookups["role"] == "${google_project_iam_custom_role.endpoint_tunnel[0].id}"


def test_the_gateway_environment_turns_the_tunnel_on_when_the_firewall_admits_iap(env: ModuleDir) -> None:
    value = env.outputs["gateway_environment"]["value"]
    assert 'TPUCTL_ENDPOINT_ACCESS = var.allow_iap_vllm ? "iap" : "direct"' in value
    assert "endpoint_access" in Settings.model_fields
    for access in ("iap", "direct"):
        assert Settings(endpoint_access=access).endpoint_access == access


def test_the_fixes_the_gateway_prints_name_what_terraform_really_has(env: ModuleDir, network: ModuleDir) -> None:
    prefix = env.variables["name_prefix"]["default"]
    firewall = network.resources["google_compute_firewall", "iap_vllm"]["name"].replace("${var.name_prefix}", prefix)
    assert firewall in FIX_FIREWALL and "allow_iap_vllm" in FIX_FIREWALL and IAP_RANGE in FIX_FIREWALL
    assert "endpoint_tunnel_principals" in FIX_IAM and "roles/iap.tunnelResourceAccessor" in FIX_IAM
    role_id = env.resources["google_project_iam_custom_role", "endpoint_tunnel"]["role_id"]
    assert role_id.replace('${replace(var.name_prefix, "-", "_")}', prefix.replace("-", "_")) in FIX_LOOKUP
