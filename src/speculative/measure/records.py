"""Records: what a benchmark record holds, writing one atomically, and reading one back checked.

Explained in: notebooks/15_records (the recorded runs).

A record is one JSON object, of schema :data:`SCHEMA_VERSION` (a record without ``schema``, written before
observations were kept, is schema 1; nothing in it can be re-analysed, so :func:`read_record` refuses it in one
line: re-record it). The schema is this code: :data:`KINDS` says, per kind of record (its ``benchmark``), the
top-level fields it holds and the type of its summary rows (``results``), frozen dataclasses in
:mod:`speculative.measure.rows`. Every record holds ``schema``, ``benchmark``, ``what`` (one sentence: what was
measured, side by side), ``config`` (every setting the run used, so that the analysis needs nothing but the
record) and ``results`` (:func:`speculative.measure.analysis.analyse` of the rest; nothing else writes it).
A run's own fields (its ``environment``, :func:`speculative.engine.timing.environment`; its raw
``observations``; calibrations) sit at the top level, or, in a record of several independent runs
(``bench decode --runs N``), under ``runs``, one object per run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from speculative.measure.rows import (
    AgreementRow,
    DecodeRow,
    DecodeRunsRow,
    DraftsRow,
    DraftsRunsRow,
    PeerRow,
    PeerRunsRow,
    PricesRow,
    SamplerRow,
    SyncsRow,
    row_problem,
)

SCHEMA_VERSION = 2

__all__ = ["SCHEMA_VERSION", "Kind", "KINDS", "write_record", "read_record", "record_problem", "schema_of"]


@dataclass(frozen=True)
class Kind:
    """One kind of record: what writes it, its fields, and the type of its summary rows."""
    written_by: str
    #: top-level fields besides schema, benchmark, what, config and results
    fields: tuple[str, ...]
    #: a run's own fields: at the top level, or in each entry of ``runs`` in a record of several runs
    run_fields: tuple[str, ...]
    row: type
    #: the row of a record of several runs (None: this kind is never recorded over several runs)
    runs_row: Optional[type] = None


#: Every kind of record, by its ``benchmark``. Observations, one object per timed call, each naming what it ran:
#: sampler, per (batch, vocab): ``seconds``, each candidate's timed repeats. decode, per (batch, temperature,
#: decoder, repeat, group of prompts): ``decoder`` (null for plain decoding, else [gamma, rule, drafts]),
#: ``seconds`` and ``prefill_seconds``, the forwards' ``target_seconds``/``draft_seconds``, ``accepted`` per block
#: per row (-1 where a row was done), ``lengths`` (the cost-model policy), ``repeat_share``, ``timing_run`` (the
#: extra run that times the forwards; its speed unused); drafts: the same, each naming its ``draft`` (null for
#: the shared plain runs). peer, per (temperature, repeat, prompt, decoder): ``seconds``, ``blocks``,
#: ``drafted``, ``accepted``, ``tokens_sha256``. syncs, per (batch, temperature): ``blocks``, ``cuda_syncs``,
#: ``host_reads``. prices: {``target_W`` or ``draft_LxW``: seconds per round}. agreement, per (draft,
#: temperature): each held-out context's exact acceptance ``rates``.
KINDS = {
    "sampler": Kind("speculative.measure.bench_sampler.bench_sampler", (), ("environment", "observations"), SamplerRow),
    "syncs": Kind("speculative.measure.gpu_report.measure_syncs", ("pair_sha256",), ("environment", "observations"),
                  SyncsRow),
    "decode": Kind("speculative.measure.bench_decode.bench_decode", ("pair_sha256", "pair", "prompts_sha256"),
                   ("environment", "calibrations", "forward_costs", "observations"), DecodeRow, DecodeRunsRow),
    "drafts": Kind("speculative.measure.bench_drafts.bench_drafts", ("pair_sha256", "prompts_sha256", "drafts"),
                   ("environment", "calibrations", "forward_costs", "observations", "profiles"), DraftsRow,
                   DraftsRunsRow),
    "peer": Kind("speculative.measure.bench_peer.bench_peer", ("pair_sha256", "prompts_sha256"),
                 ("environment", "calibrations", "observations"), PeerRow, PeerRunsRow),
    "prices": Kind("speculative.measure.drafts.prices_record", ("target_parameters", "shapes"),
                   ("environment", "observations"), PricesRow),
    "agreement": Kind("speculative.measure.drafts.measure_agreement", ("pair_sha256", "drafts"),
                      ("environment", "observations"), AgreementRow),
}
#: the fields of every record
COMMON_FIELDS = ("schema", "benchmark", "what", "config", "results")


def _row_name(row, i: int) -> str:
    """A row named by its place and the fields that say what it measured (``results[3] (batch=1, gamma=4)``)."""
    shown = ["draft", "batch", "k", "vocab", "temperature", "gamma", "rule", "drafts", "policy", "hf_schedule", "kind",
             "width", "shape"]
    named = ", ".join(f"{k}={row[k]!r}" for k in shown if isinstance(row, dict) and k in row)
    return f"results[{i}]" + (f" ({named})" if named else "")


def record_problem(record: dict) -> Optional[str]:
    """Return what makes ``record`` not a record of this schema, in one line, or None: an unknown kind, a
    top-level field missing (in the record, or in one of its runs), or a summary row that is not of its kind's
    row type (:func:`speculative.measure.rows.row_problem`)."""
    kind = KINDS.get(record.get("benchmark"))
    if kind is None:
        return f"unknown benchmark {record.get('benchmark')!r}: expected one of {', '.join(KINDS)}"
    several = "runs" in record and kind.runs_row is not None
    missing = [k for k in COMMON_FIELDS + kind.fields + (("runs",) if several else kind.run_fields)
               if k not in record]
    if missing:
        return f"a {record['benchmark']} record lacks {', '.join(map(repr, missing))}"
    runs = record["runs"] if several else []
    if not isinstance(runs, list) or not all(isinstance(run, dict) for run in runs):
        return "its 'runs' is not a list of objects"
    for i, run in enumerate(runs):
        lacking = [k for k in kind.run_fields if k not in run]
        if lacking:
            return f"runs[{i}] lacks {', '.join(map(repr, lacking))}"
    if not isinstance(record["results"], list):
        return f"its 'results' is {type(record['results']).__name__}, not a list of rows"
    row_type = kind.runs_row if several else kind.row
    return next((p for i, row in enumerate(record["results"]) if (p := row_problem(row_type, row, _row_name(row, i)))),
                None)


def schema_of(record: dict) -> int:
    """Return a record's schema version (1 for a record written before versions were kept); a ValueError
    when the field is not a whole number."""
    version = record.get("schema", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"a record's schema must be a whole number, got {version!r}")
    return version


def write_record(record: dict, path: Optional[str]) -> Optional[Path]:
    """Write ``record`` as indented JSON to ``path`` (folders created); return the path, or None."""
    if not path:
        return None
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        partial.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
        partial.replace(out)  # atomic: a reader never sees half a record
    finally:
        partial.unlink(missing_ok=True)
    return out


def read_record(path) -> dict:
    """Return the record at ``path``, its summary rows checked against its kind's row type (:data:`KINDS`) and
    returned as the dicts they are in the file; a ValueError names, in one line, a file that is not a record of
    this schema, and what is wrong with it (:func:`record_problem`)."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no record at {path}") from None
    except (IsADirectoryError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a record file ({type(error).__name__})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(record, dict) or "benchmark" not in record:
        raise ValueError(f"{path} is not a benchmark record (no 'benchmark' field)")
    try:
        version = schema_of(record)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    if version > SCHEMA_VERSION:
        raise ValueError(f"{path} is a schema-{version} record, newer than this library's schema {SCHEMA_VERSION}: "
                         "install a newer speculative")
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path} is a schema-{version} record (this library reads schema {SCHEMA_VERSION}); "
                         f"re-record it with python -m speculative bench {record['benchmark']} and the settings "
                         "in its config")
    problem = record_problem(record)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return record
