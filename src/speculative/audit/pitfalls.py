"""Wrong implementations of speculative sampling, each beside the right one, exact and sampled.

Explained in: notebooks/05_pitfalls.

Every pitfall comes in two forms that make the same mistake:

- ``exact(p, q, **options)``: the exact law of the emitted token, as Fractions, computed branch by
  branch. The list has V + 1 entries: the last is the probability of emitting an *invalid* token id
  (out of range), which a correct sampler never does.
- ``sample(p, q, n, generator, **options)``: n independent draws from a small torch implementation with
  the same mistake (ids may equal V, the invalid id), used by the sabotage tests to show that the
  statistical test catches it.

Each exact function is written as a small edit of :func:`exact_correct`, and each sampler as an edit of
:func:`sample_correct`, so ``difflib`` shows exactly the lines that differ. :data:`PITFALLS` lists them
with the real systems that shipped the mistake and a pair of distributions on which it bites.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Optional, Sequence

import torch

from speculative.exact.rule import normalized_residual, residual, validate_pair
from speculative.sampling.transforms import SamplingConfig, exact_transform, logits_to_probs

__all__ = ["Pitfall", "PITFALLS", "FIX", "exact_correct", "sample_correct", "extend", "find", "diff_from_correct",
           "typical_acceptance_sampler", "resample_from_target_sampler", "MULTI_DRAFT_PITFALLS",
           "exact_multi_draft", "sample_multi_draft",
           "SEED_P", "SEED_Q"]

SEED_P = (Fraction(1, 2), Fraction(3, 10), Fraction(1, 5))
SEED_Q = (Fraction(1, 5), Fraction(1, 2), Fraction(3, 10))
PRUNE_THRESHOLD = Fraction(1, 4)  # prune a drafted token when q(x) is below this
TYPICAL_EPSILON = Fraction(1, 4)  # "typical acceptance": keep a draft when p(x) is at least this
LENIENCE = 2  # "lenient" acceptance: min(1, LENIENCE * p / q)
PEEK_THRESHOLD = Fraction(1, 4)  # a draft-length rule that verifies a draft only when p(x) is at least this


def extend(probs: Sequence) -> list[Fraction]:
    """Return ``probs`` with one more entry, 0, for the invalid token id (for comparison with pitfall laws)."""
    return [Fraction(v) for v in probs] + [Fraction(0)]


# --------------------------------------------------------------------------- exact laws (Fractions)


def exact_correct(p, q):
    """Return the exact law of the emitted token under the right rule (V + 1 entries, the last 0).

    The law's home is :func:`rule.output_distribution`; this is the same law written out branch by branch,
    as the listing every wrong rule below is a small edit of (:func:`diff_from_correct`). A test holds the
    two equal on many random pairs."""
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    r = normalized_residual(p, q)
    for x, q_x in enumerate(q):  # the draft proposes x with probability q(x)
        if q_x == 0:
            continue
        accept = min(1, p[x] / q_x)  # ratio of the distributions actually sampled from
        out[x] += q_x * accept
        for y, r_y in enumerate(r):  # after a rejection: the normalised residual
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_resample_from_target(p, q):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    r = p  # MISTAKE: after a rejection, draw from p itself
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        accept = min(1, p[x] / q_x)
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_greedy_draft_softmax_ratio(p, q):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    r = normalized_residual(p, q)
    proposed = [Fraction(int(i == q.index(max(q)))) for i in range(len(q))]  # MISTAKE: draft takes argmax
    for x, q_x in enumerate(proposed):
        if q_x == 0:
            continue
        accept = min(1, p[x] / q[x])  # ... but the ratio still uses the softmax q
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_unnormalized_residual(p, q):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    r = residual(p, q)  # MISTAKE: no division by the residual's mass ...
    r[-1] += 1 - sum(r)  # ... so inverse-CDF sampling runs off the end; the id is clamped to V - 1
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        accept = min(1, p[x] / q_x)
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_unguarded_zero_residual(p, q, shortfall=Fraction(0)):
    p, q = validate_pair(p, q)
    p = [v * (1 - shortfall) for v in p]  # rounding model: the engine's p sums to 1 - shortfall
    out = [Fraction(0)] * (len(p) + 1)
    owed = [max(a - b, Fraction(0)) for a, b in zip(p, q)]
    r = [v / sum(owed) for v in owed] if sum(owed) else [Fraction(0)] * len(p) + [Fraction(1)]  # MISTAKE: 0/0
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        accept = min(1, p[x] / q_x)
        out[x] += q_x * accept
        for y, r_y in enumerate(r):  # NaN weights: no token is found, the id V comes out
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_ratio_mismatch(p, q, sampled_with=SamplingConfig(temperature=Fraction(1, 2))):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    r = normalized_residual(p, q)
    proposed = exact_transform(q, sampled_with)  # MISTAKE: the draft samples from transformed q ...
    for x, q_x in enumerate(proposed):
        if q_x == 0:
            continue
        accept = min(1, p[x] / q[x]) if q[x] else Fraction(1)  # ... but the ratio uses raw q
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_prune_reuse_formula(p, q, threshold=PRUNE_THRESHOLD):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    r = normalized_residual(p, q)
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        if q_x < threshold:  # pruned on its own q(x): emit a sample from p instead
            for y, p_y in enumerate(p):
                out[y] += q_x * p_y
            continue
        accept = min(1, p[x] / q_x)  # MISTAKE: the unpruned tokens reuse the formula with q
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_prune_fixed(p, q, threshold=PRUNE_THRESHOLD):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    keep = [q_x >= threshold for q_x in q]
    kept_mass = sum(q_x for q_x, k in zip(q, keep) if k)
    q_kept = [q_x / kept_mass if k else Fraction(0) for q_x, k in zip(q, keep)] if kept_mass else list(q)
    r = normalized_residual(p, q_kept)  # FIX: the residual against q~ = q * keep / Z ...
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        if not keep[x]:  # pruned (probability 1 - Z in all): emit a sample from p
            for y, p_y in enumerate(p):
                out[y] += q_x * p_y
            continue
        accept = min(1, p[x] / q_kept[x])  # ... and the ratio against q~ as well
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_stale_context(p, q, previous=None):
    p, q = validate_pair(p, q)
    previous = list(previous) if previous is not None else [Fraction(1, len(q))] * len(q)
    out = [Fraction(0)] * (len(p) + 1)
    r = normalized_residual(p, previous)  # MISTAKE: q from the previous position enters the residual ...
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        accept = min(1, p[x] / previous[x]) if previous[x] else Fraction(1)  # ... and the ratio
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_bonus_from_draft(p, q):
    """Law of the *second* emitted token, gamma = 1, when p and q do not depend on the context."""
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    alpha = sum(min(a, b) for a, b in zip(p, q))
    bonus = q  # MISTAKE: the bonus token after an accepted draft is drawn from q, not p
    for y in range(len(p)):
        out[y] += alpha * bonus[y] + (1 - alpha) * p[y]  # after a rejection the next block starts afresh
    return out


def exact_reseed_every_draw(p, q):
    """Law when the generator is reseeded before each draw, so all three draws see the same uniform u."""
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    r = normalized_residual(p, q)
    cuts = {Fraction(0), Fraction(1)}
    for probs in (q, r):
        running = Fraction(0)
        for v in probs:
            running += v
            cuts.add(min(running, Fraction(1)))
    cuts |= {p[x] / q[x] for x in range(len(q)) if q[x] and p[x] < q[x]}
    cuts = sorted(cuts)
    for lo, hi in zip(cuts, cuts[1:]):  # the emitted token is constant on each piece of [0, 1)
        u = (lo + hi) / 2
        x = _inverse_cdf_exact(q, u)
        y = x if u * q[x] < p[x] else _inverse_cdf_exact(r, u)  # MISTAKE: the same u three times
        out[y] += hi - lo
    return out


def _inverse_cdf_exact(probs, u):
    running = Fraction(0)
    for token, v in enumerate(probs):
        running += v
        if v > 0 and u < running:
            return token
    return max(i for i, v in enumerate(probs) if v > 0)


def exact_typical_acceptance(p, q, epsilon=TYPICAL_EPSILON):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    r = p  # LOSSY RULE: on rejection, sample from p ...
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        accept = Fraction(int(p[x] >= epsilon))  # ... and keep any draft the target finds likely enough
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_lenient_acceptance(p, q, lenience=LENIENCE):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    r = normalized_residual(p, q)
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        accept = min(1, lenience * p[x] / q_x)  # LOSSY RULE: a "lenience" factor in the ratio
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_peek_target_length(p, q, threshold=PEEK_THRESHOLD):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    r = normalized_residual(p, q)
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        if p[x] < threshold:  # MISTAKE: the target's p(x) decides whether x is verified at all;
            for y, p_y in enumerate(p):  # the block is cut before x, and its last token comes from p
                out[y] += q_x * p_y
            continue
        accept = min(1, p[x] / q_x)
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


class PeekAtTargetLength:
    """A draft-length rule that peeks (entry "peek_target_length"): up to ``gamma`` drafts, but the block
    is cut before the first draft whose target probability is below ``threshold``, which is not verified;
    the block then ends with a token from p. Its ``verifies`` method is what
    :func:`exact.adaptive_block_law` calls: the exact law of whole sequences under this rule."""

    name = "peek"

    def __init__(self, gamma: int = 2, threshold=PEEK_THRESHOLD):
        self.gamma = self.max_gamma = gamma
        self.threshold = threshold

    def start(self):
        return None

    def length(self, state) -> int:
        return self.gamma

    def stop_after(self, q):
        return False

    def update(self, state, accepted, full):
        return state

    def verifies(self, p_x, q_x) -> bool:
        return p_x >= self.threshold  # MISTAKE: the target decides which drafts get verified

    def describe(self) -> str:
        return f"peek at p (threshold {self.threshold}, {self.gamma} drafts)"


# --------------------------------------------------------------------------- samplers (torch)


def _categorical(weights: torch.Tensor, uniforms: torch.Tensor, normalise: bool = True, guard: bool = True):
    """Inverse-CDF draws from ``weights`` (V,) for each uniform; may return V when the CDF falls short."""
    if normalise:
        total = weights.sum()
        if guard and not total > 0:
            raise AssertionError("unreachable: callers fall back before a zero residual")
        weights = weights / total
    cdf = torch.cumsum(weights, dim=0)
    return torch.searchsorted(cdf, uniforms.unsqueeze(-1), right=True).squeeze(-1)


def _residual_or_target(p, q):
    owed = (p - q).clamp(min=0)
    return owed if owed.sum() > 0 else p  # the guard: a zero residual is never sampled


def sample_correct(p, q, n, generator):
    """Return n tokens emitted by the right rule (a small one-step torch implementation)."""
    x = torch.multinomial(q, n, replacement=True, generator=generator)  # the draft proposes x
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]  # u < p(x) / q(x) without dividing
    y = _categorical(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, x, y)


def sample_resample_from_target(p, q, n, generator):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]
    y = _categorical(p, torch.rand(n, generator=generator, dtype=p.dtype))  # MISTAKE: p, not the residual
    return torch.where(keep, x, y)


def sample_greedy_draft_softmax_ratio(p, q, n, generator):
    x = torch.full((n,), int(torch.argmax(q)), dtype=torch.long)  # MISTAKE: argmax draft, softmax q in the ratio
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]
    y = _categorical(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, x, y)


def sample_unnormalized_residual(p, q, n, generator):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]
    y = _categorical((p - q).clamp(min=0), torch.rand(n, generator=generator, dtype=p.dtype), normalise=False)
    y = y.clamp(max=len(p) - 1)  # MISTAKE above: unnormalised weights; the overrun is clamped to V - 1
    return torch.where(keep, x, y)


def sample_unguarded_zero_residual(p, q, n, generator, shortfall=0.0):
    p = p * (1 - shortfall)  # rounding model: the engine's p sums to 1 - shortfall
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]
    y = _categorical((p - q).clamp(min=0), torch.rand(n, generator=generator, dtype=p.dtype), guard=False)
    return torch.where(keep, x, y)  # MISTAKE above: 0/0 gives NaN weights and the id V


def sample_ratio_mismatch(p, q, n, generator, sampled_with=SamplingConfig(temperature=0.5)):
    # q's logits through the engine's own transform (float32 rounding; exact Fractions over V = 32,000 took 30 s)
    proposal = logits_to_probs(q.double().log(), sampled_with).to(p.dtype)
    x = torch.multinomial(proposal, n, replacement=True, generator=generator)  # MISTAKE: sampled from q'
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]  # ... verified against q
    y = _categorical(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, x, y)


def sample_prune_reuse_formula(p, q, n, generator, threshold=float(PRUNE_THRESHOLD)):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]  # MISTAKE: the unpruned tokens reuse the formula with q
    y = _categorical(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
    from_target = _categorical(p, torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(q[x] < threshold, from_target, torch.where(keep, x, y))


def sample_prune_fixed(p, q, n, generator, threshold=float(PRUNE_THRESHOLD)):
    kept = torch.where(q >= threshold, q, torch.zeros_like(q))
    q_kept = kept / kept.sum()  # FIX: q~ = q * keep / Z in both the ratio and the residual
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q_kept[x] < p[x]
    y = _categorical(_residual_or_target(p, q_kept), torch.rand(n, generator=generator, dtype=p.dtype))
    from_target = _categorical(p, torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(q[x] < threshold, from_target, torch.where(keep, x, y))


def sample_stale_context(p, q, n, generator, previous=None):
    previous = previous if previous is not None else torch.full_like(q, 1 / len(q))
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * previous[x] < p[x]  # MISTAKE: the previous position's q in the ratio and the residual
    y = _categorical(_residual_or_target(p, previous), torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, x, y)


def sample_bonus_from_draft(p, q, n, generator):
    """The second emitted token of a stream of gamma = 1 blocks, with the library's real sampler."""
    from speculative.sampling.sampler import rejection_sample

    drafts = torch.multinomial(q, n, replacement=True, generator=generator).unsqueeze(1)
    target = torch.stack([p, q]).expand(n, 2, len(p))  # MISTAKE: the bonus row holds q instead of p
    out = rejection_sample(drafts, q.expand(n, 1, len(q)), target, generator)
    next_block = sample_correct(p, q, n, generator)  # after a rejection, the next block's first token
    return torch.where(out.num_accepted == 1, out.tokens[:, 1], next_block)


