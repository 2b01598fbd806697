"""Who may write the shared compile cache, in Terraform (offline, over the python-hcl2 parse).

shared/domain/compile_cache.py's trust model: an entry under ``compile/`` is executable code every later VM loads,
so only the prewarm builder's account (``tpuctl-tpu-builder``) may create, replace or delete one; a serving TPU VM
(``tpuctl-tpu-vm``, hostile once it parses prompts) may only read ``compile/``. The builder boots like any VM, so
it holds the serving account's boot grants (secrets, the node-agent bundle, weights/) but none of its node agent's,
and it is never a firewall target. The IAM conditions are
evaluated here on object names, as Cloud Storage would, so a condition that widens fails here first.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from shared.config import Settings
from shared.domain.compile_cache import COMPILE_PREFIX, archive_name, manifest_name
from tests.support.terraform_config import TERRAFORM_ROOT, ModuleDir, load_module, load_tree

ENV = TERRAFORM_ROOT / "envs" / "default"
IDENTITIES = TERRAFORM_ROOT / "modules" / "identities"
VM_MEMBER = "serviceAccount:${google_service_account.tpu_vm.email}"
BUILDER_MEMBER = "serviceAccount:${google_service_account.tpu_builder.email}"
BUCKET = "p-tpuctl-weights-us-east5"
# Predefined roles that hold storage.objects.create, .update or .delete (roles/storage.objectViewer holds none).
WRITE_ROLES = {
    "roles/storage.objectUser",
    "roles/storage.objectCreator",
    "roles/storage.objectAdmin",
    "roles/storage.admin",
    "roles/storage.legacyBucketWriter",
    "roles/storage.legacyBucketOwner",
    "roles/storage.legacyObjectOwner",
    "roles/editor",
    "roles/owner",
}
_STARTS_WITH = re.compile(r'^resource\.name\.startsWith\("projects/_/buckets/\$\{([^}]+)\}/objects/([^"]*)"\)$')
# A serving VM's grant -> the builder's grant that mirrors it (same bucket, role and condition).
# A builder runs no node agent: of the serving account's grants it lacks metric and trace writing, publishing
# events and keeping debug bundles (the node agent's); its project grant is log writing alone.
MIRRORED = {
    ("google_storage_bucket_iam_member", "tpu_vm_bundle_reader"): "tpu_builder_bundle_reader",
    ("google_storage_bucket_iam_member", "tpu_vm_weights_cache_user"): "tpu_builder_weights_cache_user",
    ("google_service_account_iam_member", "tpu_vm_users"): "tpu_builder_users",
}
BUILDER_ONLY = {
    ("google_storage_bucket_iam_member", "tpu_builder_compile_cache_writer"),
    ("google_project_iam_member", "tpu_builder"),
}
# Object names of the compile cache as the code writes them, and of the weights the VM may still write.
COMPILE_OBJECTS = (
    manifest_name("google/gemma-4-e4b-it", "0" * 32),
    archive_name("google/gemma-4-e4b-it", "0" * 32, "a" * 64),
    "compile/anything",
)
WEIGHTS_OBJECT = "weights/models--google--gemma-4-e4b-it/blobs/" + "b" * 64


@pytest.fixture(scope="module")
def identities() -> ModuleDir:
    return load_module(IDENTITIES)


@pytest.fixture(scope="module")
def env() -> ModuleDir:
    return load_module(ENV)


def _one(block: Any) -> dict[str, Any]:
    assert isinstance(block, list) and len(block) == 1, block
    return block[0]


def _covers(grant: dict[str, Any], bucket_value: str, bucket: str, name: str) -> bool:
    """Whether the grant applies to object ``name`` of ``bucket`` (``bucket_value``: what ``${each.value}`` is)."""
    if grant["bucket"] != bucket_value:
        return False
    if "condition" not in grant:
        return True
    expression = _one(grant["condition"])["expression"]
    match = _STARTS_WITH.fullmatch(expression)
    assert match, f"a condition this test cannot evaluate: {expression!r}"
    assert f"${{{match.group(1)}}}" == grant["bucket"], "the condition names another bucket than the grant's"
    return f"{bucket}/{name}".startswith(f"{bucket}/{match.group(2)}")


def _bucket_grants(member: str) -> dict[str, dict[str, Any]]:
    """Every bucket grant in the tree to ``member`` as the identities module writes it, by module and name."""
    found = {}
    for module in load_tree():
        for name, body in module.resources_of("google_storage_bucket_iam_member").items():
            if body["member"] == member:
                found[f"{module.name}:{name}"] = body
    return found


# --- the builder --------------------------------------------------------------------------------


def test_the_builder_is_its_own_account_and_alone_may_write_compile(identities: ModuleDir) -> None:
    account = identities.resources["google_service_account", "tpu_builder"]
    assert account["account_id"] == "${var.name_prefix}-tpu-builder"
    for prefix in ("ab", "abcdefghijkl"):  # name_prefix is 2-12 characters: the id fits IAM's 6-30
        assert 6 <= len(f"{prefix}-tpu-builder") <= 30
    grant = identities.resources["google_storage_bucket_iam_member", "tpu_builder_compile_cache_writer"]
    assert grant == {
        "for_each": "${var.weights_cache_buckets}",
        "bucket": "${each.value}",
        "role": "roles/storage.objectUser",  # create, replace (ifGenerationMatch) and delete an entry
        "member": BUILDER_MEMBER,
        "condition": [
            {
                "title": "compile-only",
                "description": grant["condition"][0]["description"],
                "expression": 'resource.name.startsWith("projects/_/buckets/${each.value}/objects/compile/")',
            }
        ],
    }
    assert all(_covers(grant, "${each.value}", BUCKET, name) for name in COMPILE_OBJECTS)
    assert not _covers(grant, "${each.value}", BUCKET, WEIGHTS_OBJECT), "compile/ only"
    assert not _covers(grant, "${each.value}", BUCKET, "compiled/x"), "the prefix ends with its slash"
    assert _STARTS_WITH.fullmatch(grant["condition"][0]["expression"]).group(2) == COMPILE_PREFIX  # type: ignore[union-attr]


def test_the_builder_boots_with_the_serving_vm_s_boot_grants_and_nothing_of_its_node_agent(
    identities: ModuleDir, env: ModuleDir
) -> None:
    for (type_name, vm_name), builder_name in MIRRORED.items():
        vm = identities.resources[type_name, vm_name]
        builder = identities.resources[type_name, builder_name]
        as_vm = json.loads(
            json.dumps(builder).replace("google_service_account.tpu_builder.", "google_service_account.tpu_vm.")
        )
        if type_name == "google_service_account_iam_member":
            as_vm["for_each"] = as_vm["for_each"].replace("tpu_builder_users", "tpu_vm_users")
        assert as_vm == vm, f"{builder_name} does not mirror {vm_name}"
    builder_grants = {
        (type_name, name)
        for (type_name, name), body in identities.resources.items()
        if "_iam_" in type_name and "tpu_builder" in json.dumps(body)
    }
    assert builder_grants == {(t, name) for (t, _vm), name in MIRRORED.items()} | BUILDER_ONLY
    assert identities.resources["google_project_iam_member", "tpu_builder"]["for_each"] == (
        '${toset(["roles/logging.logWriter"])}'
    )
    assert env.modules["identities"]["tpu_builder_users"] == {"provision": "${module.provision.service_account_member}"}
    secrets = env.modules["secrets"]["secrets"]
    for key in ("hf_token", "vllm_api_key"):
        assert "tpu_builder = module.identities.tpu_builder_member" in secrets[key]["accessors"], key
    assert "tpu_builder" not in json.dumps(secrets["event_key"]), "no VM reads the controller key"


def test_the_builder_is_never_a_firewall_target() -> None:
    """The vLLM (and SSH) rules admit traffic by network tag; no rule targets a service account, the builder's least."""
    rules = [
        (module.name, name, body)
        for module in load_tree()
        for name, body in module.resources_of("google_compute_firewall").items()
    ]
    assert rules, "no firewall rule found: the scanner is broken"
    for module, name, body in rules:
        assert "target_service_accounts" not in body, f"{module} {name}: target the node tag, not an account"
        assert body["target_tags"] == ["${var.node_tag}"], f"{module} {name}"
        assert "tpu_builder" not in json.dumps(body), f"{module} {name}"
    network_call = load_module(ENV).modules["network"]
    assert "tpu_builder" not in json.dumps(network_call), "the node tag is not the builder's"


