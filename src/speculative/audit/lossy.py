"""Five acceptance rules that are lossy by design, as read in their sources: the catalogue, and samplers.

Explained in: notebooks/05_pitfalls (section "Lossy by design").

Each entry pairs an exact law (:mod:`exact.lossy_laws`) with a small torch sampler that applies the same
rule to one position, in the form of :mod:`audit.pitfalls` (``sample(p, q, n, generator, **options)``).
The options are the settings the chapter states; ``Pitfall.target_law`` is what a lawful rule emits there
(p, or p's arg-max for TensorRT-LLM's greedy rule).
"""

from __future__ import annotations

from fractions import Fraction

import torch

from speculative.audit.pitfalls import Pitfall
from speculative.exact.lossy_laws import (
    FLY_ENTROPY,
    FLY_WINDOW,
    FUZZY_THRESHOLD,
    RELAXED_DELTA,
    RELAXED_TOPK,
    SGLANG_THRESHOLD,
    TYPICAL_ALPHA,
    TYPICAL_THRESHOLD,
    exact_fly,
    exact_fuzzy,
    exact_relaxed_acceptance,
    exact_sglang_thresholds,
    exact_typical_acceptance_entropy,
)
from speculative.sampling.draws import inverse_cdf

__all__ = ["LOSSY_RULES", "FLY_P", "FLY_Q"]


def _all(n, token):
    return torch.full((n,), int(token), dtype=torch.long)


def _without(p, x):
    rest = p.clone()
    rest[x] = 0
    return rest if rest.sum() > 0 else p


def sample_relaxed_acceptance(p, q, n, generator, topk=RELAXED_TOPK, delta=float(RELAXED_DELTA)):
    x = int(torch.argmax(q))
    top = torch.topk(p, min(topk, len(p))).indices.tolist()
    keep = x in top and float(p[x]) >= float(p.max()) - delta
    return _all(n, x if keep else torch.argmax(p))


def sample_typical_acceptance_entropy(p, q, n, generator, threshold=float(TYPICAL_THRESHOLD),
                                      alpha=float(TYPICAL_ALPHA)):
    x = torch.multinomial(q, n, replacement=True, generator=generator)
    entropy = -(p * torch.log(p + 1e-5)).sum()
    bar = torch.minimum(torch.tensor(threshold, dtype=p.dtype), alpha * torch.exp(-entropy))
    return torch.where(p[x] > bar, x, torch.argmax(p))


def sample_sglang_thresholds(p, q, n, generator, threshold_single=float(SGLANG_THRESHOLD),
                             threshold_acc=float(SGLANG_THRESHOLD)):
    x = int(torch.argmax(q))
    coin = torch.rand(n, generator=generator, dtype=p.dtype)
    keep = (coin <= p[x] / max(threshold_acc, 1e-9)) | (p[x] >= threshold_single)
    y = inverse_cdf(_without(p, x), torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, _all(n, x), y)


def sample_fly(p, q, n, generator, window=FLY_WINDOW, entropy_threshold=float(FLY_ENTROPY)):
    x = int(torch.argmax(q))
    coins = torch.rand(n, window + 1, generator=generator, dtype=p.dtype)
    native = coins < p[x]  # column 0 is this position, the others the next `window` drafts
    top3 = torch.topk(p, min(3, len(p))).values
    gate = bool(-(top3 * torch.log(top3.clamp(min=1e-300))).sum() >= entropy_threshold) and bool(p[x] > 0)
    keep = native[:, 0] | (gate & native[:, 1:].all(dim=1))
    y = inverse_cdf(_without(p, x), torch.rand(n, generator=generator, dtype=p.dtype))
    return torch.where(keep, _all(n, x), y)


def sample_fuzzy(p, q, n, generator, threshold=float(FUZZY_THRESHOLD)):
    m = (p + q) / 2
    def kl(a):
        return torch.where(a > 0, a * torch.log(a / m), torch.zeros_like(a)).sum()
    x = int(torch.argmax(q))
    if float(kl(p) + kl(q)) / 2 <= threshold:
        return _all(n, x)
    return inverse_cdf(p, torch.rand(n, generator=generator, dtype=p.dtype))


FLY_P = (Fraction(3, 4), Fraction(1, 8), Fraction(1, 8))
FLY_Q = (Fraction(1, 2), Fraction(1, 4), Fraction(1, 4))

LOSSY_RULES: list[Pitfall] = [
    Pitfall("relaxed_acceptance", "TensorRT-LLM's relaxed acceptance (MTP, thinking phase)",
            "A greedy rule: the MTP head's arg-max draft is kept when it is among the target's top-k and its "
            "probability is at least the top one's minus delta; otherwise the target's arg-max is emitted.",
            "TensorRT-LLM's MTP decoding (relaxed_topk, relaxed_delta; applied between think tags), "
            "mtpRelaxedAcceptanceKernel",
            exact_relaxed_acceptance, sample_relaxed_acceptance, greedy=True,
            options={"topk": RELAXED_TOPK, "delta": RELAXED_DELTA}, cites=("tensorrtllmmtp",)),
    Pitfall("typical_acceptance_entropy", "Typical acceptance with the entropy threshold",
            "A sampled draft is kept when p(x) > min(threshold, alpha * exp(-H(p))); at the first draft below "
            "it, the target's arg-max is emitted.",
            "Medusa's evaluate_posterior and vLLM's TypicalAcceptanceSampler, at their defaults",
            exact_typical_acceptance_entropy, sample_typical_acceptance_entropy,
            options={"threshold": TYPICAL_THRESHOLD, "alpha": TYPICAL_ALPHA},
            cites=("cai2024medusa", "medusacode")),
    Pitfall("sglang_thresholds", "SGLang's acceptance thresholds below 1",
            "The top-1 draft x is kept when p(x) >= threshold_single or a uniform u <= p(x) / threshold_acc; "
            "otherwise a token is drawn from p without x.",
            "SGLang's TreeSpeculativeSamplingTargetOnly kernel (speculative_accept_threshold_single, "
            "speculative_accept_threshold_acc; both 1 by default, which is exact for a top-1 draft)",
            exact_sglang_thresholds, sample_sglang_thresholds,
            options={"threshold_single": SGLANG_THRESHOLD, "threshold_acc": SGLANG_THRESHOLD},
            cites=("sglangtreekernel",)),
    Pitfall("fly", "FLy: a rejected draft kept when the next ones pass",
            "A draft the target rejects is kept anyway when the top-3 entropy of p is at least a threshold and "
            "the next `window` drafts pass the target's test (here the same pair at every position).",
            "FLy (Li et al., 2025) and a vLLM pull request that adds it (fly_window_size, "
            "fly_entropy_threshold; open when read)",
            exact_fly, sample_fly, demo_p=FLY_P, demo_q=FLY_Q,
            options={"window": FLY_WINDOW, "entropy_threshold": FLY_ENTROPY}, cites=("li2025fly", "vllm53987")),
    Pitfall("fuzzy", "Fuzzy speculative decoding",
            "When the Jensen-Shannon divergence of p and q is at most a threshold, the greedy draft is kept "
            "outright; otherwise a token is drawn from p.",
            "fuzzy speculative decoding (Holsman et al., 2025), its reference code (fsd_div_threshold, "
            "fsd_div_type js_div; the assistant drafts greedily there)",
            exact_fuzzy, sample_fuzzy, options={"threshold": FUZZY_THRESHOLD}, cites=("holsman2025fuzzy",)),
]
