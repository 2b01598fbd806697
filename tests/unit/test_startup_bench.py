"""The startup benchmark's reading of a VM's stage line and its table (benchmarks/startup.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.startup import Boot, Table, reported_stages
from shared.domain.models import BootStages

STAMP = 1796587716740


@dataclass
class FakeWorld:
    """Guest attributes per node, as the simulator keeps them; a node that is gone raises KeyError."""

    attributes: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)

    def guest_attributes(self, zone: str, node_id: str, query_path: str = "") -> list[tuple[str, str, str]]:
        return [("tpuctl", key, value) for key, value in self.attributes[(zone, node_id)].items()]


def test_a_boot_is_read_once_its_first_token_is_reported_and_only_for_a_later_stamp() -> None:
    world = FakeWorld()
    assert reported_stages(world, "z", "n") is None  # no such node yet
    line = f"boot={STAMP};image=0.29;weights=1.21,hub,1323753;engine=104.26,cold"
    world.attributes[("z", "n")] = {"boot": str(STAMP), "stages": line}
    assert reported_stages(world, "z", "n") is None, "the engine is up but no first token yet"
    world.attributes[("z", "n")]["stages"] = line + ";first_token=0.06"
    found = reported_stages(world, "z", "n")
    assert found is not None and found[0] == STAMP
    assert found[1].seconds["first_token"] == 0.06 and found[1].compile_cache == "cold"
    assert reported_stages(world, "z", "n", after_boot=STAMP) is None, "the same boot is not the next one"
    world.attributes[("z", "n")]["boot"] = "not-a-stamp"
    assert reported_stages(world, "z", "n") is None


def _boot(kind: str, engine: float, source: str, cache: str, wall: float) -> Boot:
    stages = BootStages(
        seconds={"image": 0.2, "weights": 1.0, "engine": engine, "first_token": 0.1},
        weights_source=source,  # type: ignore[arg-type]
        compile_cache=cache,  # type: ignore[arg-type]
    )
    return Boot(kind, "node", stages, wall)


def test_the_table_gives_medians_per_kind_and_ratios_against_cold() -> None:
    table = Table()
    for engine in (100.0, 110.0, 104.0):
        table.add(_boot("cold", engine, "hub", "cold", engine + 30))
    for engine in (40.0, 44.0):
        table.add(_boot("reboot", engine, "cached", "warm", engine + 4))
    assert table.median("cold", "engine") == 104.0 and table.median("reboot", "engine") == 42.0
    assert table.median("replacement", "engine") is None
    lines = table.lines()
    engine = next(line for line in lines if line.startswith("| engine |"))
    assert engine == "| engine | 104.0 | - | 42.0 | - | - | - | 0.40 | - | - |"
    total = next(line for line in lines if line.startswith("| stages total |"))
    assert total == "| stages total | 105.3 | - | 43.3 | - | - | - | 0.41 | - | - |"
    assert "| weights source | hub | - | cached | - | - | | | | |" in lines
    assert "| compile cache | cold | - | warm | - | - | | | | |" in lines
    assert not any(line.startswith("| compile restore") for line in lines), "no boot had the shared cache"
    assert lines[-1] == "runs: cold 3, replacement 0, reboot 2, prewarm 0, restored 0"


def test_the_restored_boot_adds_its_restore_and_the_builder_its_fill() -> None:
    table = Table()
    table.add(_boot("cold", 100.0, "hub", "cold", 130.0))
    restored = _boot("restored", 75.0, "bucket", "warm", 95.0).stages.model_copy(update={"compile_restore": "hit"})
    restored.seconds["compile_restore"] = 0.9
    table.add(Boot("restored", "r", restored, 95.0))
    builder = _boot("prewarm", 100.0, "bucket", "cold", 140.0)
    table.add(Boot("prewarm", "b", builder.stages.model_copy(update={"compile_fill": "filled"}), 140.0))
    lines = table.lines()
    assert "| compile restore | - | - | - | - | 0.9 | - | - | - | - |" in lines
    assert "| shared compile cache | ? | - | - | filled | hit | | | | |" in lines
    total = next(line for line in lines if line.startswith("| stages total |"))
    assert total.split(" | ")[5] == "77.2"  # the restore's own seconds count in the restored boot's total
