"""Analysis of a prices record (:func:`speculative.measure.drafts.prices_record`): each forward's cost relative
to the target's one-position forward, and the widths where a narrower verification costs more than a wider.

Explained in: notebooks/14_which_draft. Pure: it reads the record's timed rounds, and times nothing.
"""

from __future__ import annotations

import statistics

from speculative.measure.rows import ABSENT, PricesRow

__all__ = ["prices_rows", "price_cliffs"]


def prices_rows(record: dict) -> list[PricesRow]:
    """Per entry of a prices record: its median seconds, and its cost relative to the target's one-token
    forward (v for a target width, c for a draft shape), as the ratio of medians and its range over the
    rounds (each round's own ratio: the spread between rounds)."""
    rounds = record["observations"]
    plain = rounds["target_1"]
    rows = []
    for name, times in rounds.items():
        kind, label = name.split("_", 1)
        ratios = [t / p for t, p in zip(times, plain)]
        target = kind == "target"
        rows.append(PricesRow(kind="verification" if target else "draft", seconds=statistics.median(times),
                              relative=statistics.median(times) / statistics.median(plain),
                              relative_range=[min(ratios), max(ratios)], width=int(label) if target else ABSENT,
                              shape=ABSENT if target else label,
                              parameters=ABSENT if target else record["shapes"][label]["parameters"]))
    return rows


def price_cliffs(record: dict) -> list[dict]:
    """Return the pairs of target widths (narrow, wide) where the narrower forward costs more than the
    wider one in every round: the cliffs a cost model should know (a width-w verification checks w - 1
    drafts)."""
    rounds = record["observations"]
    widths = sorted(int(n.split("_")[1]) for n in rounds if n.startswith("target_"))
    cliffs = []
    for i, narrow in enumerate(widths):
        for wide in widths[i + 1:]:
            a, b = rounds[f"target_{narrow}"], rounds[f"target_{wide}"]
            if all(x > y for x, y in zip(a, b)):
                cliffs.append({"narrow": narrow, "wide": wide,
                               "ratio": statistics.median(a) / statistics.median(b)})
    return cliffs
