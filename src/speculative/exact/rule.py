"""The speculative sampling rule on one context, for any number type.

Explained in: notebooks/02_derivation (the algebra) and notebooks/03_three_tokens (a worked example).

Notation: ``target_probs`` is p, the distribution the target model samples from; ``draft_probs`` is q, the
draft's. A token x drafted from q is accepted with probability min(1, p(x)/q(x)); after a rejection the
output is drawn from the normalised residual r = max(p - q, 0) / sum(max(p - q, 0)).

Every function works on ``fractions.Fraction`` (exact), ``int``, ``float`` and numpy scalars, and returns a
plain ``list``. Exact inputs give exact outputs: no function here ever turns a Fraction into a float.
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Integral, Rational, Real
from typing import Sequence

__all__ = [
    "FLOAT_SUM_TOLERANCE",
    "validate_distribution",
    "validate_pair",
    "acceptance_probability",
    "accepted_mass",
    "residual",
    "rejection_mass",
    "normalized_residual",
    "output_distribution",
    "acceptance_rate",
    "total_variation",
]

#: Largest |sum - 1| accepted for a float distribution. Exact inputs (Fraction, int) must sum to exactly 1.
FLOAT_SUM_TOLERANCE = 1e-6


def _is_exact(value) -> bool:
    # bool is an int subclass; a probability given as True/False is almost surely a bug upstream.
    return isinstance(value, Rational) and not isinstance(value, bool)


def validate_distribution(probs: Sequence, name: str = "probs") -> list:
    """Return ``probs`` as a list after checking it is a probability distribution.

    Raises ``ValueError`` naming the problem: an empty vocabulary, a non-numeric entry, NaN or inf, a
    negative entry, or a sum that is not 1 (exactly for Fraction/int entries, within
    :data:`FLOAT_SUM_TOLERANCE` when any entry is a float).
    """
    if isinstance(probs, (str, bytes)):
        raise ValueError(f"{name} must be a sequence of probabilities, got {type(probs).__name__}")
    try:
        values = list(probs)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of probabilities, got {type(probs).__name__}") from None
    if not values:
        raise ValueError(f"{name} is empty: a distribution needs a vocabulary of at least one token")
    converted = []
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, Real):
            # numpy scalars register as Real; anything else (None, str, arrays) is rejected here.
            raise ValueError(f"{name}[{index}] = {value!r} is not a real number")
        if isinstance(value, Integral):
            value = Fraction(int(value))  # so that 1/1 stays exact instead of becoming 1.0
        elif not _is_exact(value):
            value = float(value)
            if math.isnan(value) or math.isinf(value):
                raise ValueError(f"{name}[{index}] is {value}: probabilities must be finite (NaN or inf found)")
        if value < 0:
            raise ValueError(f"{name}[{index}] = {value} is negative: probabilities must be >= 0")
        converted.append(value)
    total = sum(converted)
    if all(_is_exact(v) for v in converted):
        if total != 1:
            raise ValueError(f"{name} sums to {total}, not exactly 1")
    elif abs(total - 1.0) > FLOAT_SUM_TOLERANCE:
        raise ValueError(f"{name} sums to {total!r}, not 1 within the tolerance {FLOAT_SUM_TOLERANCE:g}")
    return converted


def validate_pair(target_probs: Sequence, draft_probs: Sequence) -> tuple[list, list]:
    """Return both distributions as lists after checking each, and that they share one vocabulary."""
    target = validate_distribution(target_probs, "target_probs (p)")
    draft = validate_distribution(draft_probs, "draft_probs (q)")
    if len(target) != len(draft):
        raise ValueError(
            f"vocabulary mismatch: target_probs has {len(target)} entries but draft_probs has "
            f"{len(draft)}; p and q must be over the same vocabulary"
        )
    return target, draft


def acceptance_probability(target_probs: Sequence, draft_probs: Sequence, token: int):
    """Return min(1, p(x) / q(x)), the probability that a drafted ``token`` x is accepted.

    A token the draft gives probability 0 can never be drafted; asking for it raises ``ValueError``.
    """
    target, draft = validate_pair(target_probs, draft_probs)
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < len(target):
        raise ValueError(f"token {token!r} is not an id in a vocabulary of size {len(target)}")
    if draft[token] == 0:
        raise ValueError(
            f"drafted token {token} has draft probability q = 0: the draft cannot propose it, "
            "so its acceptance probability is undefined"
        )
    ratio = target[token] / draft[token]
    return ratio if ratio < 1 else type(ratio)(1)


def accepted_mass(target_probs: Sequence, draft_probs: Sequence) -> list:
    """Return min(p, q) per token: the probability that x is drafted *and* accepted, q(x) min(1, p(x)/q(x))."""
    target, draft = validate_pair(target_probs, draft_probs)
    return [min(p, q) for p, q in zip(target, draft)]


def residual(target_probs: Sequence, draft_probs: Sequence) -> list:
    """Return max(p - q, 0) per token, the unnormalised residual: the mass still owed after acceptance."""
    target, draft = validate_pair(target_probs, draft_probs)
    return [p - q if p > q else 0 * p for p, q in zip(target, draft)]


def rejection_mass(target_probs: Sequence, draft_probs: Sequence):
    """Return 1 - sum(min(p, q)) = sum(max(p - q, 0)), the probability that the drafted token is rejected."""
    return sum(residual(target_probs, draft_probs))


def normalized_residual(target_probs: Sequence, draft_probs: Sequence) -> list:
    """Return r = max(p - q, 0) / sum(max(p - q, 0)), the distribution to sample from after a rejection.

    When the residual has mass 0, p and q agree, a rejection has probability 0 and r is never used. No
    division happens then: the function returns p itself, so a sampler that draws from r anyway still
    emits a valid token of the target (never NaN, never an out-of-range id).
    """
    target, draft = validate_pair(target_probs, draft_probs)
    owed = residual(target, draft)
    mass = sum(owed)
    if mass <= 0:
        return list(target)
    return [value / mass for value in owed]


def output_distribution(target_probs: Sequence, draft_probs: Sequence) -> list:
    """Return P(emitted = x) for one step of speculative sampling: min(p, q) + rejection_mass * r.

    With exact inputs the result is exact, and equals p; the function computes it from the rule's parts
    rather than returning p, so that it can be checked against p.
    """
    target, draft = validate_pair(target_probs, draft_probs)
    accepted = accepted_mass(target, draft)
    mass = rejection_mass(target, draft)
    if mass <= 0:  # the rejection branch is unreachable: add nothing, divide by nothing
        return accepted
    return [a + mass * r for a, r in zip(accepted, normalized_residual(target, draft))]


def acceptance_rate(target_probs: Sequence, draft_probs: Sequence):
    """Return alpha = sum(min(p, q)), the probability that one drafted token is accepted."""
    return sum(accepted_mass(target_probs, draft_probs))


def total_variation(first: Sequence, second: Sequence):
    """Return the total variation distance (1/2) sum |first - second| between two distributions."""
    a, b = validate_pair(first, second)
    return sum(abs(x - y) for x, y in zip(a, b)) / 2


def sample_token(probs: Sequence, uniform) -> int:
    """Return the token that inverse-CDF sampling picks from ``probs`` for a uniform number in [0, 1).

    Tokens with probability 0 are never returned, even when float rounding leaves the cumulative sum a
    little below 1 (the last token with positive probability is returned then).
    """
    values = validate_distribution(probs)
    if not 0 <= uniform < 1:
        raise ValueError(f"uniform must be in [0, 1), got {uniform!r}")
    cumulative = 0 * values[0]
    last_positive = max(i for i, value in enumerate(values) if value > 0)
    for token, value in enumerate(values):
        cumulative += value
        if value > 0 and uniform < cumulative:
            return token
    return last_positive


def speculative_step(target_probs: Sequence, draft_probs: Sequence, rng) -> tuple[int, bool]:
    """Return (emitted token, accepted?) for one step of speculative sampling, drawing uniforms from ``rng``.

    A plain, one-row reference: draft x from q, accept it when u * q(x) < p(x) (that is u < p(x)/q(x),
    written without a division), otherwise emit a token of the normalised residual. ``rng`` is anything
    with a ``random()`` method, such as ``random.Random(seed)``.
    """
    target, draft = validate_pair(target_probs, draft_probs)
    drafted = sample_token(draft, rng.random())
    if rng.random() * draft[drafted] < target[drafted]:
        return drafted, True
    return sample_token(normalized_residual(target, draft), rng.random()), False
