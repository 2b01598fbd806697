"""docs/deploy.md "Who may do what" against the Terraform, both ways, and the TPU VM's Pub/Sub rights.

Every IAM grant in the tree is resolved to the identity it names (function runtime accounts, push invokers, the
Pub/Sub service agent, the TPU VM, the prewarm builder, gateway and endpoint-tunnel principals, the build account)
and its role (predefined, or a custom role shown as IAM names it with the default prefix, e.g.
``tpuctlNodeChannels``), at project level or on one resource. A grant this resolver does not understand fails the
test, so a new grant cannot skip the table. The table must list exactly those roles in the matching column;
permissions it names in parentheses must be exactly the custom role's; what its "Not granted" column names must not
be granted.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.terraform_config import REPO_ROOT, TERRAFORM_ROOT, ModuleDir, load_module

ENV = TERRAFORM_ROOT / "envs" / "default"
DOC = REPO_ROOT / "docs" / "deploy.md"
PROJECT_TYPES = {"google_project_iam_member"}
FUNCTIONS = ("provision", "monitor", "benchmark")

# The table's first cell names the identity; the first phrase found decides.
ROW_IDENTITIES = (
    ("`tpuctl-provision`", "provision"),
    ("`tpuctl-monitor`", "monitor"),
    ("`tpuctl-benchmark`", "benchmark"),
    ("push invokers", "push"),
    ("Pub/Sub service agent", "pubsub-agent"),
    ("`tpuctl-tpu-vm`", "tpu-vm"),
    ("`tpuctl-tpu-builder`", "tpu-builder"),
    ("gateway principals", "gateway"),
    ("endpoint tunnel principals", "tunnel"),
    ("`tpuctl-build`", "build"),
)
_ROLE = re.compile(r"`(roles/[\w.]+|tpuctl[A-Z]\w*)`")
_PERMISSION = re.compile(r"`([a-z]+\.[a-zA-Z]+\.[a-zA-Z]+)`")
_CUSTOM_WITH_PERMISSIONS = re.compile(r"`(tpuctl[A-Z]\w*)` \(([^)]*)\)")


@dataclass
class Grants:
    """Roles per identity and scope, and every custom role's permissions by its IAM name."""

    roles: dict[str, dict[str, set[str]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(set)))
    custom: dict[str, set[str]] = field(default_factory=dict)

    def add(self, identities: list[str], scope: str, roles: list[str]) -> None:
        for identity in identities:
            self.roles[identity][scope].update(roles)

    def every_role(self, identity: str) -> set[str]:
        return set().union(*self.roles[identity].values()) if identity in self.roles else set()

    def permissions(self, identity: str) -> set[str]:
        return set().union(*(self.custom.get(role, set()) for role in self.every_role(identity)))


def _custom_name(role_id: str) -> str:
    match = re.fullmatch(r'\$\{replace\(var\.name_prefix, "-", "_"\)\}(\w+)', role_id)
    assert match, f"custom role id {role_id!r}: expected the name_prefix form"
    return f"tpuctl{match.group(1)}"


def _modules() -> Iterator[tuple[str, ModuleDir, Mapping[str, Any]]]:
    """(call name, module, call arguments) for the environment itself and every module it calls."""
    env = load_module(ENV)
    yield "", env, {}
    for call, body in env.modules.items():
        yield call, env.module_source(call), body


