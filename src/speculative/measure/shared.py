"""Shared: the pure helpers every analysis module uses, and the benchmarks too: bootstrap intervals, ratios of
totals, the side of 1 an interval lies on, checksums of prompts and tokens, and an output's repeat share.

Intervals are 95% percentile bootstraps with 2,000 resamples, paired over prompts (or groups of prompts),
seeded by the record's seed, so re-analysis gives the same numbers. Nothing here times, draws or touches a model.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Sequence

import numpy as np

__all__ = ["bootstrap_interval", "ratio_interval", "speed_ratio", "per_total", "interval_side", "mean_interval",
           "prompts_hash", "tokens_hash", "repeat_share"]


# ---------------------------------------------------------------- intervals and ratios

def bootstrap_interval(columns: Sequence[Sequence[float]], statistic: Callable, seed: int, *,
                       vectorized: bool = False) -> list[float]:
    """Return a 95% percentile bootstrap interval (2,000 resamples, paired over the columns' entries) of
    ``statistic`` of the ``columns``; [nan, nan] with fewer than two entries. A ``vectorized`` statistic
    takes an ``axis`` argument and reduces every resample at once (scipy draws the same resamples)."""
    from scipy.stats import bootstrap

    if len(columns[0]) < 2:
        return [float("nan"), float("nan")]
    result = bootstrap(tuple(columns), statistic, paired=True, vectorized=vectorized, n_resamples=2000,
                       confidence_level=0.95, method="percentile", random_state=seed)
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]


def _total(values, axis: int = -1):
    """The sum along ``axis``, added left to right as Python's ``sum`` adds numpy floats, so that a
    vectorized statistic gives the same floats as the one-resample-at-a-time ``sum(a) / sum(b)``."""
    return np.cumsum(values, axis=axis).take(-1, axis=axis)


def _ratio_of_totals(numerators, denominators, axis: int = -1):
    return _total(numerators, axis) / _total(denominators, axis)


def per_total(made: float) -> Callable:
    """The statistic made * n / sum(x) over the n entries of x, vectorized (see :func:`_total`)."""
    return lambda values, axis=-1: made * values.shape[axis] / _total(values, axis)


def ratio_interval(numerators: Sequence[float], denominators: Sequence[float], seed: int) -> list[float]:
    """Return a 95% bootstrap interval, paired over entries, of sum(numerators) / sum(denominators)."""
    return bootstrap_interval([list(numerators), list(denominators)], _ratio_of_totals, seed, vectorized=True)


def speed_ratio(seconds: Sequence[float], baseline_seconds: Sequence[float], seed: int = 0) -> tuple[float, list]:
    """Return how many times as fast a decoder ran as a baseline on the same prompts and tokens (pooled:
    baseline seconds / its seconds) with a 95% bootstrap interval paired over prompts."""
    return sum(baseline_seconds) / sum(seconds), ratio_interval(baseline_seconds, seconds, seed)


def mean_interval(values: Sequence[float], seed: int = 0) -> list[float]:
    """Return a 95% percentile bootstrap interval of the mean of ``values`` (entries resampled)."""
    return bootstrap_interval([list(values)], lambda x, axis=-1: np.mean(x, axis=axis), seed, vectorized=True)


def interval_side(interval: Sequence[float], level: float = 1.0) -> str:
    """Return ``"above"`` or ``"below"`` when a whole interval lies on one side of ``level``, else
    ``"across"`` (an interval of NaNs, from a single prompt, is ``"across"``)."""
    low, high = interval
    if low > level:
        return "above"
    if high < level:
        return "below"
    return "across"


# ---------------------------------------------------------------- checksums and outputs

def prompts_hash(prompts) -> str:
    """Return the sha256 of a prompt set (bytes, or token ids as 4 bytes each), lengths included."""
    digest = hashlib.sha256()
    for prompt in prompts:
        if not isinstance(prompt, bytes):  # token ids (a transformers tokenizer's): 4 bytes each
            prompt = b"".join(int(t).to_bytes(4, "big") for t in prompt)
        digest.update(len(prompt).to_bytes(4, "big") + prompt)
    return digest.hexdigest()


def tokens_hash(tokens: Sequence[int]) -> str:
    """Return a short checksum of emitted tokens: equal outputs, equal checksums."""
    return prompts_hash([list(tokens)])[:16]


def repeat_share(tokens: Sequence[int], context: Sequence[int], n: int = 8) -> float:
    """Return the share of generated positions whose n-gram (the n tokens ending there) already occurred
    earlier in ``context`` + ``tokens``: how much of an output repeats itself or its prompt. Positions
    with fewer than n tokens before them in the whole text end no n-gram and are not counted."""
    text = list(context) + list(tokens)
    seen, repeated, positions = set(), 0, 0
    for end in range(n, len(text) + 1):
        gram = tuple(text[end - n:end])
        if end > len(context):
            positions += 1
            repeated += gram in seen
        seen.add(gram)
    return repeated / positions if positions else float("nan")
