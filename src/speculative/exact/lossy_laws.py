"""The exact laws of five acceptance rules that engines and papers of 2025-26 ship as lossy by design.

Explained in: notebooks/05_pitfalls (section "Lossy by design").

Each ``exact_*(p, q, **settings)`` returns the law of the token one verification step emits (V + 1
entries, the last the invalid id, always 0 here), written as an edit of
:func:`pitfall_laws.exact_correct` so that :func:`pitfall_laws.diff_from_correct` shows what each rule
changes. Each rule was read in its own source; the catalogue (:mod:`audit.lossy`) names the file. Four of
them verify a greedy draft, the draft's arg-max, which is what their engines hand the verifier; one of
those (TensorRT-LLM's relaxed acceptance) is a greedy rule, whose lawful output is the target's arg-max,
not a sample of p.

Thresholds on an entropy or a divergence are compared in floating point (math.log and math.exp are not
rational); every other step is exact.
"""

from __future__ import annotations

import math
from fractions import Fraction

from speculative.exact.rule import normalized_residual, validate_pair

__all__ = ["RELAXED_TOPK", "RELAXED_DELTA", "TYPICAL_THRESHOLD", "TYPICAL_ALPHA", "SGLANG_THRESHOLD",
           "FLY_WINDOW", "FLY_ENTROPY", "FUZZY_THRESHOLD", "arg_max", "greedy_draft", "greedy_law",
           "entropy", "top3_entropy", "js_divergence", "exact_relaxed_acceptance",
           "exact_typical_acceptance_entropy", "exact_sglang_thresholds", "exact_fly", "exact_fuzzy"]

RELAXED_TOPK, RELAXED_DELTA = 10, Fraction(3, 5)  # the settings TensorRT-LLM's MTP blog recommends
TYPICAL_THRESHOLD, TYPICAL_ALPHA = Fraction(9, 100), Fraction(3, 10)  # Medusa's and vLLM's defaults
SGLANG_THRESHOLD = Fraction(1, 2)  # both of SGLang's thresholds (their default, 1, is exact)
FLY_WINDOW, FLY_ENTROPY = 6, Fraction(3, 10)  # the defaults of vLLM's FLy pull request
FUZZY_THRESHOLD = Fraction(2, 5)  # the Jensen-Shannon threshold of the fuzzy-decoding README's example


def arg_max(probs) -> int:
    """The first index of the largest entry (torch.argmax's convention)."""
    return max(range(len(probs)), key=lambda i: (probs[i], -i))


def greedy_draft(q) -> list[Fraction]:
    """The law of a draft that proposes its arg-max: one-hot at it."""
    return [Fraction(int(i == arg_max(q))) for i in range(len(q))]


def greedy_law(p) -> list[Fraction]:
    """The lawful output of a greedy rule (V + 1 entries): one-hot at the target's arg-max."""
    return greedy_draft(p) + [Fraction(0)]


def entropy(p, floor: float = 1e-5) -> float:
    """-sum p ln(p + floor), the entropy as Medusa and vLLM's typical acceptance compute it."""
    return -sum(float(v) * math.log(float(v) + floor) for v in p)


def top3_entropy(p) -> float:
    """-sum p ln p over the three largest entries, un-normalised: FLy's entropy gate."""
    return -sum(float(v) * math.log(float(v)) for v in sorted(p, reverse=True)[:3] if v > 0)


def js_divergence(p, q) -> float:
    """The Jensen-Shannon divergence in nats: the mean of KL(p || m) and KL(q || m), m = (p + q) / 2."""
    def kl(a, m):
        return sum(float(x) * math.log(float(x) / float(y)) for x, y in zip(a, m) if x > 0)
    m = [(a + b) / 2 for a, b in zip(p, q)]
    return (kl(p, m) + kl(q, m)) / 2


def exact_relaxed_acceptance(p, q, topk=RELAXED_TOPK, delta=RELAXED_DELTA):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    top = sorted(range(len(p)), key=lambda i: (-p[i], i))[:topk]
    for x, q_x in enumerate(greedy_draft(q)):  # the MTP head proposes its arg-max
        if q_x == 0:
            continue
        accept = Fraction(int(x in top and p[x] >= max(p) - delta))  # LOSSY RULE: within delta of the best
        out[x] += q_x * accept
        out[arg_max(p)] += q_x * (1 - accept)  # after a rejection, the target's arg-max
    return out


def exact_typical_acceptance_entropy(p, q, threshold=TYPICAL_THRESHOLD, alpha=TYPICAL_ALPHA):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    bar = min(float(threshold), float(alpha) * math.exp(-entropy(p)))  # LOSSY RULE: min(eps, a exp(-H(p)))
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        accept = Fraction(int(float(p[x]) > bar))  # keep any draft the target finds likely enough
        out[x] += q_x * accept
        out[arg_max(p)] += q_x * (1 - accept)  # after a rejection, the target's arg-max
    return out


def exact_sglang_thresholds(p, q, threshold_single=SGLANG_THRESHOLD, threshold_acc=SGLANG_THRESHOLD):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    q = greedy_draft(q)  # the chain's draft is the draft model's top-1
    r = normalized_residual(p, q)
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        accept = 1 if p[x] >= threshold_single else min(1, p[x] / threshold_acc)  # LOSSY RULE below 1
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_fly(p, q, window=FLY_WINDOW, entropy_threshold=FLY_ENTROPY):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    q = greedy_draft(q)  # vLLM's drafts come without draft probabilities: q one-hot
    r = normalized_residual(p, q)
    for x, q_x in enumerate(q):
        if q_x == 0:
            continue
        accept = min(1, p[x] / q_x)
        if p[x] > 0 and top3_entropy(p) >= entropy_threshold:  # LOSSY RULE: a rejected draft is kept when
            accept += (1 - accept) * p[x] ** window  # the next `window` drafts pass (same pair at each)
        out[x] += q_x * accept
        for y, r_y in enumerate(r):
            out[y] += q_x * (1 - accept) * r_y
    return out


def exact_fuzzy(p, q, threshold=FUZZY_THRESHOLD):
    p, q = validate_pair(p, q)
    out = [Fraction(0)] * (len(p) + 1)
    close = js_divergence(p, q) <= threshold  # LOSSY RULE: the models agree closely enough ...
    for x, q_x in enumerate(greedy_draft(q)):  # ... so the greedy draft is kept outright
        if q_x == 0:
            continue
        accept = Fraction(int(close))
        out[x] += q_x * accept
        for y, r_y in enumerate(p):  # otherwise a token is drawn from p
            out[y] += q_x * (1 - accept) * r_y
    return out
