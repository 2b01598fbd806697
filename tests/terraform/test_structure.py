"""Structure of the Terraform tree, checked offline over the python-hcl2 parse (no terraform binary here).

These tests hold the infrastructure to the promises of issue 9 and docs/reference/reliability-security.md: every
stream has a dead-letter topic that someone reads, every function has its own identity and is
retried, no broad role is granted, no secret value is written down, and names, entry points,
settings and message routing agree with the Python code.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import BaseModel

from shared.adapters._pubsub_rules import parse_filter
from shared.config import Settings
from shared.domain.models import (
    FINDING_LOG_KIND,
    BenchmarkRun,
    CommandRecord,
    DeploymentRecord,
    DeploymentStatus,
    MonitorSample,
    NodeTask,
    Phase,
)
from shared.messages import PhaseChanged, ReconcileTick, decode_message
from shared.messages.contracts import KINDS, topic_for
from shared.messages.routing import FUNCTION_TRIGGERS
from tests.support.terraform_config import (
    REPO_ROOT,
    TERRAFORM_ROOT,
    ModuleDir,
    expressions,
    find_references,
    iter_values,
    load_module,
    load_tree,
    parse_file,
    resolve_locals,
)

ENV = TERRAFORM_ROOT / "envs" / "default"
FUNCTION_MODULE = "modules/event_function"
FUNCTIONS = ("provision", "monitor", "benchmark")
TOPIC_KEYS = ("commands", "ticks", "events", "node_tasks")
META_ARGUMENTS = {"source", "for_each", "count", "depends_on", "providers", "version"}

# Roles no identity here may hold. Any other "...admin" role needs a reason in JUSTIFIED_ADMIN_ROLES.
DENIED_ROLES = {
    "roles/owner",
    "roles/editor",
    "roles/viewer",
    "roles/iam.securityAdmin",
    "roles/iam.serviceAccountAdmin",
    "roles/iam.serviceAccountKeyAdmin",
    "roles/resourcemanager.projectIamAdmin",
    "roles/pubsub.admin",
    "roles/datastore.owner",
    "roles/secretmanager.admin",
    "roles/storage.admin",
    "roles/cloudscheduler.admin",
    "roles/run.admin",
    "roles/cloudfunctions.admin",
    "roles/tpu.admin",  # provision holds tpuctlProvisionTpu: the TPU calls it makes, no more (issue 17)
}
JUSTIFIED_ADMIN_ROLES: dict[str, str] = {}
# Permissions that are escalations anywhere else, allowed at project level in one custom role only, with why.
JUSTIFIED_PROJECT_PERMISSIONS = {
    "pubsub.subscriptions.setIamPolicy": (
        "modules/identities:node_channels",
        "node channels appear at run time and Pub/Sub has no resource-name IAM conditions; the controller grants "
        "each deployment's TPU VMs subscriber on their own channel (bound to the provision function only)",
    ),
}
# Roles that let the holder act as other accounts: never at project level, only on one account.
ACCOUNT_ROLES = {"roles/iam.serviceAccountUser", "roles/iam.serviceAccountTokenCreator"}
PUBLIC_MEMBERS = {"allUsers", "allAuthenticatedUsers"}


@pytest.fixture(scope="module")
def env() -> ModuleDir:
    return load_module(ENV)


@pytest.fixture(scope="module")
def function_calls(env: ModuleDir) -> dict[str, dict[str, Any]]:
    calls = {name: body for name, body in env.modules.items() if body["source"].endswith(FUNCTION_MODULE)}
    assert calls, "the environment composes no event_function modules"
    return calls


def _literal(value: Any) -> Any:
    """A value that is not an expression, or None."""
    if isinstance(value, str) and "${" in value:
        return None
    return value


def _key_of(expression: str, local: str) -> str:
    match = re.search(rf"local\.{local}\.(\w+)", expression)
    assert match, f"expected a reference to local.{local}.<stream>, found {expression!r}"
    return match.group(1)


def _attribute_type(type_text: str, attribute: str) -> str:
    """The declared type of one attribute in an ``object({...})`` type expression."""
    match = re.search(rf"\b{attribute} = (optional\((?:[^()]|\([^()]*\))*\)|\w+)", type_text)
    assert match, f"no attribute {attribute!r} in {type_text!r}"
    return match.group(1)


def _optional_default(type_text: str, attribute: str) -> str:
    """The default of an ``attribute = optional(string, "x")`` in an object type."""
    declared = _attribute_type(type_text, attribute)
    match = re.fullmatch(r'optional\(string, "([^"]*)"\)', declared)
    assert match, f'{attribute}: expected optional(string, "..."), found {declared!r}'
    return match.group(1)


def _single(block: Any, what: str) -> dict[str, Any]:
    assert isinstance(block, list) and len(block) == 1 and isinstance(block[0], dict), f"{what}: expected one block"
    return block[0]


# --- parsing and references ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", sorted(TERRAFORM_ROOT.rglob("*.tf")), ids=lambda p: p.relative_to(TERRAFORM_ROOT).as_posix()
)
def test_every_terraform_file_parses(path: Path) -> None:
    parsed = parse_file(path)
    assert parsed, f"{path} is empty"


def test_every_module_has_the_standard_shape_and_documented_typed_variables() -> None:
    for module in load_tree():
        assert {"main.tf", "variables.tf", "outputs.tf", "versions.tf"} <= set(module.files), module.name
        for name, variable in module.variables.items():
            assert variable.get("description"), f"{module.name}: variable {name} has no description"
            assert "type" in variable, f"{module.name}: variable {name} has no type"
        for name, output in module.outputs.items():
            assert output.get("description"), f"{module.name}: output {name} has no description"


def test_provider_versions_are_bounded_above_and_below() -> None:
    for module in load_tree():
        blocks = [b for b in module.terraform if "required_providers" in b]
        assert blocks, f"{module.name}: no required_providers"
        for providers in blocks[0]["required_providers"]:
            for name, spec in providers.items():
                version = spec["version"]
                assert ">=" in version and "<" in version.replace("<=", "<"), f"{module.name}: {name} {version}"


def test_every_reference_resolves_within_its_module() -> None:
    problems = []
    for module in load_tree():
        body = {
            "resources": module.resources,
            "data": module.data,
            "modules": module.modules,
            "outputs": module.outputs,
            "locals": module.locals,
            "variables": module.variables,
        }
        for reference in find_references(body):
            kind, target = reference.kind, reference.target
            if kind == "var" and target[0] not in module.variables:
                problems.append(f"{module.name}: {reference.text}: no variable {target[0]!r}")
            elif kind == "local" and target[0] not in module.locals:
                problems.append(f"{module.name}: {reference.text}: no local {target[0]!r}")
            elif kind == "data" and target not in module.data:
                problems.append(f"{module.name}: {reference.text}: no data source {'.'.join(target)}")
            elif kind == "resource" and target not in module.resources:
                problems.append(f"{module.name}: {reference.text}: no resource {'.'.join(target)}")
            elif kind == "module":
                if target[0] not in module.modules:
                    problems.append(f"{module.name}: {reference.text}: no module {target[0]!r}")
                elif len(target) > 1 and target[1] not in module.module_source(target[0]).outputs:
                    problems.append(f"{module.name}: {reference.text}: module has no output {target[1]!r}")
    assert not problems, "\n".join(problems)


def test_the_reference_scanner_sees_what_it_must() -> None:
    refs = find_references({"a": '${merge(var.labels, {x = google_pubsub_topic.this["k"].id})} $${var.escaped}'})
    assert {(r.kind, r.target) for r in refs} == {("var", ("labels",)), ("resource", ("google_pubsub_topic", "this"))}
    assert expressions("a ${b({c})} $${d} ${e}") == ["b({c})", "e"]


def test_module_calls_pass_only_declared_variables_and_every_required_one() -> None:
    for module in load_tree():
        for call, arguments in module.modules.items():
            target = module.module_source(call)
            passed = set(arguments) - META_ARGUMENTS
            unknown = passed - set(target.variables)
            assert not unknown, f"{module.name}: module {call} passes undeclared {sorted(unknown)}"
            required = {name for name, v in target.variables.items() if "default" not in v}
            missing = required - passed
            assert not missing, f"{module.name}: module {call} misses required {sorted(missing)}"


def test_the_example_tfvars_sets_only_declared_variables_and_every_required_one(env: ModuleDir) -> None:
    values = parse_file(ENV / "terraform.tfvars.example")
    assert set(values) <= set(env.variables), sorted(set(values) - set(env.variables))
    required = {name for name, v in env.variables.items() if "default" not in v}
    assert required <= set(values), sorted(required - set(values))


# --- dead letters, retries, triggers -------------------------------------------------------------


def test_every_topic_has_a_dead_letter_topic_read_by_a_subscription_with_the_agent_allowed_to_publish() -> None:
    bus = load_module(TERRAFORM_ROOT / "modules" / "command_bus")
    topics = bus.resources_of("google_pubsub_topic")
    assert topics["this"]["for_each"] == "${var.topics}"
    assert "local.dead_letter_names" in topics["dead_letter"]["for_each"]
    assert "for key, topic in var.topics" in bus.locals["dead_letter_names"], "one dead-letter topic per topic"

    subscriptions = bus.resources_of("google_pubsub_subscription")
    readers = [s for s in subscriptions.values() if "google_pubsub_topic.dead_letter[each.key]" in s["topic"]]
    assert len(readers) == 1, "each dead-letter topic needs exactly one subscription (for_each over the same keys)"
    reader = readers[0]
    assert reader["for_each"] == topics["dead_letter"]["for_each"]
    assert _single(reader["expiration_policy"], "expiration_policy")["ttl"] == "", "dead-letter queues must not expire"

    grants = bus.resources_of("google_pubsub_topic_iam_member")
    publisher = [
        g
        for g in grants.values()
        if g["role"] == "roles/pubsub.publisher"
        and "google_pubsub_topic.dead_letter[each.key]" in g["topic"]
        and g["member"] == "${var.pubsub_service_agent}"
    ]
    assert publisher, "the Pub/Sub service agent must be able to publish to every dead-letter topic"


def test_the_environment_creates_the_four_streams_named_as_the_settings_default_them(env: ModuleDir) -> None:
    topics = env.modules["command_bus"]["topics"]
    assert set(topics) == set(TOPIC_KEYS)
    defaults = {key: _optional_default(env.variables["topic_names"]["type"], key) for key in TOPIC_KEYS}
    settings = Settings()
    assert defaults == {
        "commands": settings.topic_commands,
        "ticks": settings.topic_ticks,
        "events": settings.topic_events,
        "node_tasks": settings.topic_node_tasks,
    }


def test_every_trigger_subscription_pushes_with_oidc_retries_and_dead_letters() -> None:
    fn = load_module(TERRAFORM_ROOT / FUNCTION_MODULE)
    subscriptions = fn.resources_of("google_pubsub_subscription")
    assert subscriptions, "functions are fed by subscriptions this configuration owns"
    for name, sub in subscriptions.items():
        push = _single(sub["push_config"], f"{name}.push_config")
        service_url = "${google_cloudfunctions2_function.this.service_config[0].uri}"
        # The push path names the topic: the function reads which topic delivered from it (shared/entry.py).
        assert push["push_endpoint"] == service_url + "/${each.value.topic}"
        oidc = _single(push["oidc_token"], f"{name}.oidc_token")
        assert oidc["service_account_email"] == "${google_service_account.invoker.email}"
        assert oidc["audience"] == service_url, "Cloud Run checks the token's audience against the service URL"
        retry = _single(sub["retry_policy"], f"{name}.retry_policy")
        assert retry["minimum_backoff"] and retry["maximum_backoff"], "exponential backoff on redelivery"
        dead_letter = _single(sub["dead_letter_policy"], f"{name}.dead_letter_policy")
        assert dead_letter["dead_letter_topic"] == "${each.value.dead_letter_topic}"
        assert dead_letter["max_delivery_attempts"] == "${each.value.max_delivery_attempts}"
        assert _single(sub["expiration_policy"], f"{name}.expiration_policy")["ttl"] == ""

    agent_reads = [
        g
        for g in fn.resources_of("google_pubsub_subscription_iam_member").values()
        if g["role"] == "roles/pubsub.subscriber" and g["member"] == "${var.pubsub_service_agent}"
    ]
    assert agent_reads, "the Pub/Sub service agent needs subscriber on each source subscription to dead-letter"

    triggers_type = fn.variables["triggers"]["type"]
    assert _attribute_type(triggers_type, "ack_deadline_seconds") == "optional(number, 600)", "push deadline > timeout"
    assert _attribute_type(fn.variables["service"]["type"], "timeout_seconds") == "optional(number, 540)"
    validations = " ".join(v["condition"] for v in fn.variables["service"]["validation"])
    assert "timeout_seconds <= 540" in validations


def test_retry_is_on_for_every_function(env: ModuleDir, function_calls: dict[str, dict[str, Any]]) -> None:
    fn = load_module(TERRAFORM_ROOT / FUNCTION_MODULE)
    for name, function in fn.resources_of("google_cloudfunctions2_function").items():
        # An Eventarc trigger would hide the dead-letter policy; if one is ever added it must retry.
        for trigger in function.get("event_trigger", []):
            assert trigger.get("retry_policy") == "RETRY_POLICY_RETRY", f"{name}: event_trigger without retry"
    for call, body in function_calls.items():
        triggers = body["triggers"]
        assert triggers, f"{call} has no trigger"
        for key, trigger in triggers.items():
            topic = _key_of(trigger["topic"], "topic_ids")
            dead_letter = _key_of(trigger["dead_letter_topic"], "dead_letter_ids")
            assert topic == dead_letter, f"{call}.{key}: dead letters of {topic} go to the {dead_letter} queue"
            attempts = trigger.get("max_delivery_attempts", 10)
            assert attempts == "${var.max_delivery_attempts}" or 5 <= int(attempts) <= 100


def test_commands_are_delivered_in_order_to_provision(function_calls: dict[str, dict[str, Any]]) -> None:
    commands = function_calls["provision"]["triggers"]["commands"]
    assert commands["enable_message_ordering"] is True


def test_the_functions_answer_only_internal_traffic_and_have_bounded_scale() -> None:
    fn = load_module(TERRAFORM_ROOT / FUNCTION_MODULE)
    function = fn.resources_of("google_cloudfunctions2_function")["this"]
    service = _single(function["service_config"], "service_config")
    assert service["ingress_settings"] == "ALLOW_INTERNAL_ONLY"
    assert service["max_instance_count"] == "${var.service.max_instance_count}"
    assert _attribute_type(fn.variables["service"]["type"], "max_instance_count") == "optional(number, 3)"
    invokers = fn.resources_of("google_cloud_run_v2_service_iam_member")
    assert [i["member"] for i in invokers.values()] == ["serviceAccount:${google_service_account.invoker.email}"]


# --- identities and roles -----------------------------------------------------------------------


def test_every_function_has_its_own_runtime_and_invoker_accounts(function_calls: dict[str, dict[str, Any]]) -> None:
    assert set(function_calls) == set(FUNCTIONS)
    assert sorted(body["name"] for body in function_calls.values()) == sorted(FUNCTIONS), "one name per function"
    fn = load_module(TERRAFORM_ROOT / FUNCTION_MODULE)
    accounts = fn.resources_of("google_service_account")
    assert set(accounts) == {"runtime", "invoker"}
    assert "var.name" in accounts["runtime"]["account_id"] and "var.name" in accounts["invoker"]["account_id"]
    service = _single(fn.resources_of("google_cloudfunctions2_function")["this"]["service_config"], "service_config")
    assert service["service_account_email"] == "${google_service_account.runtime.email}"
    build = _single(fn.resources_of("google_cloudfunctions2_function")["this"]["build_config"], "build_config")
    assert "var.build_service_account_email" in build["service_account"], "builds must not use the default account"
    for name in FUNCTIONS:
        for suffix in ("", "-push"):
            account_id = f"tpuctl-{name}{suffix}"
            assert 6 <= len(account_id) <= 30, f"{account_id}: service-account ids are 6-30 characters"


def _granted_roles() -> list[tuple[str, str, str]]:
    """(module, where, role) for every role literal in the tree, including module role lists."""
    found = []
    for module in load_tree():
        everything = {"resources": module.resources, "modules": module.modules}
        for path, value in iter_values(everything):
            if isinstance(value, str) and value.startswith("roles/"):
                found.append((module.name, path, value))
    return found


def test_no_role_in_the_deny_list_and_every_admin_role_is_justified() -> None:
    roles = _granted_roles()
    assert roles, "no role grants found: the scanner is broken"
    for module, where, role in roles:
        assert role not in DENIED_ROLES, f"{module} {where}: {role} is too broad"
        if role.lower().endswith("admin"):
            assert role in JUSTIFIED_ADMIN_ROLES, f"{module} {where}: {role} needs a justification"


def test_acting_as_an_account_is_granted_on_that_account_only() -> None:
    for module in load_tree():
        for (type_name, name), body in module.resources.items():
            role = body.get("role", "")
            if role in ACCOUNT_ROLES:
                assert type_name == "google_service_account_iam_member", f"{module.name} {type_name}.{name}: {role}"
        for call, body in module.modules.items():
            for role in body.get("project_roles", []) if isinstance(body.get("project_roles"), list) else []:
                assert role not in ACCOUNT_ROLES, f"{module.name} module {call}: {role} at project level"


def test_nothing_is_public() -> None:
    for module in load_tree():
        for path, value in iter_values({"r": module.resources, "m": module.modules, "l": module.locals}):
            if isinstance(value, str):
                assert not any(member in value for member in PUBLIC_MEMBERS), f"{module.name} {path}: {value}"


def test_custom_roles_hold_no_escalation_permission() -> None:
    forbidden = {
        "resourcemanager.projects.setIamPolicy",
        "iam.serviceAccounts.actAs",
        "iam.serviceAccountKeys.create",
        "iam.serviceAccounts.getAccessToken",
        "iam.roles.update",
        "pubsub.subscriptions.setIamPolicy",
        "pubsub.topics.setIamPolicy",
        "pubsub.topics.attachSubscription",  # only ever bound on one topic, never at project level
    }
    roles = {
        f"{module.name}:{name}": (module, role)
        for module in load_tree()
        for name, role in module.resources_of("google_project_iam_custom_role").items()
    }
    assert len(roles) >= 3, sorted(roles)
    for name, (module, role) in roles.items():
        permissions = set(role["permissions"])
        assert permissions, name
        assert all("*" not in p for p in permissions), f"{name}: wildcard permission"
        project_bound = any(
            name.split(":")[1] in binding["role"]
            for binding in module.resources_of("google_project_iam_member").values()
        )
        if project_bound:
            allowed = {p for p, (role_name, _why) in JUSTIFIED_PROJECT_PERMISSIONS.items() if role_name == name}
            risky = permissions & forbidden - allowed
            assert not risky, f"{name}: {sorted(risky)} at project level"


def test_each_component_holds_exactly_the_roles_issue_9_lists(
    env: ModuleDir, function_calls: dict[str, dict[str, Any]]
) -> None:
    expected_project_roles = {
        "provision": {
            "roles/datastore.user",
            "roles/cloudtrace.agent",
        },  # and tpuctlProvisionTpu, bound by its definition
        "monitor": {
            "roles/tpu.viewer",
            "roles/datastore.user",
            "roles/monitoring.metricWriter",
            "roles/cloudtrace.agent",
        },
        "benchmark": {"roles/datastore.user", "roles/cloudtrace.agent"},
    }
    # The monitor also nudges the provisioner on ticks and reports phase changes on events (monitor.py).
    expected_publish = {
        "provision": {"events"},
        "monitor": {"commands", "ticks", "events"},
        "benchmark": {"node_tasks"},
    }
    for name in FUNCTIONS:
        call = function_calls[name]
        assert set(call["project_roles"]) == expected_project_roles[name], name
        published = {_key_of(topic, "topic_ids") for topic in call["publish_topics"].values()}
        assert published == expected_publish[name], name

    identities = load_module(TERRAFORM_ROOT / "modules" / "identities")
    tpu_vm_roles = identities.resources["google_project_iam_member", "tpu_vm"]["for_each"]
    assert "roles/logging.logWriter" in tpu_vm_roles and "roles/monitoring.metricWriter" in tpu_vm_roles
    traces = identities.resources["google_project_iam_member", "tpu_vm_trace_writer"]  # the node agent's spans
    assert traces["role"] == "roles/cloudtrace.agent" and traces["count"] == "${var.tpu_vm_writes_traces ? 1 : 0}"
    env_identities = load_module(TERRAFORM_ROOT / "envs" / "default").modules["identities"]
    assert env_identities["tpu_vm_writes_traces"] == '${var.trace_export == "cloud-trace"}'
    assert identities.resources["google_pubsub_topic_iam_member", "tpu_vm_publisher"]["topic"] == "${var.events_topic}"
    assert identities.locals["gateway_project_roles"] == [
        "roles/datastore.viewer",
        "roles/logging.viewer",
        "roles/cloudquotas.viewer",  # tpu_plan(show='zones') reads quota limits (Cloud Quotas API)
    ]
    gateway_publish = identities.resources["google_pubsub_topic_iam_member", "gateway_publisher"]
    assert gateway_publish["topic"] == "${var.commands_topic}" and gateway_publish["role"] == "roles/pubsub.publisher"
    gateway_text = json.dumps([identities.locals, gateway_publish])
    assert "tpu" not in gateway_text.replace("tpu_vm", ""), "the gateway gets nothing on the TPU API"
    assert ("google_project_iam_custom_role", "node_agent_subscriptions") not in identities.resources
    node_channels = identities.resources["google_project_iam_custom_role", "node_channels"]
    assert set(node_channels["permissions"]) == {
        "pubsub.subscriptions.create",
        "pubsub.subscriptions.delete",
        "pubsub.subscriptions.get",
        "pubsub.subscriptions.getIamPolicy",
        "pubsub.subscriptions.setIamPolicy",
    }, "the controller makes, grants on and deletes node channels; it never reads one"
    attach = identities.resources["google_pubsub_topic_iam_member", "node_channel_attach"]
    assert attach["topic"] == "${var.node_tasks_topic}", "attaching is allowed on the node-tasks topic only"
    assert env.modules["identities"]["node_tasks_topic"] == "${local.topic_ids.node_tasks}"
    assert env.modules["identities"]["node_channel_managers"] == {
        "provision": "${module.provision.service_account_member}"
    }
    provision_tpu = env.resources["google_project_iam_custom_role", "provision_tpu"]
    assert set(provision_tpu["permissions"]) == {
        "tpu.locations.list",
        "tpu.nodes.create",
        "tpu.nodes.delete",
        "tpu.nodes.get",
        "tpu.nodes.list",
        "tpu.operations.get",
    }, "the Cloud TPU calls of shared/adapters/gcp_tpu.py the provisioner makes"
    assert env.resources["google_project_iam_member", "provision_tpu"]["member"] == (
        "${module.provision.service_account_member}"
    )
    act_as = identities.resources["google_service_account_iam_member", "tpu_vm_users"]
    assert act_as["service_account_id"] == "${google_service_account.tpu_vm.name}"
    assert "module.provision" in env.modules["identities"]["tpu_vm_users"]["provision"]

    secrets = env.modules["secrets"]["secrets"]
    assert set(secrets) == {"hf_token", "vllm_api_key", "event_key"}
    hf_readers = secrets["hf_token"]["accessors"]
    # By default only the VMs (serving and prewarm builder) read the Hugging Face token; the gateway may, when an
    # operator opts in.
    assert hf_readers == (
        "${merge({tpu_vm = module.identities.tpu_vm_member, tpu_builder = module.identities.tpu_builder_member}, "
        "local.gateway_hf_token_managers)}"
    )
    assert env.locals["gateway_hf_token_managers"].startswith("${var.gateway_manages_hf_token ?")
    assert env.variables["gateway_manages_hf_token"]["default"] is False
    assert "tpu_vm = module.identities.tpu_vm_member" in secrets["vllm_api_key"]["accessors"]
    for key in ("hf_token", "vllm_api_key"):
        assert not [r for r in find_references(secrets[key]) if r.target[0].startswith(("provision", "benchmark"))], (
            f"{key}: provision and benchmark never need a secret"
        )
    # The controller key of node event seals: the functions alone, never a VM or a person.
    event_key = secrets["event_key"]
    assert set(event_key["accessors"]) == {"provision", "benchmark"}
    assert set(event_key["version_adders"]) == {"provision"}
    assert "tpu_vm" not in str(event_key) and "gateway" not in str(event_key)


# --- secrets ------------------------------------------------------------------------------------

_SECRET_PATTERNS = [
    re.compile(r"hf_[A-Za-z0-9]{20,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"AIza[0-9A-Za-z_\-]{30,}"),
    re.compile(r"\bsk-[A-Za-z0-9]{20,}"),
    re.compile(r"\"private_key\"\s*:"),
]


def test_no_secret_value_is_written_in_any_terraform_file() -> None:
    texts = [p for p in TERRAFORM_ROOT.rglob("*") if p.is_file() and ".terraform" not in p.parts]
    assert any(p.suffix == ".tf" for p in texts)
    for path in texts:
        text = path.read_text(encoding="utf-8")
        for pattern in _SECRET_PATTERNS:
            assert not pattern.search(text), f"{path}: looks like a secret value ({pattern.pattern})"
    for module in load_tree():
        kinds = {type_name for type_name, _ in module.resources}
        assert "google_secret_manager_secret_version" not in kinds, f"{module.name}: secret values stay out of state"
        for attribute, _ in iter_values(module.resources):
            assert not attribute.endswith(("secret_data", "private_key", "password")), f"{module.name} {attribute}"
        for name, variable in module.variables.items():
            if re.search(r"(^|_)(token|password|api_key|secret_value)$", name) and variable["type"] in (
                "string",
                "${string}",
            ):
                assert variable.get("sensitive") is True and "default" not in variable, f"{module.name}: {name}"


def test_the_functions_get_secret_names_never_values(env: ModuleDir) -> None:
    environment = env.locals["function_environment"]
    for key in environment:
        assert not re.search(r"TOKEN$|KEY$|PASSWORD$", key), f"{key}: pass a secret's name (..._SECRET), not its value"
    assert environment["TPUCTL_HF_TOKEN_SECRET"] == "${var.secret_ids.hf_token}"
    assert environment["TPUCTL_VLLM_API_KEY_SECRET"] == "${var.secret_ids.vllm_api_key}"
    secret_type = env.variables["secret_ids"]["type"]
    settings = Settings()
    assert _optional_default(secret_type, "hf_token") == settings.hf_token_secret
    assert _optional_default(secret_type, "vllm_api_key") == settings.vllm_api_key_secret


def test_every_function_setting_is_a_field_of_settings(env: ModuleDir) -> None:
    environment = env.locals["function_environment"]
    fields = set(Settings.model_fields)
    for key in environment:
        assert key.startswith("TPUCTL_") and key[len("TPUCTL_") :].lower() in fields, f"{key} is not read by Settings"
    assert environment["TPUCTL_BACKEND"] == "gcp"
    assert {"TPUCTL_PROJECT", "TPUCTL_REGION"} <= set(environment)


def test_tpu_vms_are_placed_with_the_node_identity_network_and_firewall_tag(env: ModuleDir) -> None:
    """Without these the provisioner's VMs run as the default compute account, outside the firewall rule."""
    environment = env.locals["function_environment"]
    assert environment["TPUCTL_NODE_SERVICE_ACCOUNT"] == "${module.identities.tpu_vm_email}"
    assert environment["TPUCTL_NODE_NETWORK"] == "${var.network}"
    assert environment["TPUCTL_NODE_TAGS"] == "${module.network.node_tag}"
    assert environment["TPUCTL_NODE_EXTERNAL_IPS"] == "false"  # the network module's Cloud NAT does egress
    # Prewarm builder VMs run as their own account, the one that may write the compile cache.
    assert environment["TPUCTL_BUILDER_SERVICE_ACCOUNT"] == "${module.identities.tpu_builder_email}"


