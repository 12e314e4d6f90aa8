"""Benchmark records: what one is made of, writing one atomically, and reading one back.

Explained in: notebooks/08_decoding_demo (the recorded runs).

A record is one JSON object. Its schema, version :data:`SCHEMA_VERSION`, is documented here and nowhere
else:

``schema``
    :data:`SCHEMA_VERSION`. A record without it (written before observations were kept) is schema 1.
``benchmark``
    ``"sampler"``, ``"decode"`` or ``"peer"``: which :mod:`speculative.measure.bench` function wrote it;
    ``"syncs"``: :func:`speculative.measure.gpu_report.measure_syncs`; ``"drafts"``:
    :func:`speculative.measure.bench.bench_drafts`;
    ``"prices"`` and ``"agreement"``: :func:`speculative.measure.drafts.prices_record` and
    :func:`speculative.measure.drafts.measure_agreement`.
``what``
    one sentence: what was measured, side by side.
``environment``
    :func:`speculative.engine.timing.environment`: device, accelerator, torch, threads, CPU, Python, date, and
    ``host_probe`` (:func:`speculative.engine.timing.host_probe`: a softmax's milliseconds and the first-touch
    memory rate, taken as the run ends, when the record is written, so that a slow machine can be told
    from slow code); the peer race adds transformers' version. The analysis reads none of it.
``pair_sha256``, ``pair``, ``prompts_sha256``
    (decode, peer) the model pair's checksum, its validation figures, and the prompts' checksum.
``config``
    every setting the run used (the benchmark's settings dataclass, as a dict), so that the analysis
    needs nothing but the record.
``observations``
    the raw measurements, one object per timed call, each naming what it ran:

    - sampler: one per (batch, vocab): ``batch``, ``vocab``, ``k``, and ``seconds``, a list of each
      candidate's timed repeats (``batched``, ``reference``), interleaved.
    - decode: one per (batch, temperature, decoder, repeat, group of prompts): ``decoder`` (``null`` for
      plain decoding, else ``[gamma, rule, drafts]``), ``seconds`` (the whole call), ``prefill_seconds``,
      ``target_seconds`` and ``draft_seconds`` (inside the forwards, when timed), ``timed_calls``,
      ``accepted`` (per block, per row: accepted drafts, -1 where a row was not decoding), ``lengths``
      (the cost-model policy only: per block, per row, the drafts verified), ``repeat_share`` (first
      repeat: each row's share of repeated 8-grams) and ``timing_run`` (true for the extra run on CUDA
      that times the forwards; its speed is not used).
    - peer: one per (temperature, repeat, prompt, decoder name): ``seconds``, ``blocks`` (target calls
      that emitted tokens), ``drafted``, ``accepted`` and ``tokens_sha256`` (of the emitted tokens,
      to tell whether greedy decoders agreed).
    - syncs: one per (batch, temperature): ``batch``, ``temperature``, ``gamma``, ``blocks`` (target
      calls), ``cuda_syncs`` (what ``torch.cuda.set_sync_debug_mode("warn")`` reported; null on a CPU)
      and ``host_reads`` (:func:`speculative.engine.timing.count_host_reads`).
    - drafts: as decode, each with ``draft`` (the raced draft's name; null for the shared plain runs);
      ``calibrations`` and ``forward_costs`` also carry ``draft``; the top-level ``drafts`` names each
      raced draft with its hash, shape and where it came from; ``profiles`` (per run) the raw output of
      :func:`speculative.measure.bench.profile_block` for the first draft.
    - prices: ``{entry: [seconds per round]}``, entries ``target_W`` (the target over W positions) and
      ``draft_LxW`` (a random draft of that shape over one), rounds interleaved; ``shapes`` gives each
      shape's parameters.
    - agreement: one per (draft, temperature): ``rates``, each held-out context's exact acceptance rate,
      and ``contexts_sha256``; nothing timed, so its ``environment`` has no host probe.
``calibrations``
    (decode, peer, drafts) the raw seconds of :func:`speculative.measure.bench.calibrate_steps`, each with the
    point it was taken at; in a drafts race they also hold ``plain_decoded`` and ``block_decoded_<gamma>``,
    whole decoding calls on the prompts after those raced (``config.calibration_decodes``);
    ``forward_costs`` (decode) the forwards timed alone.
``runs``
    (decode, ``bench decode --runs N``; peer, ``bench peer --runs N``) instead of ``environment``,
    ``calibrations``, ``forward_costs`` (decode) and ``observations``: a list of N independent runs of the
    same settings, made one after another, each holding those fields of its own; ``config`` adds
    ``runs``: N. Each run's summary rows are those of a record of one run; the record's rows give, per
    configuration, each run's row under ``runs``, and for each figure of
    :data:`speculative.measure.analysis.RUN_FIGURES` a row has (decode: ``speedup``; peer:
    ``ours_over_hf_assisted`` and ``ours_speedup``) ``<figure>_runs``, ``<figure>_range`` and
    ``<figure>_median_run`` over them (:func:`speculative.measure.analysis.split_runs` reads one run as a record
    of its own).
``results``
    the summary: :func:`speculative.measure.analysis.analyse` of everything above. Nothing else writes it, and
    ``tests/test_records.py`` re-analyses every committed record of this schema and gets it back.

Records of schema 1 (written before observations were kept) hold ``results`` only. Nothing in them can be
re-analysed, so :func:`read_record` (and :func:`speculative.book.glue.load_record`, which the chapters use)
refuses them with one line: re-record with the command in their ``config``. None is committed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

SCHEMA_VERSION = 2

__all__ = ["SCHEMA_VERSION", "write_record", "read_record", "schema_of"]


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
    """Return the record at ``path``; a ValueError names a file that is not a record of this schema."""
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
    return record
