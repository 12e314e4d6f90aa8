"""The exact laws of wrong implementations of speculative sampling, beside the right one, as Fractions.

Explained in: notebooks/05_pitfalls.

Each ``exact_*(p, q, **options)`` computes, branch by branch, the exact law of the token a one-step rule
emits: V + 1 entries, the last the probability of an *invalid* token id (out of range), which a correct
rule never emits. Each is written as a small edit of :func:`exact_correct`, so :func:`diff_from_correct`
shows exactly the lines that differ. The catalogue that pairs each law with a sampler making the same
mistake, and with the systems that shipped it, is :mod:`audit.pitfalls` (where the one law whose draft
goes through the sampling transforms, ``exact_ratio_mismatch``, also lives).
"""

from __future__ import annotations

import difflib
import inspect
from fractions import Fraction
from typing import Sequence

from speculative.exact.multi_draft import multi_draft_step
from speculative.exact.rule import normalized_residual, residual, validate_pair

__all__ = ["SEED_P", "SEED_Q", "PRUNE_THRESHOLD", "TYPICAL_EPSILON", "LENIENCE", "PEEK_THRESHOLD", "extend",
           "exact_correct", "exact_resample_from_target", "exact_greedy_draft_softmax_ratio",
           "exact_unnormalized_residual", "exact_unguarded_zero_residual", "exact_prune_reuse_formula",
           "exact_prune_fixed", "exact_stale_context", "exact_bonus_from_draft", "exact_reseed_every_draw",
           "exact_typical_acceptance", "exact_lenient_acceptance", "exact_peek_target_length",
           "PeekAtTargetLength", "exact_multi_draft", "diff_from_correct"]

SEED_P = (Fraction(1, 2), Fraction(3, 10), Fraction(1, 5))
SEED_Q = (Fraction(1, 5), Fraction(1, 2), Fraction(3, 10))
PRUNE_THRESHOLD = Fraction(1, 4)  # prune a drafted token when q(x) is below this
TYPICAL_EPSILON = Fraction(1, 4)  # "typical acceptance": keep a draft when p(x) is at least this
LENIENCE = 2  # "lenient" acceptance: min(1, LENIENCE * p / q)
PEEK_THRESHOLD = Fraction(1, 4)  # a draft-length rule that verifies a draft only when p(x) is at least this


def extend(probs: Sequence) -> list[Fraction]:
    """Return ``probs`` with one more entry, 0, for the invalid token id (for comparison with pitfall laws)."""
    return [Fraction(v) for v in probs] + [Fraction(0)]


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


def exact_multi_draft(p, q, drafts=2, scheme="with_replacement", threshold=Fraction(1)):
    """Return the exact law of the emitted token (V + 1 entries, the last 0) when ``drafts`` candidates are
    verified at one position by ``scheme`` (see :func:`multi_draft.multi_draft_step`)."""
    return list(multi_draft_step(p, q, drafts, scheme, threshold)["output"]) + [Fraction(0)]


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
