"""Lookup: finding a record's summary rows by their fields, and reading a record of several runs one run at a
time. Pure: these read records, and compute nothing.
"""

from __future__ import annotations

__all__ = ["rows_where", "row_where", "each_run", "split_runs"]


def rows_where(record: dict, **fields) -> list[dict]:
    """Return a record's summary rows whose ``fields`` all have the given values (a missing ``rule`` reads
    as "token" and a missing ``drafts`` as 1, as in records written before they were kept)."""
    implied = {"rule": "token", "drafts": 1}
    return [r for r in record["results"] if all(r.get(k, implied.get(k)) == v for k, v in fields.items())]


def row_where(record: dict, **fields) -> dict:
    """Return the one summary row with the given ``fields``; a ValueError says when none or several match."""
    found = rows_where(record, **fields)
    if len(found) != 1:
        shown = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        raise ValueError(f"{len(found)} rows of the {record.get('benchmark', '?')} record have {shown}; expected one")
    return found[0]


def each_run(record: dict) -> list[dict]:
    """A record of several runs as one record per run: the shared fields with that run's own (no summary)."""
    shared = {k: v for k, v in record.items() if k not in ("runs", "results")}
    return [{**shared, **run} for run in record["runs"]]


def split_runs(record: dict) -> list[dict]:
    """Return a record of several runs (a top-level ``runs`` list) as one record per run, each read as a
    record of one run reads: its own environment, observations and summary rows, and ``file`` named
    "<file> run <i>". A record of one run comes back alone, as it is."""
    if "runs" not in record:
        return [record]
    out = []
    for i, run in enumerate(each_run(record)):
        run["results"] = [row["runs"][i] for row in record["results"]]
        if "file" in record:
            run["file"] = f"{record['file']} run {i + 1}"
        out.append(run)
    return out
