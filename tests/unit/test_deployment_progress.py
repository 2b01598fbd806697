"""The one-line progress text of a deployment (``tpu_status(command_id)``, ``tpuctl deploy --wait``), phase by phase.

Pinned: each phase's wording and what it names (the zones being tried, the zone and tier being provisioned, the
boot stage of the current generation's node only, the endpoint, the controller's message), the whole minutes
since the phase began (left out when unknown), and that every piece of untrusted text (boot stage, status
message) goes through the caller's ``clean`` with its limit, with a fallback when cleaning leaves nothing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from shared.domain.deployment_progress import deployment_stage
from shared.domain.models import (
    BootProgress,
    DeploymentRecord,
    DeploymentSpec,
    DeploymentStatus,
    Phase,
    QueuedResourceState,
    ResourceRef,
    Tier,
)
from tests.support.builders import ISSUED_AT, spec_dict

NOW = ISSUED_AT
FIVE_MIN_AGO = NOW - timedelta(minutes=5, seconds=30)


def deployment(phase: Phase, *, generation: int = 2, **status: object) -> DeploymentRecord:
    return DeploymentRecord(
        deployment_id="gemma-a",
        spec=DeploymentSpec.model_validate(spec_dict()),
        generation=generation,
        status=DeploymentStatus(phase=phase, **status),
        created_at=NOW - timedelta(hours=1),
        updated_at=NOW,
    )


def ref(
    name: str,
    zone: str = "us-east5-b",
    tier: Tier = Tier.SPOT,
    state: QueuedResourceState = QueuedResourceState.WAITING,
    generation: int = 2,
) -> ResourceRef:
    return ResourceRef(name=name, zone=zone, tier=tier, generation=generation, attempt=1, state=state)


def boot(node: str, stage: str = "image", detail: str = "pulling") -> BootProgress:
    return BootProgress(node=node, stage=stage, detail=detail, boot=1, stage_since=NOW, seen_at=NOW)


def tagged(text: str, limit: int) -> str:
    """A cleaner that shows it ran and with which limit (and, like the real one, keeps empty text empty)."""
    return f"<{limit}:{text}>" if text else ""


def erased(text: str, limit: int) -> str:
    """A cleaner that finds nothing worth keeping."""
    return ""


# --- phase by phase -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param(
            deployment(Phase.PENDING, phase_since=FIVE_MIN_AGO),
            "Accepted: planning the capacity search",
            id="pending-has-no-minutes",
        ),
        pytest.param(
            deployment(Phase.SEARCHING, phase_since=FIVE_MIN_AGO),
            "Waiting for capacity (trying zones, 5 min)",
            id="searching-with-no-request-out",
        ),
        pytest.param(
            deployment(
                Phase.SEARCHING,
                phase_since=FIVE_MIN_AGO,
                resources=[
                    ref("r1", "us-east5-b", Tier.SPOT, QueuedResourceState.WAITING),
                    ref("r2", "europe-west4-a", Tier.FLEX_START, QueuedResourceState.ACCEPTED),
                    ref("r3", "us-east1-d", Tier.ON_DEMAND, QueuedResourceState.CREATING),
                ],
            ),
            "Waiting for capacity (us-east5-b spot, europe-west4-a flex_start, us-east1-d on_demand, 5 min)",
            id="searching-names-the-waiting-requests",
        ),
        pytest.param(
            deployment(
                Phase.SEARCHING,
                resources=[
                    ref("r1", "us-east5-a", state=QueuedResourceState.FAILED),
                    ref("r2", "us-east5-b", state=QueuedResourceState.ACTIVE),
                    ref("r3", "us-east5-c", state=QueuedResourceState.DELETING),
                    ref("r4", "us-east1-d", state=QueuedResourceState.UNKNOWN),
                ],
            ),
            "Waiting for capacity (trying zones)",
            id="searching-ignores-requests-not-waiting-and-no-phase-since",
        ),
        pytest.param(
            deployment(
                Phase.SEARCHING,
                resources=[ref(f"r{i}", zone) for i, zone in enumerate(("us-east5-a", "us-east5-b", "us-east5-c"))]
                + [ref("r9", "us-east1-d")],
            ),
            "Waiting for capacity (us-east5-a spot, us-east5-b spot, us-east5-c spot)",
            id="searching-names-at-most-three",
        ),
        pytest.param(
            deployment(Phase.PROVISIONING, zone="us-east5-b", tier=Tier.FLEX_START, phase_since=FIVE_MIN_AGO),
            "Provisioning the TPU VM in us-east5-b (flex_start, 5 min)",
            id="provisioning-names-zone-and-tier",
        ),
        pytest.param(
            deployment(Phase.PROVISIONING),
            "Provisioning the TPU VM in ? (?)",
            id="provisioning-before-zone-and-tier-are-known",
        ),
        pytest.param(
            deployment(Phase.BOOTING, phase_since=FIVE_MIN_AGO),
            "Booting: pulling the image and the model weights, 5 min",
            id="booting-before-the-node-reports",
        ),
        pytest.param(
            deployment(Phase.COMPILING),
            "Starting vLLM: loading weights and compiling",
            id="compiling-before-the-node-reports",
        ),
        pytest.param(
            deployment(Phase.SERVING, endpoint="http://10.0.0.5:8000", phase_since=FIVE_MIN_AGO),
            "Healthy: serving at http://10.0.0.5:8000",
            id="serving-names-the-endpoint-not-the-minutes",
        ),
        pytest.param(
            deployment(Phase.DEGRADED, message="ttft p90 over 2 s", phase_since=FIVE_MIN_AGO),
            "Unhealthy (DEGRADED, 5 min): ttft p90 over 2 s",
            id="degraded-with-message",
        ),
        pytest.param(deployment(Phase.STALLED), "Unhealthy (STALLED)", id="stalled-without-message"),
        pytest.param(
            deployment(Phase.DOWN, message="connection refused"),
            "Unhealthy (DOWN): connection refused",
            id="down-with-message",
        ),
        pytest.param(
            deployment(Phase.FAILED, message="boot failed on gemma-a-g2-a1: HTTP 401", phase_since=FIVE_MIN_AGO),
            "Failed: boot failed on gemma-a-g2-a1: HTTP 401",
            id="failed-names-the-message-not-the-minutes",
        ),
        pytest.param(
            deployment(Phase.FAILED),
            "Failed: see the attempts in tpu_status(deployment_id='gemma-a')",
            id="failed-without-message",
        ),
        pytest.param(deployment(Phase.STOPPING, phase_since=FIVE_MIN_AGO), "Stopping, 5 min", id="stopping"),
        pytest.param(deployment(Phase.STOPPED), "Stopped", id="stopped"),
        pytest.param(deployment(Phase.DELETING, phase_since=FIVE_MIN_AGO), "Deleting, 5 min", id="deleting"),
        pytest.param(deployment(Phase.DELETED), "Deleted", id="deleted"),
    ],
)
def test_each_phase_reads_as_a_person_expects(case: DeploymentRecord, expected: str) -> None:
    assert deployment_stage(case, NOW) == expected


def test_every_phase_has_a_progress_line() -> None:
    for phase in Phase:
        assert deployment_stage(deployment(phase), NOW).strip()


# --- minutes in the phase -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_phase", "shown"),
    [
        (timedelta(0), ", 0 min"),
        (timedelta(seconds=59), ", 0 min"),
        (timedelta(seconds=60), ", 1 min"),
        (timedelta(seconds=119), ", 1 min"),
        (timedelta(hours=2, seconds=5), ", 120 min"),
    ],
)
def test_minutes_in_the_phase_are_whole_minutes_rounded_down(in_phase: timedelta, shown: str) -> None:
    line = deployment_stage(deployment(Phase.STOPPING, phase_since=NOW - in_phase), NOW)
    assert line == "Stopping" + shown


# --- the boot stage -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("phase", "prefix"), [(Phase.BOOTING, "Booting: "), (Phase.COMPILING, "Starting vLLM: ")])
def test_the_boot_stage_of_the_current_node_is_shown(phase: Phase, prefix: str) -> None:
    case = deployment(phase, resources=[ref("gemma-a-g2-a1")], boot=boot("gemma-a-g2-a1", "weights", "3 of 9"))
    assert deployment_stage(case, NOW) == prefix + "downloading weights (3 of 9)"


@pytest.mark.parametrize(
    ("resources", "node"),
    [
        pytest.param([ref("gemma-a-g1-a1", generation=1)], "gemma-a-g1-a1", id="node-of-an-older-generation"),
        pytest.param([ref("gemma-a-g2-a1")], "gemma-a-g2-a9", id="node-the-deployment-does-not-hold"),
        pytest.param([], "gemma-a-g2-a1", id="no-resources-at-all"),
    ],
)
def test_a_boot_stage_from_another_node_is_not_shown(resources: list[ResourceRef], node: str) -> None:
    case = deployment(Phase.BOOTING, resources=resources, boot=boot(node, "serving", "health 200"))
    assert deployment_stage(case, NOW) == "Booting: pulling the image and the model weights"


# --- untrusted text goes through clean ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param(
            deployment(Phase.BOOTING, resources=[ref("n1")], boot=boot("n1", "image", "x")),
            "Booting: <200:pulling image (x)>",
            id="boot-stage-limit-200",
        ),
        pytest.param(
            deployment(Phase.DOWN, message="refused"),
            "Unhealthy (DOWN): <160:refused>",
            id="unhealthy-message-limit-160",
        ),
        pytest.param(
            deployment(Phase.FAILED, message="HTTP 401"),
            "Failed: <200:HTTP 401>",
            id="failed-message-limit-200",
        ),
        pytest.param(
            deployment(Phase.SEARCHING, resources=[ref("n1")]),
            "Waiting for capacity (us-east5-b spot)",
            id="zones-and-tiers-are-domain-values-not-cleaned",
        ),
    ],
)
def test_untrusted_text_is_cleaned_with_its_limit(case: DeploymentRecord, expected: str) -> None:
    assert deployment_stage(case, NOW, clean=tagged) == expected


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param(
            deployment(Phase.COMPILING, resources=[ref("n1")], boot=boot("n1", "compiling", "\x1b[31m")),
            "Starting vLLM: loading weights and compiling",
            id="compiling",
        ),
        pytest.param(deployment(Phase.STALLED, message="\u202e"), "Unhealthy (STALLED)", id="stalled"),
        pytest.param(
            deployment(Phase.FAILED, message="\x00\x00"),
            "Failed: see the attempts in tpu_status(deployment_id='gemma-a')",
            id="failed",
        ),
    ],
)
def test_text_cleaned_to_nothing_falls_back_to_the_default_wording(case: DeploymentRecord, expected: str) -> None:
    assert deployment_stage(case, NOW, clean=erased) == expected


def test_without_a_cleaner_the_text_is_kept_as_is() -> None:
    case = deployment(Phase.DOWN, message="a" * 500)
    assert deployment_stage(case, NOW) == "Unhealthy (DOWN): " + "a" * 500


def test_the_time_is_read_from_now_not_the_record() -> None:
    case = deployment(Phase.STOPPED, phase_since=NOW)
    assert deployment_stage(case, NOW + timedelta(minutes=7)) == "Stopped, 7 min"
