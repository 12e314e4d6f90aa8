"""Analysis of a sampler record (``bench sampler``): the batched sampler against the reference, row by row.

Explained in: notebooks/04_transforms. Pure: it reads the record's timed repeats, and times nothing.
"""

from __future__ import annotations

import statistics

from speculative.measure.rows import SamplerRow

__all__ = ["sampler_rows", "ratio_extremes"]


def sampler_rows(record: dict) -> list[SamplerRow]:
    """Per (batch, vocabulary): each candidate's median, min and max seconds over its timed repeats, and the
    drafted positions each verifies per second (batch x k per call, at its median)."""
    rows = []
    for o in record["observations"]:
        timings = {name: {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "repeats": len(ts)}
                   for name, ts in o["seconds"].items()}
        positions = o["batch"] * o["k"]
        batched, reference = (positions / timings[n]["median_s"] for n in ("batched", "reference"))
        rows.append(SamplerRow(batch=o["batch"], k=o["k"], vocab=o["vocab"], batched_positions_per_s=batched,
                               reference_positions_per_s=reference, speedup=batched / reference, timings=timings))
    return rows


def ratio_extremes(timings: dict) -> tuple[float, float]:
    """The batched sampler's speed over the reference's at their extremes over the timed repeats: the slowest
    batched run against the fastest reference run, and the fastest batched run against the slowest."""
    batched, reference = timings["batched"], timings["reference"]
    return reference["min_s"] / batched["max_s"], reference["max_s"] / batched["min_s"]
