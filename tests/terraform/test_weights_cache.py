"""The regional weights cache in Terraform, offline over the python-hcl2 parse (no terraform binary here).

One Standard bucket per region of ``weights_cache_regions``: regional, private, a cache (objects expire, no soft
delete, abandoned multipart uploads aborted); the TPU VM account may use weights/ (objectUser) and read compile/, the
prewarm builder may use both (test_compile_cache_iam.py), the provision function may
read it (objectViewer), nobody else is granted anything on it; the functions get the buckets and the cross-region
switch in the form shared/config.py reads them. Variable validations are checked by evaluating the condition
Terraform would, after pinning its exact text, so a changed condition fails here first.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest

from shared.config import Settings
from tests.support.terraform_config import TERRAFORM_ROOT, ModuleDir, find_references, load_module, load_tree

ENV = TERRAFORM_ROOT / "envs" / "default"
IDENTITIES = TERRAFORM_ROOT / "modules" / "identities"
FUNCTIONS = ("provision", "monitor", "benchmark")
BUCKETS_MAP = "{for region, bucket in google_storage_bucket.weights_cache : region => bucket.name}"
VM_MEMBER = "serviceAccount:${google_service_account.tpu_vm.email}"
# Long region names that exist, and a 30-character project id with a 12-character prefix (the variables' maxima).
LONG_REGIONS = ("northamerica-northeast2", "australia-southeast2", "southamerica-east1", "europe-southwest1")
LONGEST_PROJECT, LONGEST_PREFIX = "p" + "x" * 28 + "1", "abcdefghijkl"


@pytest.fixture(scope="module")
def env() -> ModuleDir:
    return load_module(ENV)


@pytest.fixture(scope="module")
def bucket(env: ModuleDir) -> dict[str, Any]:
    return env.resources["google_storage_bucket", "weights_cache"]


def _one(block: Any) -> dict[str, Any]:
    assert isinstance(block, list) and len(block) == 1, block
    return block[0]


# --- the bucket ---------------------------------------------------------------------------------


def test_one_regional_standard_bucket_per_region(env: ModuleDir, bucket: dict[str, Any]) -> None:
    assert bucket["for_each"] == "${toset(local.weights_cache_regions)}"
    assert bucket["location"] == "${upper(each.key)}", "regional: the bucket lives in the region it serves"
    assert bucket["storage_class"] == "STANDARD"
    assert bucket["uniform_bucket_level_access"] is True
    assert bucket["public_access_prevention"] == "enforced"
    assert bucket["force_destroy"] == env.resources["google_storage_bucket", "debug_bundles"]["force_destroy"]
    assert bucket["project"] == "${local.project_id}"
    assert bucket["labels"].startswith('${merge(local.labels, {component = "weights-cache"')
    # null: the functions' region alone (no zones variable to derive regions from); [] is no cache at all.
    assert env.variables["weights_cache_regions"]["default"] is None
    assert env.locals["weights_cache_regions"] == (
        "${distinct(var.weights_cache_regions == null ? [var.region] : var.weights_cache_regions)}"
    )


def test_a_cache_expires_keeps_no_soft_deleted_copies_and_aborts_stale_uploads(bucket: dict[str, Any]) -> None:
    assert _one(bucket["soft_delete_policy"]) == {"retention_duration_seconds": 0}
    assert "versioning" not in bucket, "a replaced cache object must not linger as a billed noncurrent version"
    rules = {_one(rule["action"])["type"]: _one(rule["condition"]) for rule in bucket["lifecycle_rule"]}
    assert rules == {
        "Delete": {"age": "${var.weights_cache_max_age_days}"},
        "AbortIncompleteMultipartUpload": {"age": 1},
    }


def _bucket_name(project: str, prefix: str, region: str) -> str:
    """local.weights_cache_bucket_names, in Python (its HCL text is pinned below)."""
    full = f"{project}-{prefix}-weights-{region}"
    return full if len(full) <= 63 else f"{prefix}-weights-{region}-{hashlib.sha256(project.encode()).hexdigest()[:8]}"


def test_bucket_names_follow_the_others_and_always_fit_63_characters(env: ModuleDir, bucket: dict[str, Any]) -> None:
    from shared.domain.weights_cache import check_cache_buckets

    assert bucket["name"] == "${local.weights_cache_bucket_names[each.key]}"
    full = "${var.project_id}-${var.name_prefix}-weights-${region}"
    assert env.locals["weights_cache_bucket_names"] == (
        f'${{{{for region in local.weights_cache_regions : region => (length("{full}") <= 63 ? "{full}" : '
        '"${var.name_prefix}-weights-${region}-${substr(sha256(var.project_id), 0, 8)}")}}'
    )
    assert env.resources["google_storage_bucket", "debug_bundles"]["name"].startswith(
        "${var.project_id}-${var.name_prefix}-"
    )
    assert _bucket_name("my-tpu-project", "tpuctl", "us-east5") == "my-tpu-project-tpuctl-weights-us-east5"
    names = {region: _bucket_name(LONGEST_PROJECT, LONGEST_PREFIX, region) for region in (*LONG_REGIONS, "us-east5")}
    assert all(len(name) <= 63 for name in names.values()), names
    assert names["us-east5"].startswith(LONGEST_PROJECT), "a name that fits keeps the project id"
    assert len(set(names.values())) == len(names)
    assert check_cache_buckets(names) == names, "the functions accept every name Terraform can make"


# --- who may touch it ---------------------------------------------------------------------------


def test_the_vm_may_use_the_caches_the_provisioner_and_gateway_read_them_and_no_one_else(env: ModuleDir) -> None:
    identities = load_module(IDENTITIES)
    assert env.modules["identities"]["weights_cache_buckets"] == f"${{{BUCKETS_MAP}}}"
    vm = identities.resources["google_storage_bucket_iam_member", "tpu_vm_weights_cache_user"]
    assert vm == {
        "for_each": "${var.weights_cache_buckets}",
        "bucket": "${each.value}",
        "role": "roles/storage.objectUser",  # restore, fill, replace a corrupt object; never admin or IAM
        "member": VM_MEMBER,
        "condition": [
            {
                "title": "weights-only",
                "description": "Only objects under weights/ (the VM never lists the bucket).",
                "expression": 'resource.name.startsWith("projects/_/buckets/${each.value}/objects/weights/")',
            }
        ],
    }
    gateway = identities.resources["google_storage_bucket_iam_member", "gateway_weights_cache_reader"]
    assert gateway["role"] == "roles/storage.objectViewer" and gateway["member"] == "${each.value.member}"
    assert "var.gateway_principals" in gateway["for_each"] and "var.weights_cache_buckets" in gateway["for_each"]
    provision = env.resources["google_storage_bucket_iam_member", "provision_weights_cache_reader"]
    assert provision == {
        "for_each": "${google_storage_bucket.weights_cache}",
        "bucket": "${each.value.name}",
        "role": "roles/storage.objectViewer",
        "member": "${module.provision.service_account_member}",
    }
    # Every IAM resource in the tree that names a weights-cache bucket is one of those two.
    on_cache = []
    for module in load_tree():
        for (type_name, name), body in module.resources.items():
            if "_iam_" not in type_name:
                continue
            text = json.dumps(body)
            if "weights_cache" in text:
                on_cache.append((module.name, type_name, name))
    assert sorted(on_cache) == [
        ("envs/default", "google_storage_bucket_iam_member", "provision_weights_cache_reader"),
        ("modules/identities", "google_storage_bucket_iam_member", "gateway_weights_cache_reader"),
        ("modules/identities", "google_storage_bucket_iam_member", "tpu_builder_compile_cache_writer"),
        ("modules/identities", "google_storage_bucket_iam_member", "tpu_builder_weights_cache_user"),
        ("modules/identities", "google_storage_bucket_iam_member", "tpu_vm_compile_cache_reader"),
        ("modules/identities", "google_storage_bucket_iam_member", "tpu_vm_weights_cache_user"),
    ]
    # The VMs' grants (test_compile_cache_iam.py checks the compile/ ones) and the gateway's read are the only uses
    # of the module variable (no other role on them).
    uses = {
        name
        for (type_name, name), body in identities.resources.items()
        if any(r.kind == "var" and r.target[0] == "weights_cache_buckets" for r in find_references({name: body}))
    }
    assert uses == {
        "tpu_vm_weights_cache_user",
        "tpu_vm_compile_cache_reader",
        "tpu_builder_weights_cache_user",
        "tpu_builder_compile_cache_writer",
        "gateway_weights_cache_reader",
    }, uses
    # No other module call receives the buckets themselves (the functions get their names as settings only).
    for call, args in env.modules.items():
        if call != "identities":
            assert "google_storage_bucket.weights_cache" not in json.dumps(args), call


# --- what the functions are told ----------------------------------------------------------------


def test_every_function_gets_the_buckets_and_the_cross_region_switch(env: ModuleDir) -> None:
    environment = env.locals["function_environment"]
    assert environment["TPUCTL_WEIGHTS_CACHE_BUCKETS"] == f"${{jsonencode({BUCKETS_MAP})}}"
    assert environment["TPUCTL_WEIGHTS_CACHE_CROSS_REGION"] == "${tostring(var.weights_cache_cross_region)}"
    assert env.variables["weights_cache_cross_region"] == {
        "description": env.variables["weights_cache_cross_region"]["description"],
        "type": "bool",
        "default": False,
    }
    for name in FUNCTIONS:
        passed = env.modules[name]["environment_variables"]
        assert "local.function_environment" in passed, name  # where TPUCTL_DEBUG_BUNDLE_BUCKET comes from too
    assert env.outputs["weights_cache_buckets"]["value"] == f"${{{BUCKETS_MAP}}}"
    assert env.outputs["weights_cache_buckets"]["description"]


def test_the_settings_read_what_terraform_renders(monkeypatch: pytest.MonkeyPatch) -> None:
    """jsonencode of region -> name and tostring(bool) are what Settings parses."""
    monkeypatch.setenv("TPUCTL_WEIGHTS_CACHE_BUCKETS", json.dumps({"us-east5": "p-tpuctl-weights-us-east5"}))
    monkeypatch.setenv("TPUCTL_WEIGHTS_CACHE_CROSS_REGION", "true")
    settings = Settings()
    assert settings.weights_cache_buckets == {"us-east5": "p-tpuctl-weights-us-east5"}
    assert settings.weights_cache_cross_region is True
    monkeypatch.setenv("TPUCTL_WEIGHTS_CACHE_BUCKETS", "{}")  # weights_cache_regions = []
    monkeypatch.setenv("TPUCTL_WEIGHTS_CACHE_CROSS_REGION", "false")
    settings = Settings()
    assert settings.weights_cache_buckets == {} and settings.weights_cache_cross_region is False


# --- variable validations -----------------------------------------------------------------------


def _region_validation(env: ModuleDir) -> re.Pattern[str]:
    condition = _one(env.variables["weights_cache_regions"]["validation"])["condition"]
    match = re.fullmatch(
        r"\$\{var\.weights_cache_regions == null \? true : alltrue\(\[for region in var\.weights_cache_regions : "
        r'can\(regex\("(.+)", region\)\)\]\)\}',
        condition,
    )
    assert match, f"the region validation changed shape: {condition!r}"
    return re.compile(match.group(1).replace("\\\\", "\\"))


def _regions_valid(pattern: re.Pattern[str], regions: list[str] | None) -> bool:
    """What the condition evaluates to (Terraform's regex() is a search; the pattern is anchored)."""
    return regions is None or all(pattern.search(region) for region in regions)


@pytest.mark.parametrize(
    ("regions", "valid"),
    [
        (None, True),
        ([], True),
        (["us-central1", "us-east5", "europe-west4"], True),
        (["northamerica-northeast2"], True),
        (["us-east5-b"], False),  # a zone
        (["US"], False),  # a multi-region
        (["us-central1", "Us-East5"], False),
        (["us-central"], False),
        (["useast5"], False),
        ([""], False),
    ],
)
def test_the_region_validation_rejects_what_is_not_a_region(
    env: ModuleDir, regions: list[str] | None, valid: bool
) -> None:
    assert _regions_valid(_region_validation(env), regions) is valid


def test_the_region_validation_agrees_with_the_functions() -> None:
    from shared.domain.weights_cache import check_cache_buckets

    pattern = _region_validation(load_module(ENV))
    for region in ("us-east5", "us-east5-b", "US", "europe-west4"):
        accepted = True
        try:
            check_cache_buckets({region: "p-tpuctl-weights-x"})
        except ValueError:
            accepted = False
        assert accepted is bool(pattern.search(region)), region


@pytest.mark.parametrize(
    ("days", "valid"), [(1, True), (60, True), (3650, True), (0, False), (3651, False), (1.5, False)]
)
def test_the_max_age_validation_bounds_the_days(env: ModuleDir, days: float, valid: bool) -> None:
    variable = env.variables["weights_cache_max_age_days"]
    assert variable["type"] == "number" and variable["default"] == 60
    condition = _one(variable["validation"])["condition"]
    name = "var.weights_cache_max_age_days"
    match = re.fullmatch(rf"\$\{{{name} >= (\d+) && {name} <= (\d+) && floor\({name}\) == {name}\}}", condition)
    assert match, f"the max-age validation changed shape: {condition!r}"
    low, high = int(match.group(1)), int(match.group(2))
    assert (low, high) == (1, 3650)
    assert (low <= days <= high and float(days).is_integer()) is valid
