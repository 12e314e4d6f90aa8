"""Statistics for "this sampler's output has distribution p": tests, a TV bound, and sample sizes.

Explained in: notebooks/05_pitfalls (power against each mistake) and notebooks/06_three_equalities.

The suite's convention: a goodness-of-fit test *rejects* when its p-value is below
:data:`FALSE_ALARM_RATE`. For a correct sampler the p-value is (asymptotically) uniform, so each such
test raises a false alarm with probability 1e-6; all tests use fixed seeds on top of that, so a run of
the suite is deterministic. Sample sizes for sabotage tests come from :func:`samples_needed`, so the
power against each planted mistake is stated, not hoped for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from scipy import optimize
from scipy import stats as sps

__all__ = [
    "FALSE_ALARM_RATE",
    "GofResult",
    "goodness_of_fit",
    "pooled_cells",
    "detectable_difference",
    "power",
    "power_from_sample",
    "tv_estimate",
    "samples_needed",
    "detectable_tv",
    "counts_of",
    "pooled",
    "two_sample_test",
    "measured_acceptance_rate",
]

#: Reject "the output has distribution p" when the p-value falls below this.
FALSE_ALARM_RATE = 1e-6


@dataclass(frozen=True)
class GofResult:
    """A goodness-of-fit result: Pearson's chi-square after pooling sparse cells."""

    statistic: float
    dof: int
    p_value: float
    n: int  # number of samples
    cells: int  # cells after pooling
    impossible: int  # samples that fell on outcomes of probability 0

    def rejects(self, false_alarm: float = FALSE_ALARM_RATE) -> bool:
        return self.p_value < false_alarm


def counts_of(samples, num_outcomes: int) -> np.ndarray:
    """Return how often each outcome 0..num_outcomes-1 occurs in ``samples``; an id outside raises."""
    values = np.asarray(samples, dtype=np.int64).ravel()
    if values.size and (values.min() < 0 or values.max() >= num_outcomes):
        raise ValueError(f"samples contain ids outside [0, {num_outcomes}): min {values.min()}, max {values.max()}")
    return np.bincount(values, minlength=num_outcomes)


def _as_probs(probs: Sequence, size: int) -> np.ndarray:
    expected = np.array(probs, dtype=np.float64)
    if expected.shape != (size,):
        raise ValueError(f"probs has {expected.size} entries but counts has {size}")
    if not np.all(np.isfinite(expected)) or np.any(expected < 0):
        raise ValueError("probs must be finite and non-negative")
    if abs(expected.sum() - 1) > 1e-6:
        raise ValueError(f"probs sums to {expected.sum()!r}, not 1")
    return expected


def _pool(expected: np.ndarray, *observed: np.ndarray, min_expected: float = 5.0) -> tuple[np.ndarray, ...]:
    """Merge every cell expected below ``min_expected`` into one pool, then grow the pool with the next
    smallest cells until it reaches ``min_expected`` itself. Returns (expected, *observed), pooled alike."""
    order = np.argsort(expected, kind="stable")
    arrays = [expected[order]] + [o[order] for o in observed]
    split = int((arrays[0] < min_expected).sum())  # the sparse cells form the sorted head
    if split:
        # grow the head until its sum reaches min_expected: the first index where the running sum does
        reached = np.flatnonzero(np.cumsum(arrays[0]) >= min_expected)
        split = max(split, int(reached[0]) + 1 if reached.size else arrays[0].size)
        arrays = [np.concatenate([[x[:split].sum()], x[split:]]) for x in arrays]
    return tuple(arrays)


def goodness_of_fit(counts: Sequence[int], probs: Sequence, min_expected: float = 5.0) -> GofResult:
    """Return Pearson's chi-square test of observed ``counts`` against the distribution ``probs``.

    Cells whose expected count is below ``min_expected`` are pooled into one cell (and the pool takes in
    the next smallest cells until it reaches ``min_expected`` itself), so the chi-square
    approximation holds. A sample on an outcome of probability 0 is impossible under ``probs``: the
    p-value is then 0.
    """
    observed = np.asarray(counts, dtype=np.float64).ravel()
    expected_probs = _as_probs(probs, observed.size)
    if np.any(observed < 0):
        raise ValueError("counts must be non-negative")
    n = int(observed.sum())
    if n == 0:
        raise ValueError("no samples: counts sum to 0")
    impossible = int(observed[expected_probs == 0].sum())
    if impossible:
        return GofResult(math.inf, 0, 0.0, n, 0, impossible)
    keep = expected_probs > 0
    expected, observed = _pool(expected_probs[keep] * n, observed[keep], min_expected=min_expected)
    cells = expected.size
    if cells < 2:
        return GofResult(0.0, 0, 1.0, n, cells, 0)  # one cell: nothing can deviate
    statistic = float(((observed - expected) ** 2 / expected).sum())
    dof = cells - 1
    return GofResult(statistic, dof, float(sps.chi2.sf(statistic, dof)), n, cells, 0)


