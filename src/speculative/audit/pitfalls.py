"""Wrong implementations of speculative sampling, each beside the right one: the catalogue, and samplers.

Explained in: notebooks/05_pitfalls.

Every pitfall comes in two forms that make the same mistake:

- ``exact(p, q, **options)``: the exact law of the emitted token, as Fractions, computed branch by
  branch (:mod:`exact.pitfall_laws`, each a small edit of :func:`pitfall_laws.exact_correct`). The list
  has V + 1 entries: the last is the probability of emitting an *invalid* token id (out of range), which
  a correct sampler never does.
- ``sample(p, q, n, generator, **options)``: n independent draws from a small torch implementation with
  the same mistake (ids may equal V, the invalid id), used by the sabotage tests to show that the
  statistical test catches it. Each is an edit of :func:`sample_correct`.

:data:`PITFALLS` lists them with the real systems that shipped the mistake and a pair of distributions
on which it bites; :data:`FIX` is the right way to prune, :data:`MULTI_DRAFT_PITFALLS` the mistakes of
several drafts per position. :func:`typical_acceptance_sampler` and :func:`resample_from_target_sampler`
make two of the mistakes in the batched form real decoding calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Optional

import torch

from speculative.exact.lossy_laws import greedy_law
from speculative.exact.pitfall_laws import (
    LENIENCE,
    PEEK_THRESHOLD,
    PRUNE_THRESHOLD,
    SEED_P,
    SEED_Q,
    TYPICAL_EPSILON,
    exact_bonus_from_draft,
    exact_greedy_draft_softmax_ratio,
    exact_lenient_acceptance,
    exact_multi_draft,
    exact_peek_target_length,
    exact_prune_fixed,
    exact_prune_reuse_formula,
    exact_resample_from_target,
    exact_reseed_every_draw,
    exact_stale_context,
    exact_typical_acceptance,
    exact_unguarded_zero_residual,
    exact_unnormalized_residual,
    extend,
)
from speculative.exact.rule import normalized_residual, validate_pair
from speculative.sampling.draws import inverse_cdf
from speculative.sampling.transforms import SamplingConfig, exact_transform, logits_to_probs

__all__ = ["Pitfall", "PITFALLS", "FIX", "MULTI_DRAFT_PITFALLS", "find", "describe_options", "exact_ratio_mismatch",
           "sample_correct", "sample_multi_draft", "typical_acceptance_sampler", "resample_from_target_sampler"]


# --------------------------------------------------------------------------- the law that needs the transforms


# The exact law of a draft sampled after :func:`transforms.exact_transform` but judged with the raw q
# (an edit of :func:`pitfall_laws.exact_correct`, kept here because the transform is the sampling ring's).
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


# --------------------------------------------------------------------------- samplers (torch)


def _residual_or_target(p, q):
    owed = (p - q).clamp(min=0)
    return owed if owed.sum() > 0 else p  # the guard: a zero residual is never sampled


def sample_correct(p, q, n, generator):
    """Return n tokens emitted by the right rule (a small one-step torch implementation)."""
    x = torch.multinomial(q, n, replacement=True, generator=generator)  # the draft proposes x
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]  # u < p(x) / q(x) without dividing
    y = inverse_cdf(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, x, y)


def sample_resample_from_target(p, q, n, generator):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]
    y = inverse_cdf(p, torch.rand(n, generator=generator, dtype=p.dtype))  # MISTAKE: p, not the residual
    return torch.where(keep, x, y)


def sample_greedy_draft_softmax_ratio(p, q, n, generator):
    x = torch.full((n,), int(torch.argmax(q)), dtype=torch.long)  # MISTAKE: argmax draft, softmax q in the ratio
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]
    y = inverse_cdf(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, x, y)


def sample_unnormalized_residual(p, q, n, generator):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]
    y = inverse_cdf((p - q).clamp(min=0), torch.rand(n, generator=generator, dtype=p.dtype), normalise=False,
                    clamp=False)
    y = y.clamp(max=len(p) - 1)  # MISTAKE above: unnormalised weights; the overrun is clamped to V - 1
    return torch.where(keep, x, y)


def sample_unguarded_zero_residual(p, q, n, generator, shortfall=0.0):
    p = p * (1 - shortfall)  # rounding model: the engine's p sums to 1 - shortfall
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]
    owed = (p - q).clamp(min=0)
    y = inverse_cdf(owed / owed.sum(), torch.rand(n, generator=generator, dtype=p.dtype), normalise=False, clamp=False)
    return torch.where(keep, x, y)  # MISTAKE above: no guard, so 0/0 gives NaN weights and the id V


def sample_ratio_mismatch(p, q, n, generator, sampled_with=SamplingConfig(temperature=0.5)):
    # q's logits through the engine's own transform (float32 rounding; exact Fractions over V = 32,000 took 30 s)
    proposal = logits_to_probs(q.double().log(), sampled_with).to(p.dtype)
    x = torch.multinomial(proposal, n, replacement=True, generator=generator)  # MISTAKE: sampled from q'
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]  # ... verified against q
    y = inverse_cdf(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, x, y)


def sample_prune_reuse_formula(p, q, n, generator, threshold=float(PRUNE_THRESHOLD)):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]  # MISTAKE: the unpruned tokens reuse the formula with q
    y = inverse_cdf(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
    from_target = inverse_cdf(p, torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(q[x] < threshold, from_target, torch.where(keep, x, y))


def sample_prune_fixed(p, q, n, generator, threshold=float(PRUNE_THRESHOLD)):
    kept = torch.where(q >= threshold, q, torch.zeros_like(q))
    q_kept = kept / kept.sum()  # FIX: q~ = q * keep / Z in both the ratio and the residual
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q_kept[x] < p[x]
    y = inverse_cdf(_residual_or_target(p, q_kept), torch.rand(n, generator=generator, dtype=p.dtype))
    from_target = inverse_cdf(p, torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(q[x] < threshold, from_target, torch.where(keep, x, y))


def sample_stale_context(p, q, n, generator, previous=None):
    previous = previous if previous is not None else torch.full_like(q, 1 / len(q))
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * previous[x] < p[x]  # MISTAKE: the previous position's q in the ratio and the residual
    y = inverse_cdf(_residual_or_target(p, previous), torch.rand(n, generator=generator, dtype=p.dtype))
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
    x = inverse_cdf(q, u)
    keep = u * q[x] < p[x]
    y = inverse_cdf(_residual_or_target(p, q), u)
    return torch.where(keep, x, y)


def sample_typical_acceptance(p, q, n, generator, epsilon=float(TYPICAL_EPSILON)):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    keep = p[x] >= epsilon  # LOSSY RULE: keep a draft the target finds likely enough, else sample p
    y = inverse_cdf(p, torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, x, y)


def sample_peek_target_length(p, q, n, generator, threshold=float(PEEK_THRESHOLD)):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < p[x]
    y = inverse_cdf(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
    fresh = inverse_cdf(p, torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(p[x] < threshold, fresh, torch.where(keep, x, y))  # MISTAKE: unverified when p(x) is low


def sample_lenient_acceptance(p, q, n, generator, lenience=LENIENCE):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    u = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = u * q[x] < lenience * p[x]  # LOSSY RULE: a "lenience" factor in the ratio
    y = inverse_cdf(_residual_or_target(p, q), torch.rand(n, generator=generator, dtype=p.dtype))
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
    greedy: bool = False  # a greedy rule: its lawful output is the target's arg-max, not a draw from p

    def exact_law(self, p=None, q=None) -> list[Fraction]:
        """Return the exact law (V + 1 entries) on (p, q), by default on the pitfall's demo pair."""
        return self.exact(list(p if p is not None else self.demo_p), list(q if q is not None else self.demo_q),
                          **self.options)

    def target_law(self, p=None) -> list[Fraction]:
        """Return the law a lawful rule emits on p (V + 1 entries): p itself, or, for a greedy rule, one-hot
        at p's arg-max."""
        p = list(p if p is not None else self.demo_p)
        return greedy_law(p) if self.greedy else extend(p)

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
            "figures that omit the normalisation (seed article); no shipped instance verified",
            exact_unnormalized_residual, sample_unnormalized_residual, cites=("yaotu2026seed",)),
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
            "a simplified Medusa-style typical acceptance (Cai et al., 2024): a fixed threshold, and a draw from p "
            "after a rejection where Medusa and vLLM emit the arg-max (entry L2 below is their rule)",
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


def resample_from_target_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The law of one position under entry "resample_from_target", for rows of p and q: the accepted
    drafts, min(p, q), plus the rejected mass 1 - sum min(p, q) drawn from p. It is the same at every
    position of a block, so ``evaluate.exact_two_byte_law(..., step=resample_from_target_law)`` gives the
    exact law of :func:`resample_from_target_sampler`'s first two tokens."""
    kept = torch.minimum(p, q)
    return kept + (1 - kept.sum(-1, keepdim=True)) * p


def resample_from_target_sampler() -> Callable:
    """Return a batched verification rule with ``rejection_sample``'s signature that makes the mistake of
    entry "resample_from_target": the acceptance test is the correct one (keep x with probability
    min(1, p(x)/q(x))), but after a rejection the token is drawn from p instead of the residual
    max(p - q, 0). It over-weights tokens both models like and under-weights those only the target likes."""

    def keep(p, q, generator):
        uniforms = torch.rand(p.shape, generator=generator, device=p.device, dtype=p.dtype)
        return uniforms * q < p  # u < p(x) / q(x) without dividing

    return _batched_rule(keep)
