"""stats.py against exact cases and against its own stated error rates (simulated with fixed seeds)."""

import math

import numpy as np
import pytest

from speculative.sampling import stats

P = [0.5, 0.3, 0.2]


def test_perfect_fit_has_p_value_one():
    result = stats.goodness_of_fit([500, 300, 200], P)
    assert result.statistic == 0 and result.p_value == pytest.approx(1.0)
    assert result.dof == 2 and result.n == 1000


def test_statistic_matches_the_formula():
    counts = [520, 280, 200]
    expected = np.array(P) * 1000
    statistic = float(((np.array(counts) - expected) ** 2 / expected).sum())
    result = stats.goodness_of_fit(counts, P)
    assert result.statistic == pytest.approx(statistic)
    assert result.p_value == pytest.approx(math.exp(-statistic / 2))  # chi-square with 2 dof


def test_impossible_outcome_rejects_at_once():
    result = stats.goodness_of_fit([10, 0, 0, 1], [0.5, 0.3, 0.2, 0.0])
    assert result.p_value == 0 and result.impossible == 1 and result.rejects()


def test_sparse_cells_are_pooled():
    probs = [0.9] + [0.1 / 20] * 20  # 20 cells of expected 0.5 each with n = 100
    result = stats.goodness_of_fit([90] + [1] * 10 + [0] * 10, probs)
    assert result.cells == 2  # the 20 sparse cells form one pool of expected 10


def test_pooled_cells_are_the_cells_the_test_uses():
    rng = np.random.default_rng(3)
    probs = np.concatenate([[0.6, 0.2], np.full(40, 0.2 / 40)])
    other = np.concatenate([[0.5, 0.3], np.full(40, 0.2 / 40)])
    counts = rng.multinomial(300, probs)
    expected, observed, other_expected = stats.pooled_cells(counts, probs, other)
    result = stats.goodness_of_fit(counts, probs)
    assert expected.size == observed.size == other_expected.size == result.cells == 3  # the pool, then two cells
    assert observed.sum() == counts.sum() and expected.sum() == pytest.approx(300) == other_expected.sum()
    assert float(((observed - expected) ** 2 / expected).sum()) == pytest.approx(result.statistic)
    assert expected[0] == pytest.approx(300 * 0.2) and other_expected[-1] == pytest.approx(300 * 0.5)


def test_false_alarm_rate_is_what_the_p_value_says():
    # Under the null, P(p-value < 0.01) should be about 0.01; with 4000 fixed-seed trials the count of
    # alarms is Binomial(4000, 0.01): mean 40, sd 6.3. The band [15, 70] is over 4 sd wide each side.
    rng = np.random.default_rng(12345)
    alarms = sum(stats.goodness_of_fit(rng.multinomial(500, P), P).p_value < 0.01 for _ in range(4000))
    assert 15 <= alarms <= 70


