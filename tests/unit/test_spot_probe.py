"""The spot probe's pure rules (shared.domain.spot_probe): who is probed when, what each answer means, what is
learned and deleted, and how the planner and zone memory act on a quota-bound verdict."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.config import Settings
from shared.domain.attempts import Step
from shared.domain.cloud import LABEL_DEPLOYMENT, LABEL_PROBE, ObservedResource
from shared.domain.errors import ErrorClass
from shared.domain.models import (
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Desired,
    NodeState,
    Phase,
    QueuedResourceState,
    ResourceRef,
    SpotProbe,
    Tier,
    ZoneMemoryEntry,
)
from shared.domain.planner import (
    CreateQueuedResource,
    OperationOutcome,
    RememberZone,
    WriteStatus,
    needs_ticks,
    plan,
)
from shared.domain.spot_probe import (
    ProbePlan,
    ProbePolicy,
    janitor_reason,
    plan_probes,
    probe_name,
    verdict_of,
    zone_probe_key,
)
from shared.domain.status_merge import merge_status
from shared.domain.zone_memory import CloudFailure, blocking_entry, learn, learn_quota_bound, quota_released
from shared.wiring import Runtime

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ZONE, SAME_REGION, OTHER_REGION = "us-east5-b", "us-east5-a", "europe-west4-a"
QR = QueuedResourceState
POLICY = ProbePolicy()


def _ref(name: str = "gemma-g1-a0", zone: str = ZONE, tier: Tier = Tier.FLEX_START, **fields: Any) -> ResourceRef:
    values: dict[str, Any] = {
        "name": name,
        "zone": zone,
        "tier": tier,
        "generation": 1,
        "attempt": int(name.rsplit("-a", 1)[1]),
        "state": QR.WAITING,
        "created_at": NOW - timedelta(minutes=2),
        "state_since": NOW - timedelta(minutes=2),
        "wait_until": NOW + timedelta(minutes=3),
    }
    values.update(fields)
    return ResourceRef(**values)


def _record(
    refs: Sequence[ResourceRef] = (),
    probes: Sequence[SpotProbe] = (),
    *,
    desired: Desired = Desired.PRESENT,
    zones: tuple[str, ...] = (ZONE, SAME_REGION, OTHER_REGION),
    tiers: tuple[Tier, ...] = (Tier.FLEX_START,),
) -> DeploymentRecord:
    spec = DeploymentSpec(deployment_id="gemma", model="gemma-4-26b-a4b", accelerator="v6e-4", zones=zones, tiers=tiers)
    status = DeploymentStatus(phase=Phase.SEARCHING, resources=list(refs), probes=list(probes), next_attempt=len(refs))
    return DeploymentRecord(
        deployment_id="gemma", spec=spec, desired=desired, status=status, created_at=NOW, updated_at=NOW
    )


def _probe(of: str = "gemma-g1-a0", **fields: Any) -> SpotProbe:
    values: dict[str, Any] = {
        "name": probe_name(of),
        "zone": ZONE,
        "of": of,
        "sent_at": NOW - timedelta(seconds=30),
        "confirmed": True,
        "operation": "projects/p/locations/us-east5-b/operations/op-1",
    }
    values.update(fields)
    return SpotProbe(**values)


def _node(name: str = "gemma-g1-a0-p", *, node_state: NodeState = NodeState.CREATING) -> ObservedResource:
    return ObservedResource(
        name=name,
        zone=ZONE,
        kind="node",
        state=QR.PROVISIONING,
        tier=Tier.SPOT,
        labels={LABEL_DEPLOYMENT: "gemma", LABEL_PROBE: "gemma-g1-a0"},
        node_id=name,
        node_state=node_state,
        created_at=NOW - timedelta(seconds=30),
    )


def _plan(
    record: DeploymentRecord,
    observed: Sequence[ObservedResource] = (),
    outcomes: dict[str, OperationOutcome] | None = None,
    memory: dict[str, ZoneMemoryEntry] | None = None,
    *,
    allowance: int = 2,
    now: datetime = NOW,
    policy: ProbePolicy = POLICY,
) -> ProbePlan:
    return plan_probes(
        record, observed, outcomes or {}, memory or {}, now, policy, allowance=allowance, runtime_version="v2"
    )


# ------------------------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize(
    ("failure", "verdict"),
    [
        (None, "quota"),
        (CloudFailure(ErrorClass.STOCKOUT, "no more capacity", code=8), "capacity"),
        (CloudFailure(ErrorClass.FAILED_PRECONDITION, "insufficient reserved capacity", code=9), "capacity"),
        (CloudFailure(ErrorClass.QUOTA_REGION, "quota exceeded", code=429), "inconclusive"),
        (CloudFailure(ErrorClass.TRANSIENT, "503"), "inconclusive"),
        (CloudFailure(ErrorClass.PERMISSION, "denied"), "inconclusive"),
    ],
)
def test_what_each_answer_of_a_spot_create_means(failure: CloudFailure | None, verdict: str) -> None:
    assert verdict_of(failure) == verdict


# ------------------------------------------------------------------------------------------ who is probed


def test_a_flex_start_request_waiting_past_the_threshold_is_probed_with_a_bare_spot_node() -> None:
    result = _plan(_record([_ref()]))
    (request,) = result.creates
    assert (request.tier, request.queued, request.zone, request.resource_id) == (
        Tier.SPOT,
        False,
        ZONE,
        "gemma-g1-a0-p",
    )
    assert request.labels[LABEL_PROBE] == "gemma-g1-a0" and request.startup_script == ""
    (probe,) = result.status.probes
    assert (probe.of, probe.confirmed, probe.verdict) == ("gemma-g1-a0", False, None)  # recorded before the call
    assert result.status.attempts[-1].outcome == Step.PROBE_SENT
    (zone_entry,) = result.remember
    assert zone_entry.key == zone_probe_key(ZONE, "v6e-4") and zone_entry.until == NOW + timedelta(minutes=15)


@pytest.mark.parametrize(
    ("why", "refs", "memory", "allowance", "desired"),
    [
        ("too fresh", [_ref(created_at=NOW - timedelta(seconds=30))], {}, 2, Desired.PRESENT),
        ("on-demand draws on another pool", [_ref(tier=Tier.ON_DEMAND)], {}, 2, Desired.PRESENT),
        ("a spot wait needs no probe", [_ref(tier=Tier.SPOT)], {}, 2, Desired.PRESENT),
        ("not waiting yet", [_ref(state=QR.CREATING)], {}, 2, Desired.PRESENT),
        ("already probed", [_ref(probe="capacity")], {}, 2, Desired.PRESENT),
        ("no token this tick", [_ref()], {}, 0, Desired.PRESENT),
        ("being stopped", [_ref()], {}, 2, Desired.STOPPED),
        ("our own spot request waits there", [_ref(), _ref("gemma-g1-a1", tier=Tier.SPOT)], {}, 2, Desired.PRESENT),
        (
            "the zone was probed lately",
            [_ref()],
            {
                zone_probe_key(ZONE, "v6e-4"): ZoneMemoryEntry(
                    key=zone_probe_key(ZONE, "v6e-4"),
                    kind="cooldown",
                    error_class="probe",
                    until=NOW + timedelta(minutes=1),
                    updated_at=NOW,
                )
            },
            2,
            Desired.PRESENT,
        ),
        (
            "spot is cooling down there",
            [_ref()],
            {
                e.key: e
                for e in [
                    learn(
                        CloudFailure(ErrorClass.STOCKOUT),
                        zone=ZONE,
                        tier=Tier.SPOT,
                        accelerator="v6e-4",
                        memory={},
                        now=NOW,
                    )
                ]
                if e is not None
            },
            2,
            Desired.PRESENT,
        ),
    ],
)
def test_no_probe_when(
    why: str,
    refs: list[ResourceRef],
    memory: dict[str, ZoneMemoryEntry],
    allowance: int,
    desired: Desired,
) -> None:
    result = _plan(_record(refs, desired=desired), memory=memory, allowance=allowance)
    assert result.creates == [], why
    assert result.status.probes == []


def test_a_policy_that_could_never_probe_or_would_race_the_janitor_is_refused() -> None:
    with pytest.raises(ValueError, match="per_tick"):
        ProbePolicy(per_tick=0)
    with pytest.raises(ValueError, match="max_age_s"):
        ProbePolicy(max_age_s=300, answer_timeout_s=600)


def test_on_demand_waits_are_probed_when_the_policy_says_so() -> None:
    policy = ProbePolicy(tiers=(Tier.FLEX_START, Tier.ON_DEMAND))
    assert len(_plan(_record([_ref(tier=Tier.ON_DEMAND)]), policy=policy).creates) == 1


def test_one_in_flight_per_deployment_longest_waiting_first_and_a_minimum_interval() -> None:
    older = _ref("gemma-g1-a1", zone=OTHER_REGION, created_at=NOW - timedelta(minutes=4))
    record = _record([_ref(), older])
    (request,) = _plan(record).creates
    assert request.zone == OTHER_REGION
    # An answered probe sent a minute ago still holds the deployment's interval.
    answered = _probe(of=older.name, zone=OTHER_REGION, verdict="capacity", sent_at=NOW - timedelta(minutes=1))
    assert _plan(_record([_ref(), older], [answered]), observed=[_node(answered.name)]).creates == []


# ------------------------------------------------------------------------------------------- answers


def test_a_stockout_means_capacity_bound_leaves_zone_memory_alone_and_nothing_to_delete() -> None:
    outcome = OperationOutcome(done=True, failure=CloudFailure(ErrorClass.STOCKOUT, "no more capacity", code=8))
    result = _plan(_record([_ref()], [_probe()]), outcomes={"gemma-g1-a0-p": outcome}, allowance=0)
    assert result.status.resources[0].probe == "capacity"
    assert result.status.attempts[-1].outcome == Step.PROBE_CAPACITY
    assert result.remember == [] and result.forget == []  # the spot pair keeps its rank: one sample, not an attempt
    assert result.deletes == [] and result.status.probes == []  # failed and not listed: nothing left


def test_an_inconclusive_refusal_teaches_what_any_create_would() -> None:
    quota = CloudFailure(ErrorClass.QUOTA_REGION, "Quota 'TPUV6EPreemptible' exhausted", location="us-east5")
    result = _plan(_record([_ref()], [_probe()]), outcomes={"gemma-g1-a0-p": OperationOutcome(True, quota)})
    assert result.status.resources[0].probe == "inconclusive"
    assert [e.key.split("/")[:3] for e in result.remember] == [["quota", "region", "us-east5"]]


def test_a_grant_means_quota_bound_blocks_the_tier_in_the_region_and_deletes_the_probe_at_once() -> None:
    spot_cooling = learn(
        CloudFailure(ErrorClass.STOCKOUT), zone=ZONE, tier=Tier.SPOT, accelerator="v6e-4", memory={}, now=NOW
    )
    assert spot_cooling is not None
    result = _plan(
        _record([_ref()], [_probe()]),
        observed=[_node()],
        outcomes={"gemma-g1-a0-p": OperationOutcome(done=True)},
        memory={spot_cooling.key: spot_cooling},
        allowance=0,
    )
    assert result.status.resources[0].probe == "quota"
    assert result.status.attempts[-1].outcome == Step.PROBE_QUOTA
    assert result.forget == [spot_cooling.key]  # spot was just granted there
    (bound,) = [e for e in result.remember if e.key.startswith("quotabound/")]
    assert (bound.key, bound.until) == ("quotabound/us-east5/v6e/flex_start", NOW + timedelta(minutes=30))
    (delete,) = result.deletes
    assert (delete.zone, delete.name) == (ZONE, "gemma-g1-a0-p")
    (kept,) = result.status.probes
    assert (kept.verdict, kept.delete_requested_at) == ("quota", NOW)
    # The same instant again (a duplicate delivery): no second delete. A later pass, still listed: asked again.
    again = _plan(_record(result.status.resources, result.status.probes), observed=[_node()], allowance=0)
    assert again.deletes == [] and again.status.probes == result.status.probes
    later = NOW + timedelta(minutes=1)
    assert len(_plan(_record([_ref()], [kept]), observed=[_node()], allowance=0, now=later).deletes) == 1
    # Not listed any more after the delete: confirmed gone, dropped.
    assert _plan(_record([_ref()], [kept]), allowance=0, now=later).status.probes == []


def test_a_node_still_creating_past_the_capacity_check_is_granted_and_one_before_is_not_yet() -> None:
    young = _plan(_record([_ref()], [_probe()]), observed=[_node()], allowance=0)
    assert young.status.probes[0].verdict is None and young.deletes == []
    old = _probe(sent_at=NOW - timedelta(seconds=POLICY.granted_after_s))
    assert _plan(_record([_ref()], [old]), observed=[_node()], allowance=0).status.probes[0].verdict == "quota"


def test_unconfirmed_and_unanswered_probes_end_inconclusive() -> None:
    lost = _probe(confirmed=False, operation=None, sent_at=NOW - timedelta(seconds=POLICY.confirm_timeout_s + 1))
    result = _plan(_record([_ref()], [lost]), allowance=0)
    assert result.status.resources[0].probe == "inconclusive" and result.status.probes == []
    silent = _probe(sent_at=NOW - timedelta(seconds=POLICY.answer_timeout_s + 1))
    waiting_node = _node()
    result = _plan(_record([_ref()], [silent]), observed=[waiting_node.model_copy(update={"node_state": None})])
    assert result.status.probes[0].verdict == "quota"  # listed past its capacity check: granted, not silent
    result = _plan(_record([_ref()], [silent]), allowance=0)
    assert result.status.resources[0].probe == "inconclusive"


def test_probes_of_a_deployment_being_deleted_are_still_answered_and_deleted() -> None:
    result = _plan(
        _record([], [_probe()], desired=Desired.ABSENT),
        observed=[_node()],
        outcomes={"gemma-g1-a0-p": OperationOutcome(done=True)},
    )
    assert [d.name for d in result.deletes] == ["gemma-g1-a0-p"] and result.creates == []


# ----------------------------------------------------------------------------------- janitor, ticks, merge


def test_the_janitor_deletes_probes_no_status_holds_and_old_ones() -> None:
    node = _node()
    assert janitor_reason(node, None, NOW, 900) == "a spot probe no deployment holds"
    assert janitor_reason(node, _record([_ref()]), NOW, 900) == "a spot probe no deployment holds"
    assert janitor_reason(node, _record([_ref()], [_probe()]), NOW, 900) is None
    assert janitor_reason(node, _record([_ref()], [_probe()]), NOW + timedelta(minutes=20), 900) is not None


def test_a_probe_in_flight_keeps_the_ticks_on_and_survives_a_concurrent_write() -> None:
    record = _record([], [_probe()], desired=Desired.ABSENT).model_copy(
        update={"status": DeploymentStatus(phase=Phase.DELETED, probes=[_probe()])}
    )
    assert needs_ticks(record)
    base = DeploymentStatus(phase=Phase.SEARCHING)
    fresh = base.model_copy(update={"slis": {"ttft_ms": 1.0}})
    merged = merge_status(base, base.model_copy(update={"probes": [_probe()]}), fresh)
    assert merged.probes == [_probe()] and merged.slis == {"ttft_ms": 1.0}


# ------------------------------------------------------------------------------ planner and zone memory


def test_quota_bound_requests_of_the_region_are_parked_at_once_and_the_search_asks_another_region() -> None:
    waiting = _ref(probe="quota")
    sibling = _ref("gemma-g1-a1", zone=SAME_REGION)  # not probed itself: the region's quota holds it too
    bound = learn_quota_bound(
        zone=ZONE, tier=Tier.FLEX_START, accelerator="v6e-4", now=NOW, duration_s=1800, reason="probe granted"
    )
    record = _record([waiting, sibling])
    observed = [
        ObservedResource(
            name=ref.name, zone=ref.zone, state=QR.WAITING, tier=Tier.FLEX_START, labels={LABEL_DEPLOYMENT: "gemma"}
        )
        for ref in (waiting, sibling)
    ]
    observed.append(_node())  # the probe's node is never taken for a slice
    actions = plan(record, observed, {bound.key: bound}, NOW)
    creates = [a.request.zone for a in actions if isinstance(a, CreateQueuedResource)]
    assert creates == [OTHER_REGION]  # both slots of the hedge freed; the region's flex-start is quota-bound
    assert not [a for a in actions if isinstance(a, RememberZone)]  # no stockout learned for the parked requests
    status = next(a for a in actions if isinstance(a, WriteStatus)).status
    assert {r.name for r in status.resources} == {waiting.name, sibling.name, "gemma-g1-a2"}
    without = plan(_record([_ref(), sibling]), observed[:2], {}, NOW)  # no verdict: both wait out their checks
    assert [a for a in without if isinstance(a, CreateQueuedResource)] == []


def test_a_quota_bound_block_covers_its_region_and_tier_only_and_lifts_when_quota_is_released() -> None:
    bound = learn_quota_bound(
        zone=ZONE, tier=Tier.FLEX_START, accelerator="v6e-4", now=NOW, duration_s=1800, reason="probe granted"
    )
    memory = {bound.key: bound}
    assert blocking_entry(memory, SAME_REGION, Tier.FLEX_START, "v6e-4", NOW) == bound
    assert blocking_entry(memory, SAME_REGION, Tier.SPOT, "v6e-4", NOW) is None
    assert blocking_entry(memory, OTHER_REGION, Tier.FLEX_START, "v6e-4", NOW) is None
    assert blocking_entry(memory, ZONE, Tier.FLEX_START, "v6e-4", NOW + timedelta(minutes=31)) is None
    assert quota_released(memory, SAME_REGION) == [bound.key]


def test_probing_is_a_setting_off_by_default(tmp_path: Path) -> None:
    for setting in (False, True):
        runtime = Runtime(Settings(backend="local", data_dir=tmp_path / str(setting), spot_probe=setting))
        try:
            assert (runtime.provisioner._settings.probe == ProbePolicy()) is setting
        finally:
            runtime.close()
    assert Settings().spot_probe is False