class Resolver:
    """Turns one IAM member resource into (identities, roles) using the environment's module arguments."""

    def __init__(self) -> None:
        self.env = load_module(ENV)

    def identities(self, member: str, for_each: str, call: str, args: Mapping[str, Any]) -> list[str]:
        if "google_service_account.tpu_vm.email" in member or member == "${module.identities.tpu_vm_member}":
            return ["tpu-vm"]
        if "google_service_account.tpu_builder.email" in member or member == "${module.identities.tpu_builder_member}":
            return ["tpu-builder"]
        if "google_service_account.runtime.email" in member:
            return [call]
        if "google_service_account.invoker.email" in member:
            return ["push"]
        if member in ("${var.pubsub_service_agent}", "${local.pubsub_service_agent}"):
            return ["pubsub-agent"]
        if "google_service_account.build.email" in member:
            return ["build"]
        module_member = re.fullmatch(r"\$\{module\.(\w+)\.service_account_member\}", member)
        if module_member:
            return [module_member.group(1)]
        if member.startswith("${each.value"):
            if "gateway" in for_each:
                return ["gateway"]
            if "endpoint_tunnel_principals" in for_each:
                return ["tunnel"]
            variable = re.fullmatch(r"\$\{var\.(\w+)\}", for_each)
            if variable and isinstance(args.get(variable.group(1)), dict):
                found: list[str] = []
                for value in args[variable.group(1)].values():
                    found += self.identities(value, "", call, {})
                return found
        raise AssertionError(f"module {call or 'env'}: cannot tell whose member {member!r} (for_each {for_each!r}) is")

    def roles(self, body: Mapping[str, Any], module: ModuleDir, args: Mapping[str, Any]) -> list[str]:
        role = str(body["role"])
        for_each = str(body.get("for_each", ""))
        if role.startswith("roles/"):
            return [role]
        custom = re.fullmatch(r"\$\{google_project_iam_custom_role\.(\w+)(?:\[0\])?\.id\}", role)
        if custom:
            return [_custom_name(module.resources["google_project_iam_custom_role", custom.group(1)]["role_id"])]
        if role == "${each.value}" and for_each.startswith("${toset(["):
            return re.findall(r'"(roles/[^"]+)"', for_each)
        if role == "${each.value}" and for_each == "${var.project_roles}":
            return list(args.get("project_roles", []))
        if role == "${each.value.role}" and for_each == "${local.gateway_project_bindings}":
            return list(module.locals["gateway_project_roles"])
        raise AssertionError(f"cannot resolve role {role!r} (for_each {for_each!r})")


def _secret_grants(grants: Grants, args: Mapping[str, Any]) -> None:
    """The secrets module grants per secret to the accessors and version adders the environment passes."""
    for secret in args["secrets"].values():
        for key, role in (
            ("accessors", "roles/secretmanager.secretAccessor"),
            ("version_adders", "roles/secretmanager.secretVersionAdder"),
        ):
            text = str(secret.get(key, ""))
            who = []
            if "module.identities.tpu_vm_member" in text:
                who.append("tpu-vm")
            if "module.identities.tpu_builder_member" in text:
                who.append("tpu-builder")
            who += [name for name in FUNCTIONS if f"module.{name}.service_account_member" in text]
            if "local.gateway_" in text:
                who.append("gateway")
            stripped = re.sub(r"module\.\w+\.\w+|local\.gateway_\w+|merge|\w+ =", "", text)
            assert not re.search(r"[a-z]\.[a-z]", stripped), f"secrets {key}: unresolved member in {text!r}"
            grants.add(who, "resource", [role])


@pytest.fixture(scope="module")
def grants() -> Grants:
    resolver = Resolver()
    found = Grants()
    for call, module, args in _modules():
        for (type_name, _name), body in module.resources.items():
            if type_name == "google_project_iam_custom_role":
                found.custom[_custom_name(body["role_id"])] = set(body["permissions"])
        if module.path.name == "secrets":
            _secret_grants(found, args)
            continue
        for (type_name, name), body in module.resources.items():
            if not type_name.endswith("_iam_member"):
                continue
            where = f"{module.name} {type_name}.{name}"
            if (
                type_name == "google_pubsub_topic_iam_member"
                and name == "runtime_publisher"
                and not args.get("publish_topics")
            ):
                continue
            if type_name == "google_project_iam_member" and name == "runtime" and not args.get("project_roles"):
                continue
            try:
                identities = resolver.identities(str(body["member"]), str(body.get("for_each", "")), call, args)
                roles = resolver.roles(body, module, args)
            except AssertionError as exc:
                raise AssertionError(f"{where}: {exc}") from None
            found.add(identities, "project" if type_name in PROJECT_TYPES else "resource", roles)
    return found


@dataclass(frozen=True)
class Row:
    identity: str
    project: str
    resource: str
    run_time: str
    not_granted: str


@pytest.fixture(scope="module")
def rows() -> dict[str, Row]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Who may do what", 1)[1].split("\n\n**", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    header, body = lines[0], lines[1:]
    assert [cell.strip() for cell in header.strip("|").split("|")] == [
        "Identity",
        "Project-wide",
        "On one resource only",
        "At run time",
        "Not granted",
    ]
    found: dict[str, Row] = {}
    for line in body:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"docs/deploy.md: a row of Who may do what has {len(cells)} cells: {line[:80]}"
        identity = next((key for phrase, key in ROW_IDENTITIES if phrase in cells[0]), None)
        assert identity is not None, f"docs/deploy.md: unknown identity {cells[0]!r}"
        assert identity not in found, f"docs/deploy.md: {identity} has two rows"
        found[identity] = Row(identity, *cells[1:])
    return found


def _roles_in(cell: str) -> set[str]:
    return set(_ROLE.findall(cell))


