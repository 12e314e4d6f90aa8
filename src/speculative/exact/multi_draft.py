"""Several drafts at one position, and draft trees: their exact laws, with ``fractions.Fraction``.

Explained in: notebooks/10_beyond_one_draft (several drafts, trees).

:func:`multi_draft_step` gives the exact law of one position verified against several candidate tokens,
under each way of drawing and judging them (:data:`SCHEMES`; the lossless ones are
:data:`LOSSLESS_SCHEMES`); :func:`tree_law` builds a whole block of a draft tree from it, and
:func:`multi_draft_table` tabulates the schemes on one pair. A toy model is :data:`exact.ToyModel`.
"""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction
from typing import Sequence

from speculative.exact.exact import ToyModel
from speculative.exact.rule import normalized_residual, total_variation, validate_distribution, validate_pair

__all__ = ["SCHEMES", "LOSSLESS_SCHEMES", "multi_draft_step", "tree_law", "multi_draft_table"]


#: How several drafts at one position are drawn and judged (see :func:`multi_draft_step`).
SCHEMES = ("with_replacement", "without_replacement", "top_k",
           "without_replacement_unadjusted", "top_k_threshold")
#: The schemes of :func:`multi_draft_step` that keep the target's law.
LOSSLESS_SCHEMES = ("with_replacement", "without_replacement", "top_k")


def _renormalised_without(probs: list, token: int) -> list:
    left = [Fraction(0) if t == token else v for t, v in enumerate(probs)]
    mass = sum(left)
    return [v / mass for v in left] if mass else left


def multi_draft_step(target_probs: Sequence, draft_probs: Sequence, drafts: int, scheme: str = "with_replacement",
                     threshold=Fraction(1)) -> dict[str, object]:
    """Return the exact law of one position verified against ``drafts`` candidate tokens.

    ``accepted[y]`` is P(candidate y is accepted), ``residual[y]`` P(every candidate is rejected and the
    final token is y); their sum is the law of the emitted token, and ``acceptance`` = sum(accepted).
    The schemes (the first three are lossless):

    - ``with_replacement``: candidates drawn i.i.d. from q, tried in turn by recursive rejection sampling
      (SpecInfer): accept x with min(1, r(x)/q(x)), else r <- norm(max(r - q, 0)); r starts at p.
    - ``without_replacement``: each candidate drawn from q renormalised over the tokens not yet tried,
      and judged against that same renormalised q in the ratio and the residual (Recursive Speculative
      Decoding; EAGLE's sampling path).
    - ``top_k``: the candidates are the ``drafts`` most likely tokens of q (ties to the lower id), a fixed
      list; one uniform u accepts the j-th when the running sum of p over the list first reaches u, and
      if none does the token is drawn from p with the list removed (SGLang's tree rule, thresholds 1).
    - ``without_replacement_unadjusted`` (wrong): drawn without replacement, judged against the plain q.
    - ``top_k_threshold`` (wrong for ``threshold`` < 1): as ``top_k``, with the running sum divided by
      ``threshold`` (SGLang's ``threshold_acc``).
    """
    p, q = validate_pair(target_probs, draft_probs)
    if isinstance(drafts, bool) or not isinstance(drafts, int) or drafts < 1:
        raise ValueError(f"drafts (candidates per position) must be an integer >= 1, got {drafts!r}")
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    vocab = len(p)
    accepted, final = [0 * v for v in p], [0 * v for v in p]
    if scheme in ("top_k", "top_k_threshold"):
        limit = Fraction(threshold) if scheme == "top_k_threshold" else Fraction(1)
        if not 0 < limit <= 1:
            raise ValueError(f"threshold must lie in (0, 1], got {threshold}")
        ranked = sorted((t for t in range(vocab) if q[t] > 0), key=lambda t: (-q[t], t))[:drafts]
        running, below = Fraction(0), Fraction(0)  # P(u <= running sum / limit), clipped to 1
        for token in ranked:
            running += p[token]
            reach = min(Fraction(1), running / limit)
            accepted[token] += reach - below
            below = reach
        rest = [Fraction(0) if t in ranked else v for t, v in enumerate(p)]
        mass = sum(rest)
        if below < 1 and mass:
            final = [(1 - below) * v / mass for v in rest]
        return {"accepted": accepted, "residual": final, "output": [a + f for a, f in zip(accepted, final)],
                "acceptance": sum(accepted)}

    def walk(tried: int, r: list, proposal: list, prob: Fraction) -> None:
        if tried == drafts or not any(proposal):
            for token, value in enumerate(r):
                final[token] += prob * value
            return
        judge = q if scheme == "without_replacement_unadjusted" else proposal
        for token, chance in enumerate(proposal):
            if chance == 0:
                continue
            accept = min(Fraction(1), r[token] / judge[token]) if judge[token] else Fraction(1)
            accepted[token] += prob * chance * accept
            if accept < 1:
                next_r = normalized_residual(r, judge)
                next_proposal = proposal if scheme == "with_replacement" else _renormalised_without(proposal, token)
                walk(tried + 1, next_r, next_proposal, prob * chance * (1 - accept))

    walk(0, list(p), list(q), Fraction(1))
    return {"accepted": accepted, "residual": final, "output": [a + f for a, f in zip(accepted, final)],
            "acceptance": sum(accepted)}


