"""The telemetry reading's wire (what the node agent writes, what the monitor accepts) and its reductions."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from shared.domain.tpu_telemetry import (
    MAX_CHIPS,
    ChipReading,
    TpuTelemetry,
    encode,
    read_telemetry,
    summarize,
    telemetry_slis,
)

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
GIB = 1 << 30


def keep(text: str, limit: int) -> str:
    return text.replace("hf_secret", "[redacted]")[:limit]


def test_what_the_agent_writes_the_monitor_reads_back_unchanged() -> None:
    chips = (ChipReading(1, 3 * GIB, 32 * GIB, 12.5, None), ChipReading(0, GIB, 32 * GIB, 99.0, 7.0, 3.25))
    sent = TpuTelemetry(NOW, chips)
    got = read_telemetry(encode(sent), NOW + timedelta(seconds=5), 180.0, keep)
    assert got is not None and got.sampled_at == NOW
    assert got.chips == tuple(sorted(sent.chips, key=lambda c: c.chip))


@pytest.mark.parametrize("offset_s", [-181.0, 181.0])
def test_a_reading_too_old_or_from_the_future_is_refused(offset_s: float) -> None:
    value = encode(TpuTelemetry(NOW + timedelta(seconds=offset_s), (ChipReading(0, 1, 2),)))
    assert read_telemetry(value, NOW, 180.0, keep) is None


def test_too_many_chips_is_refused_whole() -> None:
    chips = tuple(ChipReading(i, 1, 2) for i in range(MAX_CHIPS + 1))
    assert read_telemetry(encode(TpuTelemetry(NOW, chips)), NOW, 180.0, keep) is None


def test_the_error_text_goes_through_the_callers_cleaner() -> None:
    value = encode(TpuTelemetry(NOW, error="read failed with hf_secret\n\nin it"))
    got = read_telemetry(value, NOW, 180.0, keep)
    assert got is not None and got.error == "read failed with [redacted] in it" and telemetry_slis(got) == {}


def test_a_benchmarks_summary_has_peaks_and_the_mean_duty_cycle_and_utilisation() -> None:
    readings = [
        TpuTelemetry(NOW, (ChipReading(0, 8 * GIB, 32 * GIB, 20.0, tensorcore_util_pct=2.0),)),
        TpuTelemetry(NOW, (ChipReading(0, 24 * GIB, 32 * GIB, 80.0, tensorcore_util_pct=9.0),)),
        TpuTelemetry(NOW, error="no service yet"),
    ]
    assert summarize(readings) == {
        "samples": 2.0,
        "hbm_used_frac_peak": 0.75,
        "hbm_used_gib_peak": 24.0,
        "duty_cycle_pct_mean": 50.0,
        "duty_cycle_pct_peak": 80.0,
        "tensorcore_util_pct_mean": 5.5,
        "tensorcore_util_pct_peak": 9.0,
    }
    assert summarize([]) == {}


def test_a_sample_keeps_the_mean_utilisation_and_leaves_it_out_when_no_chip_has_one() -> None:
    both = TpuTelemetry(NOW, (ChipReading(0, GIB, 32 * GIB, tensorcore_util_pct=4.0), ChipReading(1, GIB, 32 * GIB)))
    assert telemetry_slis(both)["tpu_tensorcore_util_pct"] == 4.0
    assert "tpu_tensorcore_util_pct" not in telemetry_slis(TpuTelemetry(NOW, (ChipReading(0, GIB, 32 * GIB),)))


@pytest.mark.parametrize("util", [101.0, -1.0, "50", float("nan")])
def test_a_utilisation_outside_a_percentage_refuses_the_reading_whole(util: object) -> None:
    chip = {"chip": 0, "hbm_used": GIB, "hbm_total": 32 * GIB, "tc_util_pct": util}
    value = json.dumps({"at": NOW.isoformat(), "chips": [chip]})
    assert read_telemetry(value, NOW, 180.0, keep) is None


def test_the_controller_keeps_the_tpu_summary_of_a_benchmark_and_drops_forged_values() -> None:
    from shared.domain.untrusted import clean_benchmark_result

    summary = summarize([TpuTelemetry(NOW, (ChipReading(0, 16 * GIB, 32 * GIB, 40.0),))])
    kept = clean_benchmark_result({"tpu": summary})
    assert kept["tpu"] == summary
    forged = clean_benchmark_result({"tpu": {"hbm_used_frac_peak": 7.0, "duty_cycle_pct_mean": 30.0, "x": 1}})
    assert forged["tpu"] == {"duty_cycle_pct_mean": 30.0} and forged["fields_dropped"] >= 2
