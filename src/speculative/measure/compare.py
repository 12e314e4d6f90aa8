"""Compare: two decoders of one decode record against each other, paired over the same prompts and seeds
(two rules, two chain counts, a fixed length and a policy); and one configuration across records (the drift
between independent benchmark runs).

Explained in: notebooks/08_decoding_demo and notebooks/10_beyond_one_draft. Pure: it reads summary rows.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from speculative.measure.lookup import rows_where, split_runs
from speculative.measure.shared import ratio_interval

__all__ = ["compare_variants", "compare_rows", "across_records"]


def _variant(row: dict) -> tuple:
    return row["batch"], row["temperature"], row["gamma"], row.get("rule", "token"), row.get("drafts", 1)


def compare_variants(record: dict, baseline: tuple = ("token", 1), other: tuple = ("block", 1)) -> list[dict]:
    """Return, per (batch, T, gamma) that a decode record measured under both variants (rule, drafts),
    ``other`` against ``baseline`` on the same prompts and seeds: each one's tokens per target call
    (pooled, with a 95% bootstrap interval over groups of prompts), their ratio other / baseline (paired
    over groups: the same tokens, so it is baseline calls / other calls) and the ratio of speedups
    other / baseline (paired: baseline speculative seconds / other speculative seconds; the plain runs
    are shared)."""
    rows = {_variant(r): r for r in record["results"]}
    out = []
    for (batch, temperature, gamma, rule, k), base in rows.items():
        if (rule, k) != tuple(baseline) or (batch, temperature, gamma, *other) not in rows:
            continue
        out.append({"baseline": list(baseline), "other": list(other),
                    **compare_rows(record, base, rows[(batch, temperature, gamma, *other)])})
    return out


def compare_rows(record: dict, baseline: dict, other: dict) -> dict:
    """Return ``other`` against ``baseline``, two summary rows of one decode record at the same batch and
    temperature (two rules, two chain counts, or a fixed gamma and a policy), measured on the same prompts
    and seeds: what :func:`compare_variants` returns for each pair, keyed by the baseline's batch,
    temperature and gamma."""
    if (baseline["batch"], baseline["temperature"]) != (other["batch"], other["temperature"]):
        raise ValueError("compare_rows compares rows of one batch size and temperature")
    seed, batch = record["config"]["seed"], baseline["batch"]
    new = record["config"]["max_new_tokens"] * record["config"]["repeats"] * batch
    base_calls, alt_calls = baseline["target_calls_per_group"], other["target_calls_per_group"]
    base_seconds, alt_seconds = baseline["speculative_seconds_per_group"], other["speculative_seconds_per_group"]
    return {
        "batch": batch, "temperature": baseline["temperature"], "gamma": baseline["gamma"],
        "groups": len(base_calls),
        "baseline_tokens_per_call": baseline["tokens_per_target_forward"],
        "baseline_tokens_per_call_ci95": ratio_interval([new] * len(base_calls), base_calls, seed),
        "other_tokens_per_call": other["tokens_per_target_forward"],
        "other_tokens_per_call_ci95": ratio_interval([new] * len(alt_calls), alt_calls, seed),
        "tokens_per_call_ratio": sum(base_calls) / sum(alt_calls),
        "tokens_per_call_ratio_ci95": ratio_interval(base_calls, alt_calls, seed),
        "baseline_speedup": baseline["speedup"], "other_speedup": other["speedup"],
        "baseline_speedup_ci95": baseline["speedup_ci95"], "other_speedup_ci95": other["speedup_ci95"],
        "speedup_ratio": sum(base_seconds) / sum(alt_seconds),
        "speedup_ratio_ci95": ratio_interval(base_seconds, alt_seconds, seed),
    }


def across_records(records: Sequence[dict], figure: str = "speedup", extra: Sequence[str] = (), **fields) -> dict:
    """Return ``figure`` of the one row with ``fields`` in every record that has such a row: the runs of
    one configuration made by different benchmark runs (on other days, in other orders), so their spread
    is the drift between independent runs that no within-run interval covers.

    Only records of the same pair, the same prompt set, the same decoding settings (prompts, new tokens)
    and the same machine model (device and CPU) are compared; the first record sets them, and a record
    that differs is left out and named under ``"left_out"``. Returns ``{"runs": [{"file", "date", figure,
    figure_ci95, "host_probe_ms"}, ...], "low", "high", "median", "n"}`` (the probe None where the run kept
    none), each run with the row's ``extra`` fields too (its ``calibration``, say); a ValueError when no
    record has the row. A record of several runs counts each run (:func:`split_runs`); a race of drafts
    counts the rows of the pair's own draft (the one whose hash is the record's pair)."""
    def key(record):
        config = record["config"]
        machine = record.get("environment", {})
        return record.get("pair_sha256"), record.get("prompts_sha256"), config.get("prompts"), \
            config.get("max_new_tokens"), config.get("dtype"), machine.get("device"), machine.get("cpu")

    runs, left_out, reference = [], [], None
    for record in (run for each in records for run in split_runs(each)):
        found = rows_where(record, **fields) if isinstance(record.get("results"), list) else []
        if record.get("drafts") and "draft" not in fields:  # a race of drafts: the pair's own draft is this pair
            own = {name for name, d in record["drafts"].items() if d.get("sha256") == record.get("pair_sha256")}
            found = [row for row in found if row.get("draft") in own]
        if len(found) != 1 or figure not in found[0]:
            continue
        reference = reference or key(record)
        if key(record) != reference:
            left_out.append(record.get("file", record.get("benchmark", "?")))
            continue
        row = found[0]
        probe = record["environment"].get("host_probe") or {}
        runs.append({"file": record.get("file", "?"), "date": record["environment"].get("date_utc", "?")[:10],
                     "host_probe_ms": probe.get("softmax_ms"), figure: row[figure],
                     f"{figure}_ci95": row.get(f"{figure}_ci95"),
                     **{key: row[key] for key in extra}})
    if not runs:
        shown = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        raise ValueError(f"no record has one row with {shown} and a {figure!r}")
    values = [r[figure] for r in runs]
    return {"runs": runs, "n": len(runs), "low": min(values), "high": max(values),
            "median": statistics.median(values), "left_out": left_out}


def efficiencies_by_record(records: Sequence[dict], batch: int = 1) -> dict:
    """Return, for each decoding record (``decode`` and ``drafts``; a record of several runs is one entry,
    its runs pooled), the cost model's efficiency at ``batch`` over its fixed-length rows: ``points``,
    the median from the steps calibration (``steps``) and, where its calibration also timed whole
    decoding calls, the median from those (``calls``, else None). ``records`` as
    :func:`speculative.book.glue.load_records` gives them, one per run, named "<file> run <i>"."""
    found = {}
    for record in records:
        if record["benchmark"] not in ("decode", "drafts"):
            continue
        mine = found.setdefault(record["file"].split(" run ")[0], {"steps": [], "calls": []})
        for row in record["results"]:
            if row["batch"] == batch and row["gamma"] != "auto":
                mine["steps"].append(row["efficiency"])
                if "efficiency_decoded" in row:
                    mine["calls"].append(row["efficiency_decoded"])
    return {name: {"points": len(mine["steps"]), "steps": statistics.median(mine["steps"]),
                   "calls": statistics.median(mine["calls"]) if mine["calls"] else None}
            for name, mine in sorted(found.items()) if mine["steps"]}


def split_by_price(runs: Sequence[dict]) -> tuple[list, list]:
    """Split runs of one configuration (:func:`across_records` with ``extra=("calibration",)``) at the widest
    gap between their calibrated draft-step prices ``c``: ``(dear, cheap)``, each sorted by ``c``. A
    ValueError when fewer than two runs are given."""
    if len(runs) < 2:
        raise ValueError(f"need at least two runs to split by price, got {len(runs)}")
    by_price = sorted(runs, key=lambda run: run["calibration"]["c"])
    gaps = [b["calibration"]["c"] - a["calibration"]["c"] for a, b in zip(by_price, by_price[1:])]
    cut = 1 + gaps.index(max(gaps))
    return by_price[cut:], by_price[:cut]