def test_every_identity_with_a_grant_has_a_row_and_every_row_a_grant(grants: Grants, rows: dict[str, Row]) -> None:
    granted = {identity for identity, scopes in grants.roles.items() if any(scopes.values())}
    assert granted == set(rows), f"in Terraform only: {granted - set(rows)}; in the table only: {set(rows) - granted}"


@pytest.mark.parametrize("identity", [key for _phrase, key in ROW_IDENTITIES])
def test_the_table_lists_exactly_the_roles_terraform_grants(
    identity: str, grants: Grants, rows: dict[str, Row]
) -> None:
    row = rows[identity]
    for scope, cell in (("project", row.project), ("resource", row.resource)):
        documented, granted = _roles_in(cell), grants.roles[identity][scope]
        assert documented == granted, (
            f"{identity}, {scope}: the table lists {sorted(documented - granted)} that Terraform does not grant, "
            f"and misses {sorted(granted - documented)}"
        )


@pytest.mark.parametrize("identity", [key for _phrase, key in ROW_IDENTITIES])
def test_permissions_named_are_the_custom_roles_and_not_granted_means_not_granted(
    identity: str, grants: Grants, rows: dict[str, Row]
) -> None:
    row = rows[identity]
    for cell in (row.project, row.resource):
        for role, inside in _CUSTOM_WITH_PERMISSIONS.findall(cell):
            named = set(_PERMISSION.findall(inside))
            if named:
                assert named == grants.custom[role], f"{identity}: {role} is {sorted(grants.custom[role])}"
        assert set(_PERMISSION.findall(cell)) <= grants.permissions(identity), identity
    refused_roles = _roles_in(row.not_granted)
    assert not refused_roles & grants.every_role(identity), f"{identity}: 'not granted' but granted"
    refused_permissions = set(_PERMISSION.findall(row.not_granted))
    assert not refused_permissions & grants.permissions(identity), f"{identity}: 'not granted' but in a custom role"


def test_the_tpu_vm_holds_no_pubsub_right_at_project_level(grants: Grants) -> None:
    project = grants.roles["tpu-vm"]["project"]
    assert project, "the resolver found no project grant for the TPU VM"
    assert not [role for role in project if role.startswith("roles/pubsub.")], sorted(project)
    for role in project:
        pubsub = sorted(p for p in grants.custom.get(role, set()) if p.startswith("pubsub."))
        assert not pubsub, f"{role} gives the TPU VM {pubsub} at project level"
    assert not [p for p in grants.permissions("tpu-vm") if p.startswith("pubsub.subscriptions.")]
    # On one resource: publisher on the events topic, and no subscription or topic grant besides.
    identities = load_module(TERRAFORM_ROOT / "modules" / "identities")
    vm = "serviceAccount:${google_service_account.tpu_vm.email}"
    topic_grants = [b for b in identities.resources_of("google_pubsub_topic_iam_member").values() if b["member"] == vm]
    assert [(b["topic"], b["role"]) for b in topic_grants] == [("${var.events_topic}", "roles/pubsub.publisher")]
    assert not identities.resources_of("google_pubsub_subscription_iam_member")


def test_only_the_provisioner_manages_node_channels_and_attaches_to_node_tasks_only(grants: Grants) -> None:
    holders = {identity for identity, scopes in grants.roles.items() if "tpuctlNodeChannels" in scopes["project"]}
    assert holders == {"provision"}
    assert grants.custom["tpuctlNodeChannels"] == {
        "pubsub.subscriptions.create",
        "pubsub.subscriptions.delete",
        "pubsub.subscriptions.get",
        "pubsub.subscriptions.getIamPolicy",
        "pubsub.subscriptions.setIamPolicy",
    }, "what shared/adapters/node_channels.py and pubsub_iam.py call, nothing more (no consume)"
    identities = load_module(TERRAFORM_ROOT / "modules" / "identities")
    attach = identities.resources["google_pubsub_topic_iam_member", "node_channel_attach"]
    assert attach["topic"] == "${var.node_tasks_topic}"
    assert attach["role"] == "${google_project_iam_custom_role.topic_attach.id}"
    assert load_module(ENV).modules["identities"]["node_tasks_topic"] == "${local.topic_ids.node_tasks}"


def test_the_run_time_grant_in_the_table_is_the_one_the_controller_makes(rows: dict[str, Row]) -> None:
    from shared.adapters.node_channels import SUBSCRIBER_ROLE
    from shared.ports import node_channel

    assert _roles_in(rows["tpu-vm"].run_time) == {SUBSCRIBER_ROLE}
    assert f"`{node_channel('<deployment>')}`" in rows["tpu-vm"].run_time
    assert "node channel" in rows["provision"].run_time
