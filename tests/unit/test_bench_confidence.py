"""Repeats, 95 % intervals and significance of a change (issue 22, item 4)."""

from __future__ import annotations

import pytest

from shared.domain.bench_confidence import Estimate, change, estimate, t_quantile_975


def test_the_t_interval_of_the_mean_matches_a_hand_computation() -> None:
    # mean 10, sample sd 1 (values 9, 10, 11), t(0.975, 2) = 4.303: half-width 4.303 / sqrt(3) = 2.4844
    result = estimate([9.0, 10.0, 11.0])
    assert result.n == 3 and result.mean == pytest.approx(10.0)
    assert result.mean_low == pytest.approx(10.0 - 2.4844, abs=1e-3)
    assert result.mean_high == pytest.approx(10.0 + 2.4844, abs=1e-3)
    assert result.median == 10.0


def test_the_bootstrap_interval_of_the_median_is_seeded_and_inside_the_data() -> None:
    values = [3.1, 2.9, 3.4, 3.0, 5.0, 3.2, 2.8]
    first, again = estimate(values), estimate(values)
    assert first == again  # fixed seed: the same interval every time
    assert min(values) <= first.median_low <= first.median <= first.median_high <= max(values)
    assert first.median_high < 5.0  # the outlier moves the mean's interval, not the median's
    assert estimate(values, seed=1).median == first.median


def test_one_repeat_has_no_interval_and_never_differs_significantly() -> None:
    one = estimate([7.0])
    assert (one.mean_low, one.mean_high, one.median_low, one.median_high) == (7.0, 7.0, 7.0, 7.0)
    assert one.text() == "7.00"
    verdict = change(estimate([14.0]), one)
    assert verdict["change_pct"] == 100.0 and verdict["significant"] is False


def test_a_change_is_significant_only_when_the_intervals_do_not_overlap() -> None:
    before = estimate([10.0, 10.2, 9.8, 10.1])
    clear = change(estimate([12.0, 12.1, 11.9, 12.2]), before)
    assert clear["significant"] is True and clear["change_pct"] == pytest.approx(20.2, abs=0.05)  # 12.05 / 10.025
    noisy = change(estimate([9.0, 13.0, 10.0, 12.5]), before)
    assert noisy["significant"] is False and noisy["change_pct"] > 0


def test_an_estimate_round_trips_through_its_dict_and_refuses_other_shapes() -> None:
    value = estimate([1.0, 2.0, 4.0])
    back = Estimate.from_dict(value.as_dict(digits=12))
    assert back.n == 3 and back.mean_low == pytest.approx(value.mean_low) and back.median_high == value.median_high
    with pytest.raises(ValueError, match="not an estimate"):
        Estimate.from_dict({"n": 3})


def test_bad_input_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"^values: give at least one"):
        estimate([])
    with pytest.raises(ValueError, match=r"^values: .* finite"):
        estimate([1.0, float("nan")])
    with pytest.raises(ValueError, match=r"^df: "):
        t_quantile_975(0)
    assert t_quantile_975(1) == 12.706 and t_quantile_975(100) == 1.96