def test_every_function_gets_the_uploaded_node_agent_bundle_and_its_digest(
    env: ModuleDir, function_calls: dict[str, dict[str, Any]]
) -> None:
    """The provisioner renders TPU VM startup scripts with these; without them VMs run no node agent."""
    upload = env.resources["google_storage_bucket_object", "node_agent_bundle"]
    assert upload["count"] == "${var.node_agent_bundle == null ? 0 : 1}"
    assert upload["name"] == "node-agent/${filesha256(var.node_agent_bundle)}-${basename(var.node_agent_bundle)}"
    assert upload["source"] == "${var.node_agent_bundle}"
    wiring = env.locals["node_agent_environment"]
    uri = "gs://${google_storage_bucket.sources.name}/${google_storage_bucket_object.node_agent_bundle[0].name}"
    assert wiring.startswith("${var.node_agent_bundle == null ? tomap({}) : tomap({")
    assert f'TPUCTL_NODE_AGENT_BUNDLE = "{uri}"' in wiring
    assert "TPUCTL_NODE_AGENT_BUNDLE_SHA256 = filesha256(var.node_agent_bundle)" in wiring
    for name, call in function_calls.items():
        assert call["environment_variables"] == "${merge(local.function_environment, local.node_agent_environment)}", (
            f"{name}: pass the node-agent settings with the others"
        )
    assert "local.node_agent_environment" in env.outputs["gateway_environment"]["value"], "the gateway plans alike"
    assert "local.node_agent_environment" in env.outputs["node_agent_bundle_uri"]["value"]