def tv_estimate(counts: Sequence[int], probs: Sequence, confidence: float = 0.999) -> tuple[float, float]:
    """Return (estimated TV, upper confidence bound) between the sampled law and ``probs``.

    The estimate is TV(empirical, probs). The bound adds the L1 concentration of an empirical
    distribution over V outcomes (Weissman et al., 2003): P(||f - true||_1 >= eps) <= 2^V exp(-n eps^2/2),
    so with probability ``confidence`` the true TV is at most estimate + sqrt((V ln 2 + ln(1/delta)) / (2n)).
    The bound is conservative for large V.
    """
    observed = np.asarray(counts, dtype=np.float64).ravel()
    expected = _as_probs(probs, observed.size)
    n = observed.sum()
    if n <= 0:
        raise ValueError("no samples: counts sum to 0")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    estimate = 0.5 * float(np.abs(observed / n - expected).sum())
    slack = math.sqrt((observed.size * math.log(2) + math.log(1 / (1 - confidence))) / (2 * n))
    return estimate, estimate + slack


def samples_needed(
    null_probs: Sequence,
    alternative: Optional[Sequence] = None,
    tv: Optional[float] = None,
    false_alarm: float = FALSE_ALARM_RATE,
    power: float = 0.99,
) -> int:
    """Return how many samples the chi-square test needs to reject ``null_probs`` with the given power.

    Give either the ``alternative`` distribution the sampler really has, or only a ``tv`` distance: then
    the answer holds for *every* alternative at that distance, since sum (a - p)^2 / p >= (2 TV)^2 by
    Cauchy-Schwarz. Uses the noncentral chi-square approximation (noncentrality n * sum (a - p)^2 / p);
    samples on outcomes impossible under the null are counted separately, since one suffices to reject.
    """
    null = np.array([float(v) for v in null_probs], dtype=np.float64)
    if not 0 < false_alarm < 1 or not 0 < power < 1:
        raise ValueError("false_alarm and power must be in (0, 1)")
    support = null > 0
    dof = max(int(support.sum()) - 1, 1)
    if alternative is not None:
        alt = _as_probs(alternative, null.size)
        per_sample = float(((alt[support] - null[support]) ** 2 / null[support]).sum())
        impossible_mass = float(alt[~support].sum())
    elif tv is not None:
        if not 0 < tv <= 1:
            raise ValueError(f"tv must be in (0, 1], got {tv}")
        per_sample, impossible_mass = 4 * tv * tv, 0.0
    else:
        raise ValueError("give the alternative distribution or a tv distance")
    candidates = []
    if impossible_mass > 0:
        candidates.append(math.ceil(math.log(1 - power) / math.log1p(-impossible_mass)) if impossible_mass < 1 else 1)
    if per_sample > 0:
        candidates.append(math.ceil(_noncentrality_needed(dof, false_alarm, power) / per_sample))
    if not candidates:
        raise ValueError("the alternative equals the null: no sample size detects a zero difference")
    return max(min(candidates), 1)


def _noncentrality_needed(dof: int, false_alarm: float, power: float) -> float:
    """The noncentrality at which the chi-square test with ``dof`` degrees of freedom, rejecting at
    ``false_alarm``, rejects with probability ``power``."""
    critical = sps.chi2.isf(false_alarm, dof)

    def shortfall(noncentrality: float) -> float:
        return sps.ncx2.sf(critical, dof, noncentrality) - power

    upper = 1.0
    while shortfall(upper) < 0:
        upper *= 2
    return optimize.brentq(shortfall, 0.0, upper, xtol=1e-6)


