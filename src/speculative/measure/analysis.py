"""Analysis: a benchmark record's summary rows, recomputed from its raw observations.

Explained in: notebooks/07_cost_model (predictions, prices) and notebooks/08_decoding_demo (speedups).

The benchmarks (``speculative.measure.bench_<kind>``) measure and keep raw observations
(:mod:`speculative.measure.records` says what a record holds); :func:`analyse` turns a record into its summary
rows, each built as its kind's row type (:mod:`speculative.measure.rows`) by that kind's module
(``analysis_<kind>``), and sets the runs of a record of several runs side by side. Nothing here times, draws
or touches a model, so any record can be re-analysed, and every figure the CLI, the chapters and the tests show
has this one source.
"""

from __future__ import annotations

import statistics

from speculative.measure.analysis_agreement import agreement_rows
from speculative.measure.analysis_decode import decode_rows
from speculative.measure.analysis_drafts import drafts_rows
from speculative.measure.analysis_peer import peer_rows
from speculative.measure.analysis_prices import prices_rows
from speculative.measure.analysis_sampler import sampler_rows
from speculative.measure.analysis_syncs import syncs_rows
from speculative.measure.lookup import each_run
from speculative.measure.records import KINDS
from speculative.measure.rows import row_dict

__all__ = ["analyse", "CONFIGURATION", "RUN_FIGURES"]

#: the rows of each kind of record (its ``benchmark``), from its observations
ROWS = {"sampler": sampler_rows, "decode": decode_rows, "peer": peer_rows, "syncs": syncs_rows, "drafts": drafts_rows,
        "prices": prices_rows, "agreement": agreement_rows}
#: the fields that name a configuration in a summary row (the rest are its figures)
CONFIGURATION = ("draft", "batch", "temperature", "gamma", "rule", "drafts", "k", "vocab", "policy", "hf_schedule")
#: the headline figures whose spread over independent runs a record of several runs summarises: a decode
#: row's speedup; a race's (bench peer) speed over transformers' assisted generation and over plain decoding
RUN_FIGURES = ("speedup", "ours_over_hf_assisted", "ours_speedup")


def analyse(record: dict) -> list[dict]:
    """Return the summary rows (a record's ``results``) recomputed from its observations, as the dicts a
    record holds (:func:`speculative.measure.rows.row_dict`)."""
    if record.get("benchmark") not in ROWS:
        raise ValueError(f"unknown benchmark {record.get('benchmark')!r}: expected one of {', '.join(ROWS)}")
    if "runs" in record:  # several independent runs: each analysed alone, then set side by side
        return _across_runs(record["benchmark"], [analyse(run) for run in each_run(record)])
    if "observations" not in record:
        raise ValueError("the record keeps no observations (schema 1): it cannot be re-analysed")
    return [row_dict(row) for row in ROWS[record["benchmark"]](record)]


def _across_runs(benchmark: str, per_run: list[list[dict]]) -> list[dict]:
    """One row per configuration (its kind's ``runs_row``, :data:`speculative.measure.records.KINDS`): each
    run's row under ``runs``, and for each of :data:`RUN_FIGURES` the rows hold, its value in each run
    (``<figure>_runs``), their range and median (the drift between runs, which no within-run interval covers)."""
    runs_row = KINDS[benchmark].runs_row
    if runs_row is None:
        raise ValueError(f"a {benchmark} record is never made of several runs")
    rows = []
    for same in zip(*per_run, strict=True):
        row = {**{k: same[0][k] for k in CONFIGURATION if k in same[0]}, "runs": list(same)}
        for figure in RUN_FIGURES:
            if figure in same[0]:
                values = [r[figure] for r in same]
                row.update({f"{figure}_runs": values, f"{figure}_range": [min(values), max(values)],
                            f"{figure}_median_run": statistics.median(values)})
        rows.append(row_dict(runs_row(**row)))
    return rows
