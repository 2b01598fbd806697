"""The monitor reading boot progress: a provisioner and a monitor on one simulated world (the real google-cloud-tpu
client over HTTP, the real SQLite store and local bus, the real vLLM probe against a port nobody listens on), the
node's guest attributes written as its metadata server would. A boot the script reports ``failed`` ends FAILED with
the script's reason and its slice deleted; stages show on the record; hostile text is cleaned and bounded."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.domain.models import BootStages, Phase
from shared.messages import PhaseChanged, ReconcileTick
from tests.support.emulators import free_loopback_port
from tests.support.fixtures_provisioner import HarnessFactory, spot, world
from tests.support.monitor_booting import Booting, start_booting
from tests.support.provisioner_harness import make_spec

ZONE = "us-east5-b"
SCENARIO = world({ZONE: spot(8), "europe-west4-a": spot(0)}, timings={"delete_s": [30, 30]})
BAD_TOKEN = "401 Client Error: Unauthorized for url: https://huggingface.co/api/models/google/gemma-4 (bad token)"


@pytest.fixture
def booting(harness_factory: HarnessFactory, tmp_path: Path) -> Iterator[Booting]:
    made = start_booting(harness_factory(SCENARIO), tmp_path, make_spec(zones=(ZONE,)))
    yield made
    made.bus.close()


def test_the_stages_the_script_reports_show_on_the_record(booting: Booting) -> None:
    booting.tick()
    assert booting.record().status.boot is None  # nothing written yet: nothing shown, nothing decided
    booting.write("image", "pulling")
    booting.tick()
    boot = booting.record().status.boot
    assert boot is not None and (boot.node, boot.stage, boot.detail) == (booting.node.name, "image", "pulling")
    booting.write("weights", "downloading")
    booting.tick()
    record = booting.record()
    assert record.status.phase is Phase.BOOTING
    assert record.status.boot is not None and record.status.boot.stage == "weights"
    assert record.status.boot.stage_since > boot.stage_since


def test_the_stage_times_of_this_boot_land_on_the_record_and_another_boot_s_do_not(booting: Booting) -> None:
    stages = "boot=1767355200000;image=84.20;weights=337.00,hub,62579490816"
    booting.h.world.put_guest_attribute(ZONE, booting.node.name, "tpuctl", "stages", stages)
    booting.write("starting", "container (4 TPU device nodes)")
    booting.tick()
    boot = booting.record().status.boot
    assert boot is not None and boot.stages == BootStages(
        seconds={"image": 84.2, "weights": 337.0}, weights_source="hub", weights_bytes=62579490816
    )
    booting.write("booting", "plan abc", boot="1767355300000")  # the VM rebooted: the old line is not this boot's
    booting.tick()
    boot = booting.record().status.boot
    assert boot is not None and (boot.stage, boot.stages) == ("booting", None)


def test_a_node_that_served_before_its_script_said_so_still_gets_that_boot_s_end(booting: Booting) -> None:
    def serve() -> None:  # the probe saw health first (stored as such: nothing answers the probe in this world)
        record = booting.record()
        served = record.status.model_copy(update={"phase": Phase.SERVING, "serving_since": record.updated_at})
        booting.h.store.put_deployment(record.model_copy(update={"status": served}), expected_version=record.version)

    booting.write("compiling", "container running restarts=0")
    booting.tick()
    serve()
    engine = "boot=1767355200000;image=84.20;weights=3.00,cached,;engine=427.90"
    booting.h.world.put_guest_attribute(ZONE, booting.node.name, "tpuctl", "stages", engine)
    booting.write("failed", "forged after serving")  # a served node's failure is not a boot failure
    booting.tick()
    assert booting.record().status.boot is not None and booting.record().status.boot.stage == "compiling"
    assert booting.record().status.phase is not Phase.FAILED
    serve()
    booting.write("serving", "health 200 after 430s", boot="1767355100000")  # an earlier boot's end: not taken
    booting.tick()
    assert booting.record().status.boot is not None and booting.record().status.boot.stage == "compiling"
    serve()
    booting.write("serving", "health 200 after 430s")
    booting.tick()
    boot = booting.record().status.boot
    assert boot is not None and boot.stage == "serving" and boot.stages is not None
    assert boot.stages.seconds == {"image": 84.2, "weights": 3.0, "engine": 427.9}


def test_a_failed_boot_ends_failed_with_its_reason_within_two_ticks_and_the_slice_goes(booting: Booting) -> None:
    booting.write("weights", "downloading")
    booting.tick()
    booting.write("failed", BAD_TOKEN)  # right after a tick: the next one must end it
    report = booting.tick()
    record = booting.record()
    assert record.status.phase is Phase.FAILED
    assert BAD_TOKEN in record.status.message and booting.node.name in record.status.message
    assert report.phase_changes == {"gemma": (Phase.BOOTING, Phase.FAILED)}
    events = booting.published("events")
    assert [(e.previous, e.phase) for e in events if isinstance(e, PhaseChanged)] == [(Phase.BOOTING, Phase.FAILED)]
    nudges = [m for m in booting.published("ticks") if isinstance(m, ReconcileTick)]
    assert [(m.deployment_id, m.purpose) for m in nudges] == [("gemma", "reconcile")]

    booting.h.provisioner.handle(nudges[0])  # the nudge reaches the provisioner: the slice is deleted at once
    assert booting.h.qrs() == {booting.node.name: "DELETING"}
    booting.h.run(2)
    record = booting.record()
    assert (record.status.phase, record.status.resources, record.status.endpoint) == (Phase.FAILED, [], None)
    assert booting.h.qrs() == {} and BAD_TOKEN in record.status.message  # nothing bills, the reason stays
    booting.h.run(3)
    assert booting.h.qrs() == {} and booting.record().status.phase is Phase.FAILED  # and nothing is searched again


def test_hostile_text_is_cleaned_and_bounded_and_unknown_phases_are_ignored(booting: Booting) -> None:
    booting.write("pwned\x1b]0;owned\x07", "\x1b[2J\x1b[31mspoofed")
    booting.tick()
    record = booting.record()
    assert (record.status.phase, record.status.boot) == (Phase.BOOTING, None)
    hostile = "\x1b[31mOOM\x1b[0m \u202eevil\u202c\x00\x08 " + "A" * 20_000
    booting.write("failed", hostile)
    booting.tick()
    record = booting.record()
    assert record.status.phase is Phase.FAILED
    boot = record.status.boot
    assert boot is not None and boot.detail.startswith("OOM evil AAAA") and len(boot.detail) <= 300
    for text in (boot.detail, record.status.message):
        assert not re.search(r"[\x00-\x1f\x7f\u202a-\u202e\u2066-\u2069]", text)
    assert len(record.status.message) <= 400


def test_a_duplicate_or_out_of_order_tick_and_an_earlier_boot_s_leftovers_change_nothing(booting: Booting) -> None:
    booting.write("compiling", "container running restarts=0", boot="2000")
    booting.tick()
    before = booting.record()
    assert booting.monitor.tick().probed == 0  # the same tick again: skipped
    assert booting.monitor.tick(before.updated_at.replace(second=0)).probed == 0  # an older one: skipped too
    assert booting.record().version == before.version
    booting.write("failed", "left over from the boot before", boot="1000")
    booting.tick()
    after = booting.record()
    assert after.status.phase is Phase.BOOTING
    assert after.status.boot is not None and (after.status.boot.stage, after.status.boot.boot) == ("compiling", 2000)


def test_a_new_generation_after_a_failed_boot_starts_again(booting: Booting) -> None:
    booting.write("failed", BAD_TOKEN)
    booting.tick()
    booting.h.run(2)
    assert booting.record().status.phase is Phase.FAILED and booting.h.qrs() == {}
    booting.h.update(make_spec(zones=(ZONE,), valid_until_minutes=120))  # e.g. after fixing the token
    booting.h.run_until_phase(Phase.BOOTING, minutes=30)
    assert booting.record().generation == 2
    (node,) = booting.h.active()
    assert node.startswith("gemma-g2-")
    booting.h.world.set_node_endpoint(ZONE, node, "127.0.0.1", free_loopback_port())
    booting.h.tick()
    booting.h.world.put_guest_attribute(ZONE, node, "tpuctl", "phase", "booting")
    booting.tick()
    record = booting.record()  # the new node's boot is followed; the old failure is history
    assert record.status.phase is Phase.BOOTING
    assert record.status.boot is not None and (record.status.boot.node, record.status.boot.stage) == (node, "booting")
