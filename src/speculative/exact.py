"""Exact enumeration of speculative sampling with ``fractions.Fraction``: no model, no seed, no sampling.

Explained in: notebooks/03_three_tokens (one step, blocks) and notebooks/01_lossless (the claim).

A *toy autoregressive model* is any callable that maps a context (a tuple of token ids) to a distribution
over the vocabulary, given as a sequence of Fractions. :class:`RandomTableModel` makes reproducible ones.
The functions below walk every branch of the algorithm (which token is drafted, whether it is accepted,
which token the residual gives) and add up the exact probability of each outcome.
"""

from __future__ import annotations

import random
from collections import defaultdict
from fractions import Fraction
from typing import Callable, Sequence

from .rule import normalized_residual, validate_distribution, validate_pair

__all__ = [
    "ToyModel",
    "random_rational_distribution",
    "RandomTableModel",
    "one_step_law",
    "speculative_block_law",
    "speculative_sequence_law",
    "target_sequence_law",
    "law_total_variation",
]

ToyModel = Callable[[tuple], Sequence[Fraction]]


def random_rational_distribution(
    vocab_size: int, rng: random.Random, max_weight: int = 20, zero_chance: float = 0.2
) -> list[Fraction]:
    """Return a random exact distribution: integer weights in [0, max_weight], normalised to Fractions.

    Each weight is 0 with probability ``zero_chance``, so zeros in p or q are common; at least one weight
    is positive.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    weights = [0 if rng.random() < zero_chance else rng.randint(1, max_weight) for _ in range(vocab_size)]
    if not any(weights):
        weights[rng.randrange(vocab_size)] = rng.randint(1, max_weight)
    total = sum(weights)
    return [Fraction(w, total) for w in weights]


class RandomTableModel:
    """A toy autoregressive model: a reproducible random exact distribution for every context.

    The distribution for a context depends only on ``(seed, context)``, so two instances with the same
    arguments are the same model, and tables are built lazily, only for contexts that are visited.
    """

    def __init__(self, vocab_size: int, seed: int, max_weight: int = 12, zero_chance: float = 0.2):
        self.vocab_size = vocab_size
        self.seed = seed
        self.max_weight = max_weight
        self.zero_chance = zero_chance
        self._table: dict[tuple, list[Fraction]] = {}

    def __call__(self, context: tuple) -> list[Fraction]:
        context = tuple(context)
        if context not in self._table:
            rng = random.Random(f"{self.seed}|{context}")  # str seeds are hashed deterministically
            self._table[context] = random_rational_distribution(
                self.vocab_size, rng, self.max_weight, self.zero_chance
            )
        return self._table[context]


def one_step_law(target_probs: Sequence, draft_probs: Sequence) -> dict[str, object]:
    """Return the exact law of one speculative step, branch by branch.

    The result has ``output`` (P(emitted = x) per token), ``accepted`` (P(x drafted and accepted)),
    ``rejected`` (P(a rejection)) and ``residual`` (the normalised residual r). It walks the algorithm's
    event tree: draft x with probability q(x), accept with min(1, p(x)/q(x)), else draw from r.
    """
    target, draft = validate_pair(target_probs, draft_probs)
    accepted = [0 * p for p in target]
    rejected = 0 * target[0]
    for token, q in enumerate(draft):
        if q == 0:
            continue  # never drafted
        accept = min(1, target[token] / q)
        accepted[token] += q * accept
        rejected += q * (1 - accept)
    r = normalized_residual(target, draft)
    output = list(accepted) if rejected == 0 else [a + rejected * ri for a, ri in zip(accepted, r)]
    return {"output": output, "accepted": accepted, "rejected": rejected, "residual": r}


def _check_gamma(gamma: int) -> None:
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per block) must be an integer >= 1, got {gamma!r}")


def speculative_block_law(target: ToyModel, draft: ToyModel, context: tuple, gamma: int) -> dict[tuple, Fraction]:
    """Return the exact law of the tokens emitted by one block of ``gamma`` drafts after ``context``.

    A block drafts x1..x_gamma from q, verifies them in order, and emits the accepted prefix plus one more
    token: from the normalised residual at the first rejection, or the bonus token from p when all are
    accepted. Drafts after the first rejection are thrown away, so their probabilities sum out: drafting
    them lazily, as here, gives the same law as drafting all ``gamma`` first.
    """
    _check_gamma(gamma)
    context = tuple(context)
    law: dict[tuple, Fraction] = defaultdict(Fraction)

    def extend(accepted_prefix: tuple, prob: Fraction) -> None:
        here = context + accepted_prefix
        target_probs = validate_distribution(target(here), f"target{here}")
        if len(accepted_prefix) == gamma:  # every draft accepted: the bonus token comes from p
            for token, p in enumerate(target_probs):
                if p:
                    law[accepted_prefix + (token,)] += prob * p
            return
        target_probs, draft_probs = validate_pair(target_probs, draft(here))
        r = normalized_residual(target_probs, draft_probs)
        for token, q in enumerate(draft_probs):
            if q == 0:
                continue
            accept = min(1, target_probs[token] / q)
            if accept > 0:
                extend(accepted_prefix + (token,), prob * q * accept)
            if accept < 1:
                for correction, r_y in enumerate(r):
                    if r_y:
                        law[accepted_prefix + (correction,)] += prob * q * (1 - accept) * r_y

    extend((), Fraction(1))
    return dict(law)


def speculative_sequence_law(
    target: ToyModel, draft: ToyModel, context: tuple, gamma: int, n_tokens: int
) -> dict[tuple, Fraction]:
    """Return the exact law of the first ``n_tokens`` tokens emitted by repeated blocks of ``gamma`` drafts.

    Blocks run one after another, each starting from everything emitted so far, until at least
    ``n_tokens`` tokens exist; the stream is then cut at ``n_tokens``.
    """
    _check_gamma(gamma)
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    context = tuple(context)
    law: dict[tuple, Fraction] = defaultdict(Fraction)

    def run(emitted: tuple, prob: Fraction) -> None:
        if len(emitted) >= n_tokens:
            law[emitted[:n_tokens]] += prob
            return
        for block, block_prob in speculative_block_law(target, draft, context + emitted, gamma).items():
            run(emitted + block, prob * block_prob)

    run((), Fraction(1))
    return dict(law)


def target_sequence_law(target: ToyModel, context: tuple, n_tokens: int) -> dict[tuple, Fraction]:
    """Return the exact law of ``n_tokens`` tokens sampled one by one from the target alone."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    context = tuple(context)
    law: dict[tuple, Fraction] = {}

    def run(emitted: tuple, prob: Fraction) -> None:
        if len(emitted) == n_tokens:
            law[emitted] = prob
            return
        for token, p in enumerate(validate_distribution(target(context + emitted), "target")):
            if p:
                run(emitted + (token,), prob * p)

    run((), Fraction(1))
    return law


def law_total_variation(first: dict, second: dict) -> Fraction:
    """Return the total variation distance between two laws given as {outcome: probability} dicts."""
    outcomes = set(first) | set(second)
    return sum((abs(first.get(o, 0) - second.get(o, 0)) for o in outcomes), Fraction(0)) / 2
