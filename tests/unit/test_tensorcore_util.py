"""TensorCore utilisation: the agent's libtpu SDK reader, run as a real child against the twin's stand-in SDK.

The child (``python -m node_agent.tensorcore_util``) imports ``libtpu.sdk`` as on the serving image; here that is
the twin's stand-in (``localcloud/vm_twin/libtpu_standin``), which answers from the device file a test writes.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from localcloud.vm_twin.image import VllmCpuImage
from localcloud.vm_twin.tpu_device import DEVICE_FILE, ServingLoad, chips_from_load, write_devices
from node_agent.tensorcore_util import (
    UNAVAILABLE,
    TensorCoreUtilReader,
    UtilReading,
    parse_answer,
    per_chip,
    with_utilisation,
)
from shared.domain.tpu_telemetry import ChipReading, TpuTelemetry

GIB = 1 << 30
REPO_ROOT = Path(__file__).resolve().parents[2]
STANDIN = REPO_ROOT / "localcloud" / "vm_twin" / "libtpu_standin"
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _chips(*utils: float | None) -> list[dict[str, object]]:
    chips: list[dict[str, object]] = []
    for index, util in enumerate(utils):
        chip: dict[str, object] = {"chip": index, "hbm_total_bytes": 32 * GIB, "hbm_used_bytes": GIB}
        if util is not None:
            chip["tensorcore_util_pct"] = util
        chips.append(chip)
    return chips


@pytest.fixture
def device_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in SDK on the child's path (as on the twin image's python3), reading ``tmp_path``'s device file."""
    path = tmp_path / DEVICE_FILE
    monkeypatch.setenv("PYTHONPATH", f"{STANDIN}:{REPO_ROOT}")
    monkeypatch.setenv("TPUCTL_TWIN_TPU_DEVICE_FILE", str(path))
    return path


class TestAnswer:
    def test_numbers_and_the_sdks_numeric_text_are_percentages(self) -> None:
        assert parse_answer('noise\n{"cores": ["1.50", 99, 0]}\n') == UtilReading(cores=(1.5, 99.0, 0.0))
        assert parse_answer('{"cores": ["100.3"]}').cores == (100.0,)  # libtpu's rounding past the edge

    @pytest.mark.parametrize(
        ("text", "reason"),
        [
            ("", "printed no answer"),
            ("Segmentation fault", "printed no answer"),
            ('{"cores": []}', "no per-core"),
            ('{"cores": [1, "x"]}', "outside 0..100"),
            ('{"cores": [150]}', "outside 0..100"),
            ('{"cores": [true]}', "outside 0..100"),
            ('{"cores": [' + ",".join(["1"] * 257) + "]}", "no per-core"),
            ('{"error": "tensorcore_util:\\n RuntimeError: no agent"}', "tensorcore_util: RuntimeError: no agent"),
        ],
    )
    def test_anything_else_is_an_error_never_a_guess(self, text: str, reason: str) -> None:
        reading = parse_answer(text)
        assert reading.cores == () and reason in reading.error


class TestPerChip:
    def test_one_value_per_chip_or_the_mean_of_each_chips_cores(self) -> None:
        assert per_chip([10.0, 20.0], 2) == [10.0, 20.0]
        assert per_chip([10.0, 20.0, 30.0, 50.0], 2) == [15.0, 40.0]

    def test_counts_that_do_not_divide_are_no_answer(self) -> None:
        assert per_chip([10.0, 20.0, 30.0], 2) is None
        assert per_chip([], 2) is None
        assert per_chip([1.0], 0) is None


class TestCombined:
    reading = TpuTelemetry(NOW, (ChipReading(0, GIB, 32 * GIB, 90.0), ChipReading(1, GIB, 32 * GIB, 80.0)))

    def test_each_chip_gets_its_utilisation_and_keeps_the_rest(self) -> None:
        combined = with_utilisation(lambda: self.reading, lambda: UtilReading(cores=(3.0, 5.0)))()
        assert [(c.duty_cycle_pct, c.tensorcore_util_pct) for c in combined.chips] == [(90.0, 3.0), (80.0, 5.0)]
        assert combined.error == ""

    def test_a_failed_utilisation_read_is_noted_and_hbm_and_duty_cycle_stay(self) -> None:
        combined = with_utilisation(lambda: self.reading, lambda: UtilReading(error="no SDK"))()
        assert combined.chips == self.reading.chips
        assert combined.error == "TensorCore utilisation: no SDK"
        mismatched = with_utilisation(lambda: self.reading, lambda: UtilReading(cores=(1.0, 2.0, 3.0)))()
        assert mismatched.chips == self.reading.chips and "3 cores' utilisation for 2 chips" in mismatched.error

    def test_no_chips_asks_nothing_of_the_sdk(self) -> None:
        asked: list[bool] = []

        def util() -> UtilReading:
            asked.append(True)
            return UtilReading(cores=(1.0,))

        empty = TpuTelemetry(NOW, error="no service")
        assert with_utilisation(lambda: empty, util)() == empty and asked == []