def test_the_functions_and_operators_are_told_the_builder_account(env: ModuleDir, identities: ModuleDir) -> None:
    assert (
        env.locals["function_environment"]["TPUCTL_BUILDER_SERVICE_ACCOUNT"] == "${module.identities.tpu_builder_email}"
    )
    assert "builder_service_account" in Settings.model_fields
    assert env.outputs["tpu_builder_service_account"]["value"] == "${module.identities.tpu_builder_email}"
    assert identities.outputs["tpu_builder_email"]["value"] == "${google_service_account.tpu_builder.email}"
    assert identities.outputs["tpu_builder_member"]["value"] == BUILDER_MEMBER
    builder = "tpuctl-tpu-builder@my-tpu-project.iam.gserviceaccount.com"
    assert Settings(builder_service_account=builder).builder_service_account == builder


# --- the serving VM -----------------------------------------------------------------------------


def test_the_serving_vm_reads_compile_and_holds_no_write_role_that_covers_it(identities: ModuleDir) -> None:
    reader = identities.resources["google_storage_bucket_iam_member", "tpu_vm_compile_cache_reader"]
    assert reader["for_each"] == "${var.weights_cache_buckets}" and reader["member"] == VM_MEMBER
    assert reader["role"] == "roles/storage.objectViewer", "read only: no create, overwrite or delete"
    assert all(_covers(reader, "${each.value}", BUCKET, name) for name in COMPILE_OBJECTS)
    assert not _covers(reader, "${each.value}", BUCKET, WEIGHTS_OBJECT)
    grants = _bucket_grants(VM_MEMBER)
    assert "modules/identities:tpu_vm_weights_cache_user" in grants, "the scanner is broken"
    for where, grant in grants.items():
        if grant["role"] not in WRITE_ROLES:
            assert grant["role"] == "roles/storage.objectViewer", f"{where}: {grant['role']} is not known here"
            continue
        assert "condition" in grant, f"{where}: {grant['role']} on a whole bucket"
        for name in COMPILE_OBJECTS:
            assert not _covers(grant, grant["bucket"], BUCKET, name), f"{where}: {grant['role']} covers {name}"
    # Nor at project level, nor through the module's output anywhere else.
    for module in load_tree():
        for (type_name, resource), body in module.resources.items():
            member = str(body.get("member", ""))
            if "tpu_vm" in member and body.get("role") in WRITE_ROLES:
                assert type_name == "google_storage_bucket_iam_member", f"{module.name} {resource}: {body['role']}"
    project_roles = identities.resources["google_project_iam_member", "tpu_vm"]["for_each"]
    assert "storage" not in project_roles


def test_the_serving_vm_still_fills_weights(identities: ModuleDir) -> None:
    user = identities.resources["google_storage_bucket_iam_member", "tpu_vm_weights_cache_user"]
    assert user["role"] == "roles/storage.objectUser"
    assert _covers(user, "${each.value}", BUCKET, WEIGHTS_OBJECT)