def test_the_uri_terraform_builds_is_one_the_settings_and_the_vm_accept(env: ModuleDir) -> None:
    """Terraform's bucket and object names, filled in, pass Settings; the VM's read grant covers that prefix."""
    from shared.domain.startup_script import NODE_AGENT_PREFIX

    bucket = env.resources["google_storage_bucket", "sources"]["name"]
    assert bucket == "${var.project_id}-${var.name_prefix}-sources"
    digest = "ab" * 32
    uri = f"gs://{'a' * 30}-{'b' * 12}-sources/node-agent/{digest}-tpuctl-node-agent-0.1.0.tar.gz"
    settings = Settings(node_agent_bundle=uri, node_agent_bundle_sha256=digest)
    assert settings.node_agent_bundle == uri
    identities = load_module(TERRAFORM_ROOT / "modules" / "identities")
    grant = identities.resources["google_storage_bucket_iam_member", "tpu_vm_bundle_reader"]
    assert _single(grant["condition"], "condition")["expression"].endswith(f'/objects/{NODE_AGENT_PREFIX}")')
    for key in ("TPUCTL_NODE_AGENT_BUNDLE", "TPUCTL_NODE_AGENT_BUNDLE_SHA256"):
        assert key[len("TPUCTL_") :].lower() in Settings.model_fields


