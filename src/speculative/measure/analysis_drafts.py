"""Analysis of a race of drafts (``bench drafts``: a decode row per draft and point) and of which draft to
ship: the race's rows, one draft against another, each draft's best length, the race's efficiencies, a block's
profile, and the drafts' own names in a record that calls the pair's draft "shipped".

Explained in: notebooks/14_which_draft. Pure: it reads the race's timed runs, and times nothing.
"""

from __future__ import annotations

import statistics

from speculative.measure.analysis_decode import decode_rows
from speculative.measure.compare import compare_rows
from speculative.measure.lookup import row_where, rows_where, split_runs
from speculative.measure.rows import DraftsRow

__all__ = ["drafts_rows", "draft_names", "rename_drafts", "compare_drafts", "best_length", "race_efficiency",
           "block_profile"]


def drafts_rows(record: dict) -> list[DraftsRow]:
    """One decode row (:func:`decode_rows`) per draft and point: each draft's observations with the shared
    plain runs, its own calibration and forward costs; the row carries ``draft``."""
    rows = []
    for name in record["drafts"]:
        own = {**record, "benchmark": "decode",
               "calibrations": [c for c in record["calibrations"] if c["draft"] == name],
               "forward_costs": [c for c in record["forward_costs"] if c["draft"] == name],
               "observations": [o for o in record["observations"] if o["draft"] in (None, name)]}
        rows.extend(DraftsRow(draft=name, **vars(row)) for row in decode_rows(own))
    return rows


def draft_names(record: dict, pair_sha256: str, pair_info: dict) -> dict[str, str]:
    """Return {name in ``record``: the draft's own name} for a record of several drafts (``bench drafts``,
    ``bench agreement``), given the shipped pair's sha256 and pair.json. The races call the pair's own draft
    "shipped"; which draft that was depends on the pair the record was made with: the shipped pair's draft
    is named as pair.json's ``shipped_draft`` names it, and a replaced pair's draft by the candidate folder
    it was kept as. Candidates keep their names. A record of any other pair is refused in one line."""
    made_with = record.get("pair_sha256")
    if made_with == pair_sha256:
        own = (pair_info.get("shipped_draft") or {}).get("name") or "shipped"
    else:
        kept = [r.get("kept_as") for r in pair_info.get("replaced", []) if r["pair_sha256"] == made_with]
        if not kept:
            raise ValueError(f"{record.get('file', 'the record')} was made with pair {str(made_with)[:12]}, neither "
                             f"the shipped pair ({pair_sha256[:12]}) nor one it replaced")
        own = kept[0].rstrip("/").rsplit("/", 1)[-1] if kept[0] else "replaced"
    names = {name: name for name in record["drafts"]}
    names["shipped"] = own
    if len(set(names.values())) != len(names):
        raise ValueError(f"{record.get('file', 'the record')} already has a draft named {own!r}")
    return names


def rename_drafts(record: dict, names: dict[str, str]) -> dict:
    """Return a copy of ``record`` with every draft named by ``names`` (:func:`draft_names`): the keys of its
    ``drafts`` and every ``draft`` field, wherever it lies."""
    def walk(value):
        if isinstance(value, list):
            return [walk(v) for v in value]
        if not isinstance(value, dict):
            return value
        return {k: ({names.get(n, n): walk(d) for n, d in v.items()} if k == "drafts" and isinstance(v, dict)
                    else names.get(v, v) if k == "draft" and isinstance(v, str) else walk(v))
                for k, v in value.items()}
    return walk(record)


def compare_drafts(record: dict, baseline: str, other: str, **fields) -> list[dict]:
    """Return, for each run of a drafts record, ``other``'s speedup against ``baseline``'s at the point
    ``fields`` (temperature, gamma; batch 1 unless given): the ratio of the baseline's speculative decode
    seconds to the other's, summed over groups, with a 95% bootstrap interval paired over groups (same
    prompts, same seeds, same plain runs), as :func:`compare_rows` gives it."""
    fields = {"batch": 1, **fields}
    out = []
    for run in split_runs(record):
        base, alt = row_where(run, draft=baseline, **fields), row_where(run, draft=other, **fields)
        out.append(compare_rows(run, base, alt))
    return out


def block_profile(profile: dict) -> dict:
    """Return a block profile's figures (:func:`speculative.measure.calibration.profile_block`): each part's
    median seconds and its share of the parts' sum, the share of the parts outside the forwards, and, from the
    whole decoding runs, the share of decode time spent outside the forwards (median over runs, with its range)."""
    medians = {name: statistics.median(times) for name, times in profile["rounds"].items()}
    total = sum(medians.values())
    forwards = medians["draft_forwards"] + medians["target_forward"]
    outside_runs = [1 - r["forward_seconds"] / r["decode_seconds"] for r in profile["runs"]]
    return {"seconds": medians, "share": {name: t / total for name, t in medians.items()},
            "parts_outside_forwards": 1 - forwards / total,
            "runs_outside_forwards": statistics.median(outside_runs),
            "runs_outside_forwards_range": [min(outside_runs), max(outside_runs)]}


def best_length(record: dict, draft: str, temperature: float) -> dict:
    """Return, from a race of drafts (``bench drafts``), ``draft``'s row at ``temperature`` whose speedup
    over plain decoding has the largest median over the runs (``speedup_median_run``): its best fixed
    length among those raced. A ValueError names a draft or temperature the record did not race."""
    rows = rows_where(record, draft=draft, temperature=temperature)
    if not rows:
        raise ValueError(f"the record raced no draft {draft!r} at temperature {temperature:g}")
    return max(rows, key=lambda r: r["speedup_median_run"])


def race_efficiency(record: dict, key: str = "efficiency_decoded") -> dict:
    """Return a decoding record's efficiencies (``key``: ``efficiency``, from the steps calibration, or
    ``efficiency_decoded``, from whole decoded blocks) over all its rows and runs: their count, median,
    smallest and largest, and each run's own median (``run_medians``)."""
    points = [r[key] for row in record["results"] for r in row.get("runs", [row])]
    return {"points": len(points), "median": statistics.median(points), "min": min(points), "max": max(points),
            "run_medians": [statistics.median(r[key] for r in run["results"]) for run in split_runs(record)]}
