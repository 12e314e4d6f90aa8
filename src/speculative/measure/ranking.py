"""Ranking drafts before racing them: each draft's predicted speedup at its best length, from its exact
acceptance rate (an agreement record) and the forwards' prices (a prices record), which no decoding run made.

Explained in: notebooks/14_which_draft. Pure: it reads the two records' summaries.
"""

from __future__ import annotations

from typing import Optional, Sequence

from speculative.measure.analysis import analyse
from speculative.measure.costs import predicted_speedup

__all__ = ["draft_ranking"]


def draft_ranking(agreement: dict, prices: dict, gammas: Optional[Sequence[int]] = None) -> list[dict]:
    """Rank each draft of an agreement record, per temperature, by the predicted speedup at its best gamma,
    from its exact alpha (the agreement record) and the forwards' prices (c of its shape and v of width
    gamma + 1, the prices record): a prediction from data no decoding run produced. The prices are the
    forwards alone; a decoding loop adds its own work per step, so a run reaches less than this. Also
    the prediction at the interval's ends of alpha.

    ``gammas`` are the lengths searched; by default every gamma >= 1 whose width gamma + 1 the prices
    record priced. A gamma whose width was not priced is refused, not skipped."""
    price = {(r["kind"], r.get("width", r.get("shape"))): r["relative"] for r in analyse(prices)}
    priced = sorted(w - 1 for kind, w in price if kind == "verification" and w >= 2)
    gammas = priced if gammas is None else list(gammas)
    if not gammas:
        raise ValueError("no gamma to rank at: the prices record priced no verification wider than one position")
    missing = [g for g in gammas if ("verification", g + 1) not in price]
    if missing:
        raise ValueError(f"gamma {missing}: the prices record priced no verification of width gamma + 1 "
                         f"(it priced widths {[g + 1 for g in priced]})")
    v = {g: price[("verification", g + 1)] for g in gammas}
    rows = []
    for row in analyse(agreement):
        shape = "{n_layer}x{d_model}".format(**agreement["drafts"][row["draft"]]["draft_config"])
        if ("draft", shape) not in price:
            raise ValueError(f"the prices record has no draft of shape {shape} (draft {row['draft']!r})")
        c = price[("draft", shape)]
        by_gamma = {g: predicted_speedup(row["alpha"], c, v, g) for g in v}
        best = max(by_gamma, key=by_gamma.get)
        low, high = (predicted_speedup(a, c, v, best) for a in row["alpha_ci95"])
        rows.append({**row, "shape": shape, "c": c, "best_gamma": best, "predicted": by_gamma[best],
                     "predicted_ci95": [low, high], "predicted_by_gamma": by_gamma})
    return sorted(rows, key=lambda r: (r["temperature"], -r["predicted"]))