def test_the_example_tfvars_points_at_the_bundle_make_package_builds(env: ModuleDir) -> None:
    import tomllib

    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    example = parse_file(ENV / "terraform.tfvars.example")
    assert example["node_agent_bundle"] == f"../../../build/node-agent/tpuctl-node-agent-{version}.tar.gz"


# --- entry points -------------------------------------------------------------------------------


def _cloud_event_functions(main: Path) -> set[str]:
    """Names of functions decorated with functions_framework.cloud_event in ``main``."""
    tree = ast.parse(main.read_text(encoding="utf-8"))
    imported_as = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "functions_framework"
        for alias in node.names
        if alias.name == "cloud_event"
    }
    names = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            dotted = ast.unparse(target)
            if dotted == "functions_framework.cloud_event" or dotted in imported_as:
                names.add(node.name)
    return names


def test_entry_points_and_runtime_match_the_python_code(function_calls: dict[str, dict[str, Any]]) -> None:
    runtime = f"python{sys.version_info.major}{sys.version_info.minor}"
    for name, call in function_calls.items():
        main = REPO_ROOT / "functions" / call["name"] / "main.py"
        assert main.is_file(), f"{main} is missing: Terraform deploys it as the {name} function"
        entry_points = _cloud_event_functions(main)
        assert call["entry_point"] in entry_points, (
            f"{name}: entry_point {call['entry_point']!r} is not a @functions_framework.cloud_event function "
            f"in {main.relative_to(REPO_ROOT)} (found {sorted(entry_points)})"
        )
        assert call["runtime"] == runtime, f"{name}: runtime {call['runtime']} but the project runs {runtime}"
        assert call["source_dir"].endswith(f"/{call['name']}"), f"{name}: source_dir must be build/functions/{name}"


