"""Exact enumeration of speculative sampling with ``fractions.Fraction``: no model, no seed, no sampling.

Explained in: notebooks/03_three_tokens (one step, blocks), notebooks/01_lossless (the claim),
notebooks/07_cost_model (draft lengths chosen on the fly) and notebooks/10_beyond_one_draft (block
verification). Several drafts at one position and draft trees are in :mod:`exact.multi_draft`.

A *toy autoregressive model* is any callable that maps a context (a tuple of token ids) to a distribution
over the vocabulary, given as a sequence of Fractions. :class:`RandomTableModel` makes reproducible ones.
The functions below walk every branch of the algorithm (which token is drafted, whether it is accepted,
which token the residual gives) and add up the exact probability of each outcome.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from fractions import Fraction
from typing import Callable, Optional, Sequence

from speculative.exact.rule import normalized_residual, validate_distribution, validate_pair

__all__ = [
    "ToyModel",
    "random_rational_distribution",
    "RandomTableModel",
    "speculative_block_law",
    "speculative_sequence_law",
    "target_sequence_law",
    "law_total_variation",
    "block_verification_law",
    "sequence_law",
    "expected_length",
    "SUN_P",
    "SUN_Q",
    "sun_example_table",
    "adaptive_block_law",
    "adaptive_sequence_law",
    "verify_drafts_law",
    "shared_batch_law",
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
    return sequence_law(lambda here: speculative_block_law(target, draft, here, gamma), context, n_tokens)


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


# --------------------------------------------------------------------------- beyond one draft


def block_verification_law(target: ToyModel, draft: ToyModel, context: tuple, gamma: int,
                           stop_after: Optional[Callable] = None, drafted: bool = False) -> dict[tuple, Fraction]:
    """Return the exact law of one block under *block verification* (Sun et al., ICLR 2025, Algorithm 2).

    The draft proposes x1..x_gamma from q. With p_0 = 1 and p_i = min(1, p_{i-1} * p(x_i) / q(x_i)) (each
    ratio taken at its own position), the residual mass after i accepted drafts is
    m_i = sum_y max(p_i * p(y | x_<=i) - q(y | x_<=i), 0). Position i < gamma is *kept* with probability
    h_i = m_i / (m_i + 1 - p_i) (1 when that is 0 / 0), position gamma with h_gamma = p_gamma; the block
    accepts tau = the largest kept position (0 if none), all decided jointly. The extra token comes from
    p when tau = gamma, else from the normalised weights max(p_tau * p(. | x_<=tau) - q(. | x_<=tau), 0).
    Unlike token-wise verification, a draft that would fail its own test can be kept when a later one is.
    Every draft sequence is enumerated (V^gamma of them), so keep V and gamma small.

    ``stop_after(q)``, if given, stops drafting right after a drafted token whose draft probability is
    ``q`` when it returns True (a confidence stop, as ``policy.ConfidenceStop``), and the block verifies
    the k < gamma drafts it has as a block of k. Token-wise verification allows such a stop; the stop
    keeps the law under block verification too, as the enumeration shows (chapter 07); it is not a
    corollary of Sun et al.'s proof, which is for blocks of a fixed length. ``drafted=True`` keys the law
    by ``(tokens, drafts verified)`` instead of the tokens alone.
    """
    _check_gamma(gamma)
    context = tuple(context)
    law: dict[tuple, Fraction] = defaultdict(Fraction)

    def finish(drafts: tuple, prob: Fraction) -> None:
        # len(drafts) is shorter than asked for when a stop ended the drafting
        for key, chance in verify_drafts_law(target, draft, context, drafts, "block").items():
            law[(key, len(drafts)) if drafted else key] += prob * chance

    def draw(drafts: tuple, prob: Fraction) -> None:
        if len(drafts) == gamma:
            finish(drafts, prob)
            return
        for token, q in enumerate(validate_distribution(draft(context + drafts), "draft")):
            if q:
                if stop_after is not None and len(drafts) + 1 < gamma and stop_after(q):
                    finish(drafts + (token,), prob * q)
                else:
                    draw(drafts + (token,), prob * q)

    draw((), Fraction(1))
    return dict(law)


def verify_drafts_law(target: ToyModel, draft: ToyModel, context: tuple, drafts: tuple,
                      rule: str = "token") -> dict[tuple, Fraction]:
    """Return the exact law of the tokens emitted when the given ``drafts`` (drawn from ``draft`` after
    ``context``) are verified by ``rule``: ``"token"`` (token-wise: the first rejection ends the block with
    a token from the residual, full acceptance with a bonus token from p) or ``"block"`` (block
    verification, see :func:`block_verification_law`). Each key is the accepted drafts plus one token."""
    context, drafts = tuple(context), tuple(drafts)
    gamma = len(drafts)
    targets = [validate_distribution(target(context + drafts[:i]), "target") for i in range(gamma + 1)]
    drafts_q = [validate_distribution(draft(context + drafts[:i]), "draft") for i in range(gamma)]
    law: dict[tuple, Fraction] = defaultdict(Fraction)
    if rule == "token":
        prob = Fraction(1)
        for i, token in enumerate(drafts):
            accept = min(Fraction(1), targets[i][token] / drafts_q[i][token])
            if accept < 1:
                for y, r_y in enumerate(normalized_residual(targets[i], drafts_q[i])):
                    if r_y:
                        law[drafts[:i] + (y,)] += prob * (1 - accept) * r_y
            prob *= accept
            if prob == 0:
                return dict(law)
        for y, p_y in enumerate(targets[gamma]):
            if p_y:
                law[drafts + (y,)] += prob * p_y
        return dict(law)
    if rule != "block":
        raise ValueError(f"unknown verification rule {rule!r}; known: token, block")
    ratio = [Fraction(1)]
    for i, token in enumerate(drafts):
        ratio.append(min(Fraction(1), ratio[-1] * targets[i][token] / drafts_q[i][token]))
    weights = [[max(ratio[i] * pt - qt, 0) for pt, qt in zip(targets[i], drafts_q[i])] for i in range(gamma)]
    keep = [Fraction(1)]  # keep[0] is unused: tau = 0 is what is left when no position is kept
    for i in range(1, gamma):
        mass = sum(weights[i])
        denominator = mass + 1 - ratio[i]
        keep.append(Fraction(1) if denominator == 0 else mass / denominator)
    keep.append(ratio[gamma])
    none_later = Fraction(1)  # P(no position after tau is kept)
    for tau in range(gamma, -1, -1):
        chance = none_later * (keep[tau] if tau else 1)
        if tau:
            none_later *= 1 - keep[tau]
        if chance == 0:
            continue
        final = targets[gamma] if tau == gamma else weights[tau]
        mass = sum(final)
        final = targets[tau] if mass == 0 else [w / mass for w in final]  # mass 0 only at chance 0
        for token, f in enumerate(final):
            if f:
                law[drafts[:tau] + (token,)] += chance * f
    return dict(law)


def shared_batch_law(target: ToyModel, draft: ToyModel, context: tuple, n_tokens: int, policy,
                     rows: int = 2, rule: str = "token") -> dict[tuple, Fraction]:
    """Return the exact joint law of the first ``n_tokens`` tokens of ``rows`` rows decoded as one batch
    whose rows *share* each block, as ``decode.speculative_decode`` does by default with a draft-length
    policy: the block's length is ``policy.batch_length`` of the decoding rows' states, every decoding row
    drafts (each from its own context), drafting stops early once every row's ``stop_after`` has fired,
    and every row verifies every draft by ``rule`` (:func:`verify_drafts_law`); each row's state is then
    updated with its own outcome. Rows that have their ``n_tokens`` stop. Keys are tuples of ``rows``
    outputs. The rows keep the target's law, jointly, when this equals the product of
    :func:`target_sequence_law` with itself ``rows`` times. Exponential in everything: keep it tiny."""
    if n_tokens < 1 or rows < 1:
        raise ValueError(f"need n_tokens >= 1 and rows >= 1, got {n_tokens} and {rows}")
    context = tuple(context)
    law: dict[tuple, Fraction] = defaultdict(Fraction)

    def run(outputs: tuple, states: tuple, prob: Fraction) -> None:
        decoding = [i for i, out in enumerate(outputs) if len(out) < n_tokens]
        if not decoding:
            law[tuple(out[:n_tokens] for out in outputs)] += prob
            return
        gamma = policy.batch_length([states[i] for i in decoding])
        _check_gamma(gamma)

        def extend(drafted: list, stopped: list, prob: Fraction) -> None:
            if len(drafted[0]) == gamma or all(stopped):
                verify(drafted, prob)
                return
            qs = [validate_distribution(draft(context + outputs[i] + d), "draft") for i, d in zip(decoding, drafted)]
            for tokens in itertools.product(*(range(len(q)) for q in qs)):
                chance = prob
                for q, token in zip(qs, tokens):
                    chance *= q[token]
                if chance:
                    extend([d + (t,) for d, t in zip(drafted, tokens)],
                           [s or bool(policy.stop_after(q[t])) for s, q, t in zip(stopped, qs, tokens)], chance)

        def verify(drafted: list, prob: Fraction) -> None:
            laws = [list(verify_drafts_law(target, draft, context + outputs[i], d, rule).items())
                    for i, d in zip(decoding, drafted)]
            for outcome in itertools.product(*laws):
                chance, new_outputs, new_states = prob, list(outputs), list(states)
                for i, d, (tokens, p) in zip(decoding, drafted, outcome):
                    chance *= p
                    new_outputs[i] = outputs[i] + tokens
                    new_states[i] = policy.update(states[i], len(tokens) - 1, len(tokens) - 1 == len(d))
                run(tuple(new_outputs), tuple(new_states), chance)

        extend([() for _ in decoding], [False for _ in decoding], prob)

    run(((),) * rows, (policy.start(),) * rows, Fraction(1))
    return dict(law)


def sequence_law(block: Callable[[tuple], dict], context: tuple, n_tokens: int) -> dict[tuple, Fraction]:
    """Return the exact law of the first ``n_tokens`` tokens emitted by repeating any block rule.

    ``block(context)`` returns the law of one block's emitted tokens after ``context`` (for example
    ``lambda c: block_verification_law(p, q, c, 3)``). A rule keeps the target's law exactly when this
    equals :func:`target_sequence_law` for every ``n_tokens``.
    """
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    context = tuple(context)
    law: dict[tuple, Fraction] = defaultdict(Fraction)

    def run(emitted: tuple, prob: Fraction) -> None:
        if len(emitted) >= n_tokens:
            law[emitted[:n_tokens]] += prob
            return
        for tokens, block_prob in block(context + emitted).items():
            run(emitted + tokens, prob * block_prob)

    run((), Fraction(1))
    return dict(law)


def expected_length(law: dict) -> Fraction:
    """Return the expected number of tokens one block emits (tokens per target call), exactly."""
    return sum((prob * len(tokens) for tokens, prob in law.items()), Fraction(0))


#: Sun et al.'s binary example: context-free target and draft over two tokens.
SUN_P = (Fraction(1, 3), Fraction(2, 3))
SUN_Q = (Fraction(2, 3), Fraction(1, 3))


def sun_example_table(gammas: Sequence[int] = (2, 3, 4), p: Sequence = SUN_P, q: Sequence = SUN_Q) -> list[dict]:
    """Return, per gamma, the exact expected accepted drafts per block under token-wise and block
    verification for the context-free pair (p, q) (by default Sun et al.'s example)."""
    target, draft = (lambda context: list(p)), (lambda context: list(q))
    rows = []
    for gamma in gammas:
        token = expected_length(speculative_block_law(target, draft, (), gamma)) - 1
        block = expected_length(block_verification_law(target, draft, (), gamma)) - 1
        rows.append({"gamma": gamma, "p": tuple(p), "q": tuple(q), "token": token, "block": block})
    return rows


def adaptive_block_law(target: ToyModel, draft: ToyModel, context: tuple, policy, state=None) -> dict[tuple, Fraction]:
    """Return the exact law of one token-wise block whose length a draft-length ``policy`` chooses
    (``policy.DraftPolicy``), as a map ``(emitted tokens, the policy's next state) -> probability``.

    The block drafts ``policy.length(state)`` tokens, stopping early right after a token ``x`` when
    ``policy.stop_after(q(x))``; it verifies them token-wise and ends with the residual at the first
    rejection or the bonus token from p. As in :func:`speculative_block_law`, drafts past the first
    rejection are summed out (drafting them lazily gives the same law), which holds because nothing the
    policy decides for them reaches the emitted tokens or its next state: ``update`` sees only the count
    accepted and whether the block was fully accepted. ``state`` defaults to ``policy.start()``.

    A policy with a ``verifies(p_x, q_x)`` method peeks at the target: a drafted x for which it returns
    False is not verified, and the block ends there with a token from p (``pitfalls`` entry
    "peek_target_length"; it breaks the law). Lawful policies have no such method.
    """
    context = tuple(context)
    state = policy.start() if state is None else state
    gamma = policy.length(state)
    _check_gamma(gamma)
    peek = getattr(policy, "verifies", None)
    law: dict[tuple, Fraction] = defaultdict(Fraction)

    def finish(tokens: tuple, prob: Fraction, accepted: int, full: bool) -> None:
        law[(tokens, policy.update(state, accepted, full))] += prob

    def extend(prefix: tuple, prob: Fraction, stopped: bool) -> None:
        here = context + prefix
        target_probs = validate_distribution(target(here), f"target{here}")
        if len(prefix) == gamma or stopped:  # drafting is over and every draft was accepted: the bonus token
            for token, p in enumerate(target_probs):
                if p:
                    finish(prefix + (token,), prob * p, len(prefix), True)
            return
        target_probs, draft_probs = validate_pair(target_probs, draft(here))
        r = normalized_residual(target_probs, draft_probs)
        for token, q in enumerate(draft_probs):
            if q == 0:
                continue
            if peek is not None and not peek(target_probs[token], q):  # not verified: the block ends, from p
                for y, p in enumerate(target_probs):
                    if p:
                        finish(prefix + (y,), prob * q * p, len(prefix), True)
                continue
            accept = min(1, target_probs[token] / q)
            if accept > 0:
                extend(prefix + (token,), prob * q * accept, bool(policy.stop_after(q)))
            if accept < 1:
                for y, r_y in enumerate(r):
                    if r_y:
                        finish(prefix + (y,), prob * q * (1 - accept) * r_y, len(prefix), False)

    extend((), Fraction(1), False)
    return dict(law)


def adaptive_sequence_law(target: ToyModel, draft: ToyModel, context: tuple, n_tokens: int,
                          policy, rule: str = "token") -> dict[tuple, Fraction]:
    """Return the exact law of the first ``n_tokens`` tokens emitted by repeated blocks whose lengths
    ``policy`` chooses, its state carried from block to block (:func:`adaptive_block_law`). The policy
    keeps the target's law exactly when this equals :func:`target_sequence_law`.

    ``rule="block"`` verifies each block by block verification (:func:`block_verification_law`) at the
    length the policy chose; the policy is then told the block's accepted drafts (its emitted tokens
    less one) and whether all were accepted. A policy that stops drafting on the draft's confidence stops
    the chain here too (:func:`block_verification_law`'s ``stop_after``); one that peeks at the target is
    refused."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    if rule not in ("token", "block"):
        raise ValueError(f"unknown verification rule {rule!r}; known: token, block")
    if rule == "block" and hasattr(policy, "verifies"):
        raise ValueError(f"the policy {policy.describe()} peeks at the target; this enumeration runs such a policy "
                         "with the token-wise rule only")
    context = tuple(context)
    law: dict[tuple, Fraction] = defaultdict(Fraction)
    blocks: dict[tuple, dict] = {}

    def run(emitted: tuple, prob: Fraction, state) -> None:
        if len(emitted) >= n_tokens:
            law[emitted[:n_tokens]] += prob
            return
        key = (emitted, state)
        if key not in blocks:
            blocks[key] = (adaptive_block_law(target, draft, context + emitted, policy, state) if rule == "token"
                           else _adaptive_verification_block(target, draft, context + emitted, policy, state))
        for (tokens, next_state), block_prob in blocks[key].items():
            run(emitted + tokens, prob * block_prob, next_state)

    run((), Fraction(1), policy.start())
    return dict(law)


def _adaptive_verification_block(target: ToyModel, draft: ToyModel, context: tuple, policy, state) -> dict:
    """One block verification block at the length ``policy`` chose in ``state``: (tokens, next state) -> prob."""
    gamma = policy.length(state)
    _check_gamma(gamma)
    law: dict[tuple, Fraction] = defaultdict(Fraction)
    for (tokens, drafts), prob in block_verification_law(target, draft, context, gamma, policy.stop_after,
                                                         drafted=True).items():
        accepted = len(tokens) - 1
        law[(tokens, policy.update(state, accepted, accepted == drafts))] += prob
    return dict(law)