def detectable_tv(
    n_samples: int, null_probs: Sequence, false_alarm: float = FALSE_ALARM_RATE, power: float = 0.99
) -> float:
    """Return the smallest TV distance that ``n_samples`` samples detect with the given power, whatever
    the alternative (the inverse of :func:`samples_needed` with ``tv``).

    In closed form: with ``tv`` alone, :func:`samples_needed` is ceil(lambda / (2 tv)^2), where lambda is
    the noncentrality the power needs, so the smallest tv it allows is sqrt(lambda / (4 n)) (capped at 1;
    a hair above, so that float rounding never leaves ``samples_needed`` one above ``n_samples``).
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if not 0 < false_alarm < 1 or not 0 < power < 1:
        raise ValueError("false_alarm and power must be in (0, 1)")
    null = np.array([float(v) for v in null_probs], dtype=np.float64)
    dof = max(int((null > 0).sum()) - 1, 1)
    noncentrality = _noncentrality_needed(dof, false_alarm, power)
    return min(1.0, math.sqrt(noncentrality / (4 * n_samples)) * (1 + 1e-12))


def pooled(probs: Sequence, n: int, min_expected: float = 5.0) -> list[float]:
    """Return ``probs`` pooled as :func:`goodness_of_fit` pools them at ``n`` samples (zero cells dropped).

    Power statements about a pooled test use this; a TV distance on pooled cells is at most the TV on the
    original cells, so a bound stated on pooled cells is conservative."""
    probs = np.array([float(v) for v in probs if float(v) > 0])
    (expected,) = _pool(probs * n, min_expected=min_expected)
    return (expected / n).tolist()


def pooled_cells(counts: Sequence[int], probs: Sequence, *others: Sequence,
                 min_expected: float = 5.0) -> tuple[np.ndarray, ...]:
    """Return the cells :func:`goodness_of_fit` tests, for a plot: (expected counts under ``probs``, observed
    counts, expected counts under each law in ``others``), pooled alike and ordered as the test orders them
    (the pool of sparse cells first). Cells where ``probs`` is 0 are dropped, as the test drops them."""
    observed = np.asarray(counts, dtype=np.float64).ravel()
    expected_probs = _as_probs(probs, observed.size)
    n = observed.sum()
    keep = expected_probs > 0
    laws = [_as_probs(law, observed.size)[keep] * n for law in others]
    return _pool(expected_probs[keep] * n, observed[keep], *laws, min_expected=min_expected)


def two_sample_test(counts_a: Sequence[int], counts_b: Sequence[int], min_expected: float = 5.0) -> GofResult:
    """Return the chi-square test that two samples come from one distribution (a 2 x K homogeneity test).

    Cells are pooled, smallest first, until every remaining cell expects at least ``min_expected`` in
    both samples under the pooled proportions; cells empty in both samples are dropped.
    """
    a = np.asarray(counts_a, dtype=np.float64).ravel()
    b = np.asarray(counts_b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"the two count vectors differ in length: {a.size} and {b.size}")
    if np.any(a < 0) or np.any(b < 0):
        raise ValueError("counts must be non-negative")
    n_a, n_b = a.sum(), b.sum()
    if n_a == 0 or n_b == 0:
        raise ValueError("both samples need at least one observation")
    keep = (a + b) > 0
    a, b = a[keep], b[keep]
    share = (a + b) / (n_a + n_b)
    smaller = min(n_a, n_b)
    # pool by the smaller sample's expected counts, so both expectations reach min_expected
    pooled_expected, a, b = _pool(share * smaller, a, b, min_expected=min_expected)
    pooled_share = pooled_expected / smaller
    cells = pooled_share.size
    if cells < 2:
        return GofResult(0.0, 0, 1.0, int(n_a + n_b), cells, 0)
    test = sps.chi2_contingency(np.vstack([a, b]), correction=False)  # Pearson's homogeneity test, 2 x cells
    return GofResult(float(test.statistic), int(test.dof), float(test.pvalue), int(n_a + n_b), cells, 0)


def power(n: int, null_probs: Sequence, alternative: Sequence, false_alarm: float = FALSE_ALARM_RATE) -> float:
    """Return the probability that :func:`goodness_of_fit` with ``n`` samples rejects ``null_probs`` when the
    samples really follow ``alternative`` (cells pooled as the test pools them; noncentral chi-square
    approximation, plus the chance of at least one sample on an outcome the null rules out)."""
    null = np.array(null_probs, dtype=np.float64)
    alt = _as_probs(alternative, null.size)
    support = null > 0
    impossible = float(alt[~support].sum())
    expected, shifted = _pool(null[support] * n, alt[support] * n)
    cells = expected.size
    chi_power = 0.0
    if cells >= 2:
        noncentrality = float(((shifted - expected) ** 2 / expected).sum())
        chi_power = float(sps.ncx2.sf(sps.chi2.isf(false_alarm, cells - 1), cells - 1, noncentrality))
    return 1 - (1 - chi_power) * (1 - impossible) ** n


def detectable_difference(rate: float, n: int, level: float = 0.05, power: float = 0.8) -> float:
    """Return the gap between two success rates near ``rate``, ``n`` trials each, that a two-sided
    two-proportion test at ``level`` detects with probability ``power`` (normal approximation)."""
    if not 0 < rate < 1 or n < 1:
        raise ValueError(f"need 0 < rate < 1 and n >= 1, got rate {rate} and n {n}")
    z = sps.norm.ppf(1 - level / 2) + sps.norm.ppf(power)
    return float(z * np.sqrt(2 * rate * (1 - rate) / n))


def measured_acceptance_rate(accepted: Sequence, gamma) -> float:
    """Return alpha as measured in decoding: accepted drafts / drafts that were tested.

    ``accepted`` holds per-block accepted counts (arrays or tensors of any shape; -1 marks a row that was
    not decoding). A block tests its drafts in order and stops at the first rejection, so it tests a + 1
    drafts when it accepts a < gamma of them and gamma when it accepts all; the drafts after a rejection
    were never tested and do not count. This is the maximum-likelihood estimate of a per-draft acceptance
    probability (the i.i.d. model of notebooks/07_cost_model). NaN when nothing was tested. ``gamma`` is
    the drafts per block, or (a draft-length policy) a sequence shaped like ``accepted`` of each row's own.
    """
    if not len(accepted):
        return float("nan")
    counts = np.concatenate([np.asarray(a, dtype=np.int64).reshape(-1) for a in accepted])
    if isinstance(gamma, (int, np.integer)):
        gamma = np.full_like(counts, gamma)
    else:
        gamma = np.concatenate([np.asarray(g, dtype=np.int64).reshape(-1) for g in gamma])
    keep = counts >= 0
    counts, gamma = counts[keep], gamma[keep]
    tested = counts + (counts < gamma)
    return float(counts.sum()) / float(tested.sum()) if tested.sum() else float("nan")


def power_from_sample(n: int, null_probs: Sequence, alternative_counts: Sequence[int],
                      false_alarm: float = FALSE_ALARM_RATE) -> float:
    """Return :func:`power` at ``n`` samples for an alternative known only from a sample of it
    (``alternative_counts``, on the null's cells; the last cells may be ones the null rules out).

    The plug-in noncentrality n * sum (a_hat - p)^2 / p is biased upward by sampling noise, by about
    n * sum a (1 - a) / (p m) for a sample of m; each term here subtracts its unbiased estimate,
    a_hat (1 - a_hat) / (m - 1), so the noncentrality is unbiased (floored at 0). Cells are pooled as
    the test pools them at ``n``."""
    null = np.array([float(v) for v in null_probs], dtype=np.float64)
    counts = np.asarray(alternative_counts, dtype=np.float64)
    if counts.shape != null.shape:
        raise ValueError(f"alternative_counts has {counts.size} cells, the null {null.size}")
    m = counts.sum()
    if m < 2:
        raise ValueError("the alternative's sample needs at least two observations")
    support = null > 0
    impossible = float(counts[~support].sum() / m)
    expected, shifted = _pool(null[support] * n, counts[support] * (n / m))
    cells = expected.size
    chi_power = 0.0
    if cells >= 2:
        share_null, share_alt = expected / n, shifted / n
        noise = share_alt * (1 - share_alt) / (m - 1)
        noncentrality = max(0.0, float(n * (((share_alt - share_null) ** 2 - noise) / share_null).sum()))
        chi_power = float(sps.ncx2.sf(sps.chi2.isf(false_alarm, cells - 1), cells - 1, noncentrality))
    return 1 - (1 - chi_power) * (1 - impossible) ** n