class TestReaderChild:
    def test_the_child_reads_each_chips_utilisation_from_the_sdk(self, device_file: Path) -> None:
        write_devices(device_file, _chips(12.5, 7.0), pinned=True)
        assert TensorCoreUtilReader().read() == UtilReading(cores=(12.5, 7.0))
        write_devices(device_file, _chips(40.0, 41.0), pinned=True)  # read anew each time
        assert TensorCoreUtilReader().read().cores == (40.0, 41.0)

    def test_a_runtime_not_up_or_a_metric_not_reported_is_the_sdks_reason(self, device_file: Path) -> None:
        assert "RuntimeError: the TPU runtime is not initialised" in TensorCoreUtilReader().read().error
        write_devices(device_file, _chips(None), pinned=True)
        assert "ValueError" in TensorCoreUtilReader().read().error

    def test_without_libtpu_it_says_so_and_asks_again_only_after_a_pause(
        self, device_file: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        write_devices(device_file, _chips(5.0), pinned=True)
        monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
        reader = TensorCoreUtilReader()
        assert reader.read() == UtilReading(error=UNAVAILABLE)
        monkeypatch.setenv("PYTHONPATH", f"{STANDIN}:{REPO_ROOT}")  # would answer now, but the pause holds
        assert reader.read() == UtilReading(error=UNAVAILABLE)
        assert TensorCoreUtilReader().read().cores == (5.0,)

    def test_a_hung_child_is_killed_at_the_deadline(self, tmp_path: Path) -> None:
        hang = tmp_path / "python"
        hang.write_text("#!/bin/sh\nexec sleep 30\n")
        hang.chmod(0o755)
        reading = TensorCoreUtilReader(python=str(hang), timeout_s=0.5).read()
        assert reading.cores == () and "did not answer within 0.5 s" in reading.error


def test_the_twin_images_python3_has_the_sdk_and_its_vllm_does_not(tmp_path: Path) -> None:
    """On a TPU image libtpu is in the image's Python; the twin's CPU vLLM must not see it (it would think it ran
    on a TPU), so the stand-in is on ``python3``'s path only."""
    VllmCpuImage(  # writes its bin/python3 and bin/vllm
        tmp_path / "image", python=Path(sys.executable), model_dir=tmp_path, log_path=lambda _s: tmp_path, env={}
    )
    device = tmp_path / DEVICE_FILE
    write_devices(device, _chips(33.0), pinned=True)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "TPUCTL_TWIN_TPU_DEVICE_FILE": str(device)}
    python3 = tmp_path / "image" / "bin" / "python3"
    done = subprocess.run([python3, "-m", "node_agent.tensorcore_util"], env=env, capture_output=True, text=True)
    assert parse_answer(done.stdout).cores == (33.0,), done.stderr
    vllm_wrapper = (tmp_path / "image" / "bin" / "vllm").read_text()
    assert "libtpu_standin" not in vllm_wrapper and "PYTHONPATH" not in vllm_wrapper


def test_the_twins_updater_writes_a_utilisation_from_the_batch_fill() -> None:
    load = ServingLoad(polls=4)
    for running in (0.0, 8.0, 16.0, 8.0):
        load.observe(f'vllm:num_requests_running{{model_name="g"}} {running}\n')
    assert load.duty_cycle_pct == 75.0
    assert load.tensorcore_util_pct(max_seqs=16) == 50.0
    chips = chips_from_load(2, 32 * GIB, 0.0, load.duty_cycle_pct, 0.9, load.tensorcore_util_pct(16))
    assert [c["tensorcore_util_pct"] for c in chips] == [50.0, 50.0]
    load.idle()
    assert load.running[-1] == 0.0