def test_sources_are_named_by_content_hash() -> None:
    fn = load_module(TERRAFORM_ROOT / FUNCTION_MODULE)
    source = fn.resources_of("google_storage_bucket_object")["source"]
    assert "data.archive_file.source.output_sha256" in source["name"]
    archive = fn.data["archive_file", "source"]
    assert archive["source_dir"] == "${var.source_dir}" and archive["output_file_mode"] == "0644"


# --- routing ------------------------------------------------------------------------------------


def _routes(env: ModuleDir, function_calls: dict[str, dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """(function, stream, parsed filter) for every trigger."""
    routes = []
    for name, call in function_calls.items():
        for key, trigger in call["triggers"].items():
            text = _route_filter(resolve_locals(trigger.get("filter", ""), env))
            assert "${" not in text, f"{name}.{key}: filter did not resolve to a literal: {text!r}"
            assert len(text.encode()) <= 256, f"{name}.{key}: Pub/Sub filters are at most 256 bytes"
            routes.append((name, _key_of(trigger["topic"], "topic_ids"), parse_filter(text or None)))
    return routes


def _route_filter(text: str) -> str:
    """A reference into routes.json (``local.route_filters.FUNCTION.TRIGGER``) replaced by the filter it holds."""
    filters = json.loads((ENV / "routes.json").read_text(encoding="utf-8"))
    return re.sub(r"\$\{local\.route_filters\.(\w+)\.(\w+)\}", lambda m: filters[m.group(1)][m.group(2)], text)


def _receivers(routes: list[tuple[str, str, Any]], stream: str, attributes: dict[str, str]) -> list[str]:
    return sorted(
        name for name, topic, parsed in routes if topic == stream and (parsed is None or parsed.matches(attributes))
    )


def _ticks() -> dict[str, Any]:
    ticks: dict[str, Any] = json.loads((ENV / "ticks.json").read_text(encoding="utf-8"))
    return ticks


def test_every_message_kind_reaches_exactly_one_function(
    env: ModuleDir, function_calls: dict[str, dict[str, Any]]
) -> None:
    routes = _routes(env, function_calls)
    streams = {"commands": "commands", "events": "events", "ticks": "ticks"}
    for kind in KINDS:
        if kind == "reconcile.tick":
            continue  # routed by purpose, below
        stream = streams[topic_for(cast(Any, SimpleNamespace(kind=kind)))]
        receivers = _receivers(routes, stream, {"kind": kind, "schema_version": "1"})
        assert len(receivers) == 1, f"{kind} on {stream} reaches {receivers or 'no function'}"
    for purpose, tick in _ticks().items():
        attributes = {"kind": tick["message"]["kind"], "purpose": purpose}
        assert len(_receivers(routes, "ticks", attributes)) == 1, purpose
    assert _receivers(routes, "ticks", {"kind": "reconcile.tick", "purpose": "reconcile"}) == ["provision"]
    assert _receivers(routes, "ticks", {"kind": "reconcile.tick", "purpose": "monitor"}) == ["monitor"]
    assert _receivers(routes, "ticks", {"kind": "reconcile.tick"}) == ["provision"], "a tick without purpose reconciles"
    assert _receivers(routes, "events", {"kind": "benchmark.completed"}) == ["benchmark"]


def test_each_kind_goes_to_the_one_function_that_accepts_it(
    env: ModuleDir, function_calls: dict[str, dict[str, Any]]
) -> None:
    """Two functions handling one command would race on the command ledger; a kind routed away from
    its handler would be acked unread. So every accepted kind reaches its handler and only it."""
    routes = _routes(env, function_calls)
    accepted: dict[str, frozenset[str] | None] = {}
    for name, call in function_calls.items():
        main = REPO_ROOT / "functions" / call["name"] / "main.py"
        assert f'FunctionEntry("{call["name"]}"' in main.read_text(encoding="utf-8"), f"{main} routes by the table"
        triggers = FUNCTION_TRIGGERS[call["name"]]
        assert set(triggers) == {_key_of(t["topic"], "topic_ids") for t in call["triggers"].values()}, name
        accepted[name] = frozenset().union(*triggers.values())
    streams = {"commands": "commands", "events": "events", "ticks": "ticks"}
    for kind in KINDS:
        stream = streams[topic_for(cast(Any, SimpleNamespace(kind=kind)))]
        purposes = list(_ticks()) if kind == "reconcile.tick" else [None]
        for purpose in purposes:
            attributes = {"kind": kind} | ({"purpose": purpose} if purpose else {})
            handlers = [
                name
                for name in _receivers(routes, stream, attributes)
                if accepted[name] is None or kind in accepted[name]  # type: ignore[operator]
            ]
            acceptors = [name for name, kinds in accepted.items() if kinds is None or kind in kinds]
            assert len(handlers) <= 1, f"{kind} ({purpose}) is handled by {handlers}: one would see a duplicate"
            if acceptors:
                assert handlers, f"{kind} ({purpose}) is accepted by {acceptors} but routed to none of them"


def test_scheduler_ticks_are_valid_wire_messages_with_matching_attributes(env: ModuleDir) -> None:
    ticks = _ticks()
    assert set(ticks) == {"reconcile", "monitor", "janitor"}
    schedule_type = env.variables["tick_schedules"]["type"]
    for purpose, tick in ticks.items():
        message = decode_message(json.dumps(tick["message"]).encode())
        assert isinstance(message, ReconcileTick) and message.purpose == purpose
        assert len(_optional_default(schedule_type, purpose).split()) == 5, f"{purpose}: five-field cron"
    assert _optional_default(schedule_type, "reconcile") == "* * * * *", "the reconcile tick runs every minute"
    attributes = env.modules["tick"]["attributes"]
    assert attributes["kind"] == "${each.value.message.kind}"
    assert attributes["purpose"] == "${each.value.message.purpose}"
    scheduler = load_module(TERRAFORM_ROOT / "modules" / "scheduled_trigger")
    job = scheduler.resources_of("google_cloud_scheduler_job")["this"]
    assert "base64encode(jsonencode(var.message))" in _single(job["pubsub_target"], "pubsub_target")["data"]


def test_the_reconcile_job_is_the_one_the_provisioner_pauses_and_resumes(env: ModuleDir) -> None:
    from shared.services.provisioner import TICK_JOB_NAME

    assert _ticks()["reconcile"]["job"] == TICK_JOB_NAME
    assert env.modules["tick"]["name"] == "${each.value.job}"
    scheduler = load_module(TERRAFORM_ROOT / "modules" / "scheduled_trigger")
    job = scheduler.resources_of("google_cloud_scheduler_job")["this"]
    assert _single(job["lifecycle"], "lifecycle")["ignore_changes"] == ["paused"], "pause state is the controller's"
    granted = {
        body["member"]
        for body in env.resources_of("google_project_iam_member").values()
        if body["role"] == "${google_project_iam_custom_role.provision_scheduler_jobs.id}"
    }
    assert granted == {"${module.provision.service_account_member}"}, "the provisioner manages its tick job"
    permissions = set(env.resources["google_project_iam_custom_role", "provision_scheduler_jobs"]["permissions"])
    assert {"cloudscheduler.jobs.pause", "cloudscheduler.jobs.enable", "cloudscheduler.jobs.get"} <= permissions
    assert "cloudscheduler.jobs.update" not in permissions, "the provisioner never replaces a job"
    benchmark = set(env.resources["google_project_iam_custom_role", "benchmark_scheduler_jobs"]["permissions"])
    assert "cloudscheduler.jobs.pause" not in benchmark, "scheduled benchmarks are never paused by the controller"


# --- state, network, alerts ---------------------------------------------------------------------


def test_firestore_indexes_and_ttl_match_the_store_and_the_records(env: ModuleDir) -> None:
    from shared.adapters.firestore_store import COLLECTIONS

    firestore = env.modules["firestore"]
    indexes = {
        (index["collection"], tuple((f["field_path"], f["order"]) for f in index["fields"]))
        for index in firestore["composite_indexes"].values()
    }
    assert ("samples", (("deployment_id", "ASCENDING"), ("taken_at", "DESCENDING"))) in indexes
    assert ("benchmark_runs", (("deployment_id", "ASCENDING"), ("created_at", "DESCENDING"))) in indexes
    assert ("node_tasks", (("deployment_id", "ASCENDING"), ("requested_at", "DESCENDING"))) in indexes
    assert any(collection == "deployments" and fields[0][0] == "status.phase" for collection, fields in indexes)
    records: dict[str, type[BaseModel]] = {
        "samples": MonitorSample,
        "benchmark_runs": BenchmarkRun,
        "node_tasks": NodeTask,
        "deployments": DeploymentRecord,
    }
    for collection, fields in indexes:
        assert collection in COLLECTIONS, f"{collection} is not a FirestoreStateStore collection"
        for field_path, _ in fields:
            head, _, tail = field_path.partition(".")
            assert head in records[collection].model_fields, f"{collection}.{field_path} is not a record field"
            if tail:
                assert tail in DeploymentStatus.model_fields, f"{collection}.{field_path}"
    ttl = {(f["collection"], f["field"]) for f in firestore["ttl_fields"].values()}
    assert ttl == {("samples", "expire_at"), ("commands", "expire_at")}
    assert "expire_at" in MonitorSample.model_fields and "expire_at" in CommandRecord.model_fields
    module = load_module(TERRAFORM_ROOT / "modules" / "firestore")
    database = module.resources_of("google_firestore_database")["this"]
    assert database["type"] == "FIRESTORE_NATIVE" and database["deletion_policy"] == "ABANDON"


def test_the_vllm_port_is_never_open_to_the_world(env: ModuleDir) -> None:
    network = load_module(TERRAFORM_ROOT / "modules" / "network")
    for name, rule in network.resources_of("google_compute_firewall").items():
        ranges = rule["source_ranges"]
        literal = ranges if isinstance(ranges, list) else []
        assert not {"0.0.0.0/0", "::/0"} & set(literal), name
        assert rule["target_tags"] == ["${var.node_tag}"], f"{name}: applies to tpuctl nodes only"
    conditions = " ".join(v["condition"] for v in network.variables["vllm_source_ranges"]["validation"])
    # By prefix length, so 0.0.0.0/1 plus 128.0.0.0/1 is refused as 0.0.0.0/0 is (a string match let it through).
    assert '>= (strcontains(r, ":") ? 32 : 8)' in conditions, "the module refuses any range wider than /8 or /32"
    assert "0.0.0.0/0" not in conditions, "no string match on one spelling of the whole Internet"
    assert "0.0.0.0/0" not in json.dumps(env.variables["vllm_source_ranges"].get("default", []))


def test_alerts_watch_every_dead_letter_queue_the_functions_and_unhealthy_phases(env: ModuleDir) -> None:
    call = env.modules["monitoring"]
    assert "module.command_bus.dead_letter_subscription_names" in call["dead_letter_subscriptions"]
    assert all(f"module.{name}.function_name" in json.dumps(call["function_services"]) for name in FUNCTIONS)
    assert call["notification_channels"] == "${var.notification_channels}"
    monitoring = load_module(TERRAFORM_ROOT / "modules" / "monitoring")
    policies = monitoring.resources_of("google_monitoring_alert_policy")
    assert set(policies) == {
        "dead_letter_backlog",
        "function_errors",
        "unhealthy_phase",
        "deployment_finding",
        "slo_burn",
    }
    for name, policy in policies.items():
        assert policy["notification_channels"] == "${local.channels}", name
    metric = monitoring.resources_of("google_logging_metric")["unhealthy_phase"]
    assert f'jsonPayload.kind="{PhaseChanged.model_fields["kind"].default}"' in metric["filter"]
    phases = set(monitoring.variables["unhealthy_phases"]["default"])
    assert phases == {"DEGRADED", "STALLED", "DOWN"} and phases <= {p.value for p in Phase}
    # The monitor logs the PhaseChanged fields as jsonPayload; the metric reads phase and deployment_id.
    assert "jsonPayload.phase" in metric["filter"]
    for label in ("phase", "deployment_id"):
        assert label in PhaseChanged.model_fields
        assert metric["label_extractors"][label] == f"EXTRACT(jsonPayload.{label})"
    # Findings (saturation, effective config): the monitor logs kind, deployment_id and finding (its tag).
    finding = monitoring.resources_of("google_logging_metric")["deployment_finding"]
    assert finding["filter"] == f'jsonPayload.kind="{FINDING_LOG_KIND}"'
    for label in ("finding", "deployment_id"):
        assert finding["label_extractors"][label] == f"EXTRACT(jsonPayload.{label})"