def test_samples_needed_delivers_the_stated_power():
    alternative = [0.35, 0.39, 0.26]
    n = stats.samples_needed(P, alternative, false_alarm=1e-6, power=0.9)
    rng = np.random.default_rng(7)
    hits = sum(stats.goodness_of_fit(rng.multinomial(n, alternative), P).rejects() for _ in range(1000))
    # stated power 0.9: Binomial(1000, 0.9) has sd 9.5; accept 0.85..0.95 (over 5 sd each side)
    assert 850 <= hits <= 950
    # and half the samples is clearly not enough
    hits_half = sum(stats.goodness_of_fit(rng.multinomial(n // 2, alternative), P).rejects() for _ in range(1000))
    assert hits_half < 700


def test_tv_only_bound_is_conservative():
    alternative = [0.35, 0.39, 0.26]  # TV 0.15 from P
    assert stats.samples_needed(P, tv=0.15) >= stats.samples_needed(P, alternative) * 0.999


def test_impossible_mass_needs_few_samples():
    n = stats.samples_needed([0.5, 0.5, 0.0], [0.45, 0.45, 0.1], power=0.999)
    assert n <= math.ceil(math.log(0.001) / math.log(0.9))


def test_detectable_tv_inverts_samples_needed():
    tv = stats.detectable_tv(10_000, P)
    assert stats.samples_needed(P, tv=tv) <= 10_000 < stats.samples_needed(P, tv=tv * 0.95)
    # the closed form is the smallest such distance, to a millionth, at every size and number of cells
    for cells in (2, 3, 40, 900):
        null = [1 / cells] * cells
        for n in (1, 7, 500, 12_345, 200_000):
            for false_alarm in (stats.FALSE_ALARM_RATE, 0.05):
                tv = stats.detectable_tv(n, null, false_alarm=false_alarm)
                if tv < 1:
                    assert stats.samples_needed(null, tv=tv, false_alarm=false_alarm) <= n
                    assert stats.samples_needed(null, tv=tv * (1 - 1e-6), false_alarm=false_alarm) > n
                else:
                    assert stats.samples_needed(null, tv=1.0, false_alarm=false_alarm) > n


def test_tv_estimate_and_its_bound():
    estimate, upper = stats.tv_estimate([500, 300, 200], P)
    assert estimate == 0 and upper > 0
    # the bound holds: samples from a law at TV 0.15 from P; over 300 fixed-seed draws of 2000 samples the
    # upper bound never falls below the true 0.15 (its stated failure rate is 1e-3 per draw)
    rng = np.random.default_rng(3)
    alternative = [0.35, 0.39, 0.26]
    bounds = [stats.tv_estimate(rng.multinomial(2000, alternative), P, confidence=0.999)[1] for _ in range(300)]
    assert min(bounds) >= 0.15
    estimate, _ = stats.tv_estimate([0, 0, 1000], P)
    assert estimate == pytest.approx(0.8)


def test_counts_of_rejects_out_of_range_ids():
    assert stats.counts_of([0, 2, 2], 3).tolist() == [1, 0, 2]
    with pytest.raises(ValueError, match="outside"):
        stats.counts_of([0, 3], 3)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: stats.goodness_of_fit([1, 2], P), "entries"),
        (lambda: stats.goodness_of_fit([0, 0, 0], P), "no samples"),
        (lambda: stats.goodness_of_fit([1, 1, 1], [0.5, 0.5, 0.5]), "sums to"),
        (lambda: stats.samples_needed(P), "alternative"),
        (lambda: stats.samples_needed(P, P), "equals the null"),
        (lambda: stats.tv_estimate([1, 1, 1], P, confidence=1.0), "confidence"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_two_sample_test_accepts_same_law_and_rejects_another():
    rng = np.random.default_rng(21)
    # same law: over 2000 fixed-seed trials the alarm count at level 0.01 is Binomial(2000, 0.01):
    # mean 20, sd 4.5; accept [5, 40]
    alarms = sum(stats.two_sample_test(rng.multinomial(400, P), rng.multinomial(600, P)).p_value < 0.01
                 for _ in range(2000))
    assert 5 <= alarms <= 40
    different = stats.two_sample_test(rng.multinomial(3000, P), rng.multinomial(3000, [0.35, 0.39, 0.26]))
    assert different.rejects()
    with pytest.raises(ValueError, match="differ in length"):
        stats.two_sample_test([1, 2], [1, 2, 3])


def test_detectable_difference_has_the_stated_power():
    # simulate the two-proportion test at the gap it names: it must reject at about the stated power
    rng = np.random.default_rng(7)
    rate, n = 0.2, 800
    gap = stats.detectable_difference(rate, n, level=0.05, power=0.8)
    rejected = 0
    trials = 2000
    for _ in range(trials):
        a, b = rng.binomial(n, rate - gap / 2), rng.binomial(n, rate + gap / 2)
        rejected += stats.two_sample_test([a, n - a], [b, n - b]).p_value < 0.05
    # 2000 trials: the share's standard error is 0.009, so 0.75-0.85 fails by chance about once in 1e7
    assert 0.75 < rejected / trials < 0.85
    with pytest.raises(ValueError, match="rate"):
        stats.detectable_difference(0.0, 10)