def tree_law(target: ToyModel, draft: ToyModel, context: tuple, branching: Sequence[int],
             scheme: str = "with_replacement", threshold=Fraction(1)) -> dict[tuple, Fraction]:
    """Return the exact law of one block of a draft *tree* verified from the root down.

    ``branching[d]`` is how many candidates each node at depth d gets, so ``(1,) * gamma`` is one chain
    (token-wise verification), ``(k, 1, ..., 1)`` is k independent chains sharing the root and
    ``(k,) * gamma`` a full tree. At each node the candidates are verified by :func:`multi_draft_step`
    with ``scheme``; an accepted candidate's own children are then verified against the target at the
    context it extends (its subtree was drafted from q at that context, independently of its siblings);
    if every candidate is rejected, the block ends with the node's final token; below the last level the
    target adds the bonus token.
    """
    if not branching:
        raise ValueError("branching must list the candidates per level, at least one level")
    context = tuple(context)
    law: dict[tuple, Fraction] = defaultdict(Fraction)

    def node(prefix: tuple, prob: Fraction, depth: int) -> None:
        here = context + prefix
        p = validate_distribution(target(here), f"target{here}")
        if depth == len(branching):
            for token, value in enumerate(p):
                if value:
                    law[prefix + (token,)] += prob * value
            return
        step = multi_draft_step(p, draft(here), branching[depth], scheme, threshold)
        for token, (a, f) in enumerate(zip(step["accepted"], step["residual"])):
            if a:
                node(prefix + (token,), prob * a, depth + 1)
            if f:
                law[prefix + (token,)] += prob * f

    node((), Fraction(1), 0)
    return dict(law)


def multi_draft_table(p: Sequence = (Fraction(1, 2), Fraction(3, 10), Fraction(1, 5)),
                      q: Sequence = (Fraction(1, 5), Fraction(1, 2), Fraction(3, 10)),
                      drafts: Sequence[int] = (1, 2, 3),
                      threshold=Fraction(1, 2)) -> list[dict]:
    """Return, per scheme, the exact probability that one of k candidates is accepted and the TV of the
    emitted token's law from p, for each k in ``drafts`` (by default on the three-token example)."""
    rows = []
    for scheme in SCHEMES:
        steps = [multi_draft_step(p, q, k, scheme, threshold) for k in drafts]
        rows.append({"scheme": scheme, "p": tuple(p), "q": tuple(q), "drafts": tuple(drafts),
                     "lossless": scheme in LOSSLESS_SCHEMES, "acceptance": [s["acceptance"] for s in steps],
                     "tv": [total_variation(s["output"], list(p)) for s in steps]})
    return rows