def sample_reseed_every_draw(p, q, n, generator):
    u = torch.rand(n, generator=generator, dtype=p.dtype)  # MISTAKE: one uniform serves all three draws
    x = _categorical(q, u)
    keep = u * q[x] < p[x]
    y = _categorical(_residual_or_target(p, q), u)
    return torch.where(keep, x, y)


def sample_typical_acceptance(p, q, n, generator, epsilon=float(TYPICAL_EPSILON)):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    keep = p[x] >= epsilon  # LOSSY RULE: keep a draft the target finds likely enough, else sample p
    y = _categorical(p, torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, x, y)


def sample_peek_target_length(p, q, n, generator, threshold=float(PEEK_THRESHOLD)):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]
    y = _categorical(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
    fresh = _categorical(p, torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(p[x] < threshold, fresh, torch.where(keep, x, y))  # MISTAKE: unverified when p(x) is low


def sample_lenient_acceptance(p, q, n, generator, lenience=LENIENCE):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < lenience * p[x]  # LOSSY RULE: a "lenience" factor in the ratio
    y = _categorical(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, x, y)


# --------------------------------------------------------------------------- the catalogue


@dataclass(frozen=True)
class Pitfall:
    """One wrong implementation: its two forms, where it was seen, and a pair on which it bites."""

    key: str
    title: str
    mistake: str  # one sentence: what the code does wrong
    seen_in: str  # real systems that shipped it, or the family of methods it belongs to
    exact: Callable
    sample: Callable
    demo_p: tuple = SEED_P
    demo_q: tuple = SEED_Q
    options: dict = field(default_factory=dict)  # extra arguments both forms take on the demo pair
    cites: tuple = ()  # keys in book/references.bib of the sources named in seen_in
    lossless: bool = False  # True only for the fix

    def exact_law(self, p=None, q=None) -> list[Fraction]:
        """Return the exact law (V + 1 entries) on (p, q), by default on the pitfall's demo pair."""
        return self.exact(list(p if p is not None else self.demo_p), list(q if q is not None else self.demo_q),
                          **self.options)

    def draw(self, n: int, generator: torch.Generator, p=None, q=None) -> torch.Tensor:
        """Return n sampled token ids (V = invalid) on (p, q), by default on the demo pair."""
        p_t = torch.tensor([float(v) for v in (p if p is not None else self.demo_p)], dtype=torch.float64)
        q_t = torch.tensor([float(v) for v in (q if q is not None else self.demo_q)], dtype=torch.float64)
        options = {k: (torch.tensor([float(x) for x in v], dtype=torch.float64) if isinstance(v, (list, tuple)) else
                       float(v) if isinstance(v, Fraction) else v) for k, v in self.options.items()}
        return self.sample(p_t, q_t, n, generator, **options)


_SECOND_P = (Fraction(1, 2), Fraction(1, 4), Fraction(1, 8), Fraction(1, 8))
_SECOND_Q = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(1, 8))

PITFALLS: list[Pitfall] = [
    Pitfall("resample_from_target", "Resampling from p after a rejection",
            "After a rejection the code draws a fresh token from p instead of from the normalised residual.",
            "reported in SafeAILab/EAGLE #329 (non-greedy path resamples from p only)",
            exact_resample_from_target, sample_resample_from_target, cites=("eagle329",)),
    Pitfall("greedy_draft_softmax_ratio", "Greedy draft scored with its softmax",
            "The draft proposes its arg-max token, but the ratio divides by the softmax q(x) it never sampled from.",
            "transformers #32867 (fixed by #33534); jaymody/speculative-sampling #3",
            exact_greedy_draft_softmax_ratio, sample_greedy_draft_softmax_ratio,
            cites=("transformers32867", "transformers33534", "jaymody3")),
    Pitfall("unnormalized_residual", "Unnormalised residual",
            "The residual max(p - q, 0) is sampled by inverse CDF without dividing by its mass; the overrun "
            "is clamped to the last token id.",
            "figures that omit the normalisation (seed article); "
            "transformers #28508 fixed a residual normalised with softmax",
            exact_unnormalized_residual, sample_unnormalized_residual, cites=("yaotu2026seed", "transformers28508")),
    Pitfall("unguarded_zero_residual", "Zero residual divided anyway",
            "The residual is divided by its mass with no guard; when rounding makes p fall below q everywhere "
            "the mass is 0, the weights are NaN, and the sampler returns the id V.",
            "vLLM advisory GHSA-8wr5-jm2h-8r4f (out-of-range token id)",
            exact_unguarded_zero_residual, sample_unguarded_zero_residual,
            demo_p=SEED_P, demo_q=SEED_P, options={"shortfall": Fraction(1, 100)}, cites=("vllmGHSA8wr5",)),
    Pitfall("temperature_mismatch", "Draft temperature missing from the ratio",
            "Drafts are sampled at temperature 1/2, but the ratio and the residual use q at temperature 1.",
            "vllm #9834 (sampling parameters not applied at verification, fixed by #10198)",
            exact_ratio_mismatch, sample_ratio_mismatch, cites=("vllm9834", "vllm10198")),
    Pitfall("top_k_mismatch", "Top-k applied to drafts but not to q",
            "Drafts come from top-k filtered q, but the q handed to the rule is the raw softmax.",
            "transformers #47932",
            exact_ratio_mismatch, sample_ratio_mismatch, demo_p=_SECOND_P, demo_q=_SECOND_Q,
            options={"sampled_with": SamplingConfig(top_k=2)}, cites=("transformers47932",)),
    Pitfall("prune_reuse_formula", "Pruning a candidate on its own q(x)",
            "A drafted token with q(x) < 1/4 is pruned and replaced by a draw from p; the others are verified "
            "with the unchanged formula.",
            "vLLM's notes on adaptive verification (seed article)",
            exact_prune_reuse_formula, sample_prune_reuse_formula, cites=("yaotu2026seed",)),
    Pitfall("stale_context", "q from a stale context",
            "The q entering the ratio and the residual belongs to the previous position (a cache rolled back "
            "one token too few); here that stale q is uniform.",
            "cache rollback bugs such as Blaizzy/mlx-vlm #1155 (batched rollback moved every row by the whole block)",
            exact_stale_context, sample_stale_context, cites=("mlxvlm1155",)),
    Pitfall("bonus_from_draft", "Bonus token drawn from q",
            "When every draft is accepted, the extra token is drawn from the draft's q instead of the target's p.",
            "no shipped instance verified; the bonus-token path is fragile (vllm #9730 fixed a KV corruption there)",
            exact_bonus_from_draft, sample_bonus_from_draft, cites=("vllm9730",)),
    Pitfall("reseed_every_draw", "Reseeding before every draw",
            "The generator is reseeded with the same seed before each draw, so drafting, the acceptance test "
            "and the residual all see the same uniform number.",
            "no shipped instance verified; per-request seeds applied per call instead of per stream",
            exact_reseed_every_draw, sample_reseed_every_draw),
    Pitfall("typical_acceptance", "Typical acceptance (lossy by design)",
            "A draft is kept whenever p(x) >= 1/4, otherwise a token is drawn from p: fast, but not p.",
            "Medusa-style typical acceptance (Cai et al., 2024), offered by engines as a faster, approximate mode",
            exact_typical_acceptance, sample_typical_acceptance, cites=("cai2024medusa",)),
    Pitfall("lenient_acceptance", "A lenience factor (lossy by design)",
            "The ratio is inflated to min(1, 2 p(x) / q(x)) to accept more drafts.",
            "'lenient' verification schemes that trade exactness for acceptance",
            exact_lenient_acceptance, sample_lenient_acceptance),
    Pitfall("peek_target_length", "A draft length chosen by peeking at the target",
            "A rule for the draft length looks at the target's p(x) of each draft before verifying: a draft with "
            "p(x) < 1/4 is not verified, the block is cut there and ends with a token from p.",
            "no shipped instance verified; the lawful schedules, such as transformers' heuristic and its "
            "confidence threshold, look only at the draft and at earlier blocks",
            exact_peek_target_length, sample_peek_target_length, cites=("mamou2024dynamic",)),
]

#: The right way to prune: verify against q~ = q * keep / Z in both the ratio and the residual.
FIX = Pitfall("prune_fixed", "Pruning, fixed",
              "With probability 1 - Z the candidate is pruned and a draw from p is emitted; otherwise the "
              "candidate is verified against q~ = q * keep / Z in both the ratio and the residual.",
              "the fix the seed article describes", exact_prune_fixed, sample_prune_fixed, lossless=True,
              cites=("yaotu2026seed",))


# --------------------------------------------------------------------------- several drafts per position


def exact_multi_draft(p, q, drafts=2, scheme="with_replacement", threshold=Fraction(1)):
    """Return the exact law of the emitted token (V + 1 entries, the last 0) when ``drafts`` candidates are
    verified at one position by ``scheme`` (see :func:`exact.multi_draft_step`)."""
    from speculative.exact.exact import multi_draft_step

    return list(multi_draft_step(p, q, drafts, scheme, threshold)["output"]) + [Fraction(0)]


def sample_multi_draft(p, q, n, generator, drafts=2, scheme="with_replacement", threshold=1.0):
    """Return n tokens, each from ``drafts`` candidates drawn and verified by ``scheme`` (the batched
    :func:`sampler.draw_candidates` and :func:`sampler.multi_draft_sample`)."""
    from speculative.sampling.sampler import draw_candidates, multi_draft_sample

    target, draft = p.expand(n, -1), q.expand(n, -1)
    candidates = draw_candidates(draft, int(drafts), scheme, generator)
    return multi_draft_sample(candidates, draft, target, generator, scheme=scheme, threshold=threshold).token


_UNADJUSTED_P = (Fraction(7, 10), Fraction(1, 5), Fraction(1, 10))
_UNADJUSTED_Q = (Fraction(1, 10), Fraction(1, 10), Fraction(4, 5))

#: Mistakes that need several candidates per position; each form takes ``drafts`` and ``scheme``.
MULTI_DRAFT_PITFALLS: list[Pitfall] = [
    Pitfall("without_replacement_unadjusted", "Drafts without replacement, judged against the plain q",
            "Two candidates are drawn without replacement, but the second is judged (ratio and residual) against "
            "q itself instead of q renormalised over the tokens not yet tried.",
            "the adjustment EAGLE's maintainers describe in SafeAILab/EAGLE #74 (sampling without replacement "
            "needs the distribution each draft was really drawn from)",
            exact_multi_draft, sample_multi_draft, demo_p=_UNADJUSTED_P, demo_q=_UNADJUSTED_Q,
            options={"drafts": 2, "scheme": "without_replacement_unadjusted"}, cites=("eagle74",)),
    Pitfall("top_k_threshold", "A top-k tree accepted below threshold 1",
            "The fixed top-2 list of q is verified against the running sum of p divided by a threshold of 1/2, "
            "so candidates are accepted up to twice as readily as the target allows.",
            "SGLang's tree kernel exposes such thresholds (threshold_acc, threshold_single); it is exact "
            "when threshold_acc is 1 and threshold_single at least 1",
            exact_multi_draft, sample_multi_draft,
            options={"drafts": 2, "scheme": "top_k_threshold", "threshold": Fraction(1, 2)},
            cites=("sglangtreekernel",)),
]


def find(key: str) -> Pitfall:
    """Return the pitfall (or the fix) called ``key``; an unknown key raises with the known ones."""
    known = PITFALLS + [FIX] + MULTI_DRAFT_PITFALLS
    for item in known:
        if item.key == key:
            return item
    raise ValueError(f"unknown pitfall {key!r}; known: {', '.join(p.key for p in known)}")


def describe_options(options: Optional[dict]) -> str:
    """Return the options of a demo as short text, for tables."""
    if not options:
        return ""
    return ", ".join(f"{k}={v.describe() if isinstance(v, SamplingConfig) else v}" for k, v in options.items())


def _code_lines(function) -> list[tuple[str, str]]:
    """Return (line as written, line without its comment) for a function's body, docstring dropped."""
    lines = inspect.getsource(function).splitlines()[1:]  # drop the def line
    if lines and lines[0].strip().startswith('"""'):
        end = next(i for i, line in enumerate(lines)
                   if line.rstrip().endswith('"""') and (i > 0 or line.count('"""') == 2))
        lines = lines[end + 1:]
    return [(line, line.split("  #")[0].rstrip()) for line in lines]


def diff_from_correct(function) -> str:
    """Return the lines of ``function`` that differ from :func:`exact_correct` (comments ignored when
    comparing, kept when shown): ``-`` for the right rule's lines, ``+`` for the wrong one's."""
    reference, changed = _code_lines(exact_correct), _code_lines(function)
    matcher = difflib.SequenceMatcher(a=[c for _, c in reference], b=[c for _, c in changed], autojunk=False)
    out = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        out += ["-" + reference[i][1] for i in range(i1, i2)]
        out += ["+" + changed[j][0] for j in range(j1, j2)]
    return "\n".join(out)


# --------------------------------------------------------------------------- batched, for real decoding


def _batched_rule(keep_drafts: Callable) -> Callable:
    """Return a verification rule with ``rejection_sample``'s signature that keeps the first drafts for
    which ``keep_drafts(p_drafted, q_drafted, generator)`` is True and, at the first draft it does not
    keep (or after all of them), emits a token drawn from the target's p at that position. Every
    mistake built this way draws its last token from p, never from the residual."""
    from speculative.sampling.sampler import SamplerOutput

    def sample(draft_tokens, draft_probs, target_probs, generator, check_values=True):
        batch, k = draft_tokens.shape
        index = draft_tokens.unsqueeze(-1)
        p_drafted = target_probs[:, :k].gather(-1, index).squeeze(-1)
        q_drafted = draft_probs.gather(-1, index).squeeze(-1)
        num_accepted = keep_drafts(p_drafted, q_drafted, generator).long().cumprod(dim=-1).sum(dim=-1)  # (B,)
        rows = torch.arange(batch, device=draft_tokens.device)
        final = torch.multinomial(target_probs[rows, num_accepted].float(), 1, generator=generator).squeeze(1)
        positions = torch.arange(k + 1, device=draft_tokens.device).unsqueeze(0)
        padded = torch.cat([draft_tokens, torch.full((batch, 1), -1, device=draft_tokens.device)], 1)
        out = torch.where(positions < num_accepted.unsqueeze(1), padded, torch.full_like(padded, -1))
        out.scatter_(1, num_accepted.unsqueeze(1), final.unsqueeze(1))
        return SamplerOutput(tokens=out, num_accepted=num_accepted, num_emitted=num_accepted + 1)

    return sample


def typical_acceptance_sampler(epsilon: float = float(TYPICAL_EPSILON)) -> Callable:
    """Return a batched verification rule with ``rejection_sample``'s signature that makes the typical-
    acceptance mistake (entry "typical_acceptance"): keep a draft while p(x) >= epsilon, and on the first
    draft below it emit a token drawn from p. Fast and plausible, but not the target's distribution."""
    return _batched_rule(lambda p, q, generator: p >= epsilon)


def resample_from_target_sampler() -> Callable:
    """Return a batched verification rule with ``rejection_sample``'s signature that makes the mistake of
    entry "resample_from_target": the acceptance test is the correct one (keep x with probability
    min(1, p(x)/q(x))), but after a rejection the token is drawn from p instead of the residual
    max(p - q, 0). It over-weights tokens both models like and under-weights those only the target likes."""

    def keep(p, q, generator):
        uniforms = torch.rand(p.shape, generator=generator, device=p.device, dtype=p.dtype)
        return uniforms * q < p  # u < p(x) / q(x) without dividing

    return _batched_rule(keep)
