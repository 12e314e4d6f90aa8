"""Audit a whole speculative-decoding engine: run it on engine cases and test what it emits against the
exact law of the first k tokens.

Explained in: notebooks/12_audit_engine (and notebooks/13_audit_serving for serving engines).

:func:`audit_engine` runs an engine in the ``"models"`` convention (or transformers' ``generate()``, the
``"hf"`` convention) on the cases of :mod:`engine_cases`, counts the sequences it emits on the cells of
each case's exact law, and tests the counts with a chi-square test at a family-wise false-alarm rate
split over the cases; it returns an :class:`report.EngineReport`. :func:`engine_power` estimates how
often a case catches a wrong engine, :func:`audit_gallery` runs the gallery (:mod:`reference_engine`)
with those powers, and :func:`assert_engine_lossless` is the one-line check for a team's CI.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Optional

import numpy as np
import torch

from speculative.audit.core import _in_scratch, _sample_size
from speculative.audit.report import CaseResult, EngineReport, _readable
from speculative.sampling import stats

__all__ = ["audit_engine", "assert_engine_lossless", "engine_power", "audit_gallery", "ENGINE_MAX_ROWS",
           "ENGINE_TIME_LIMIT"]

#: The default cap on each engine case's sample, per convention ("hf": one generate() call per row).
ENGINE_MAX_ROWS = {"models": 60_000, "hf": 3_000}
#: Seconds an engine may spend on one case before the case fails (per convention).
ENGINE_TIME_LIMIT = {"models": 120.0, "hf": 300.0}


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise :class:`_Timeout` inside the block after ``seconds`` (a real-time alarm, main thread only;
    elsewhere the audit checks the time between calls)."""
    import signal
    import threading

    if (threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer")
            or not math.isfinite(seconds)):
        yield
        return

    def expire(signum, frame):
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _engine_counts(engine, case, n: int, seed: int, chunk: int, limit: float, began: float):
    """Run ``engine`` for n rows of ``case``; return (counts on the law's cells + one outside, rows done,
    the first failure as one line or None)."""
    from speculative.audit.engine_cases import check_tokens

    codes, _ = case.law()
    counts = np.zeros(len(codes) + 1, dtype=np.int64)
    generator = torch.Generator().manual_seed(seed)
    done = 0
    while done < n:
        size = min(chunk, n - done)
        left = limit - (time.perf_counter() - began)
        try:
            with _time_limit(left):
                result = case.run(engine, generator, size)
            tokens = check_tokens(result, size, case)
        except _Timeout:
            return counts, done, f"ran past the case's time limit of {limit:g} s"
        except ValueError as error:
            return counts, done, str(error).splitlines()[0][:160]
        except Exception as error:  # noqa: BLE001 - any crash is a finding
            return counts, done, f"raised {type(error).__name__}: {str(error).splitlines()[0][:120]}"
        rows = case.codes_of(tokens)
        where = np.searchsorted(codes, rows).clip(max=len(codes) - 1)
        inside = codes[where] == rows
        counts += np.bincount(np.where(inside, where, len(codes)), minlength=len(codes) + 1)
        done += size
        if time.perf_counter() - began > limit:
            return counts, done, f"ran past the case's time limit of {limit:g} s"
    return counts, done, None


def _run_engine_case(engine, case, per_case: float, max_rows: int, seed: int, limit: float,
                     chunk: int) -> CaseResult:
    began = time.perf_counter()
    _, law_probs = case.law()
    probs = list(law_probs) + [0.0]
    n = _sample_size(probs, case, per_case, max_rows)
    counts, done, failure = _engine_counts(engine, case, n, seed, chunk, limit, began)
    if failure is None and counts[-1]:
        failure = f"emitted {int(counts[-1])} sequence(s) that the exact law rules out"
    if failure is not None:
        return CaseResult(case.name, done, None, None, False, failure, time.perf_counter() - began,
                          counts.tolist() if done else None)
    fit = stats.goodness_of_fit(counts[:-1], probs[:-1])
    passed = fit.p_value >= per_case
    tv = stats.detectable_tv(n, stats.pooled(probs[:-1], n), false_alarm=per_case)
    detail = "" if passed else f"law rejected (p < {_readable(per_case)})"
    return CaseResult(case.name, n, fit.p_value, tv, passed, detail, time.perf_counter() - began, counts.tolist())


def audit_engine(engine, *, convention: str = "models", cases=None, family_false_alarm: float = stats.FALSE_ALARM_RATE,
                 max_rows: Optional[int] = None, seed: int = 0, name: Optional[str] = None, progress: bool = False,
                 time_limit: Optional[float] = None, chunk: Optional[int] = None) -> EngineReport:
    """Audit a whole speculative-decoding engine against the exact law of what it emits (:mod:`engine_cases`).

    ``convention="models"``: ``engine(target, draft, prompt, max_new_tokens, config, generator, n)``
    returns a ``LongTensor`` ``(n, max_new_tokens)`` of n independent continuations (see
    :mod:`engine_cases`). ``convention="hf"``: ``engine`` is a dict of transformers generation settings
    (:data:`engines.HF_CONFIGURATIONS`), run through :func:`engines.hf_engine`. ``cases`` defaults to
    :func:`engine_cases.engine_battery` (without the repetition-penalty case).

    Error rates: the family-wise false-alarm rate is split equally over the cases (Bonferroni); each
    case's sample is the one that detects its stated TV (``case.tv``) at power 0.99, up to ``max_rows``
    (default :data:`ENGINE_MAX_ROWS`); the report gives the TV each sample detects. A case fails at once,
    with one line, when the engine raises, returns the wrong shape or dtype, emits an id outside the
    vocabulary or a sequence the exact law rules out, or runs past ``time_limit`` seconds (default
    :data:`ENGINE_TIME_LIMIT`). The engine runs in a scratch folder that is deleted afterwards.
    """
    from speculative.audit.engine_cases import engine_battery
    from speculative.audit.engines import hf_engine

    if convention not in ENGINE_MAX_ROWS:
        raise ValueError(f"unknown engine convention {convention!r}; known: {', '.join(ENGINE_MAX_ROWS)}")
    if convention == "hf":
        engine = hf_engine(engine or {})
    elif not callable(engine):
        raise TypeError(f"the engine must be callable, got {type(engine).__name__}")
    cases = engine_battery() if cases is None else list(cases)
    if not cases:
        raise ValueError("no engine case to audit")
    max_rows = ENGINE_MAX_ROWS[convention] if max_rows is None else max_rows
    limit = ENGINE_TIME_LIMIT[convention] if time_limit is None else time_limit
    chunk = chunk or (250 if convention == "hf" else 20_000)
    report = EngineReport(name or getattr(engine, "__qualname__", repr(engine)), convention, family_false_alarm)
    per_case = family_false_alarm / len(cases)
    began = time.perf_counter()
    with _in_scratch(cases, progress, "audit-engine") as iterator:
        for number, case in enumerate(iterator):
            report.cases.append({"name": case.name, "k": case.length, "vocab": case.vocab,
                                 "prompt_length": len(case.prompt), "config": case.config.describe(),
                                 "entropy_bits": case.entropy_bits, "acceptance": case.acceptance,
                                 "margin": case.margin, "law": [float(v) for v in case.law()[1]]})
            report.results.append(_run_engine_case(engine, case, per_case, max_rows, seed + number, limit, chunk))
    report.seconds = time.perf_counter() - began
    return report


def engine_power(engine, case, n: int, per_case: float, rows: int, seed: int = 10_000) -> float:
    """Return the probability that a case's test at ``n`` rows rejects ``engine``, estimated from an
    independent sample of ``rows`` rows of it (:func:`stats.power_from_sample`)."""
    counts, done, failure = _engine_counts(engine, case, rows, seed, 20_000, float("inf"), time.perf_counter())
    if failure is not None and done == 0:
        raise ValueError(f"the engine cannot run on {case.name!r}: {failure}")
    _, law_probs = case.law()
    return stats.power_from_sample(n, list(law_probs) + [0.0], counts, per_case)


def assert_engine_lossless(engine, **options) -> EngineReport:
    """Audit ``engine`` (:func:`audit_engine`) and raise ``AssertionError`` with the report's table when
    any case fails. For a team's pytest::

        from speculative.audit.engine_audit import assert_engine_lossless

        def my_engine(target, draft, prompt, max_new_tokens, config, generator, n):
            ...  # n rows of my engine's speculative decoding after prompt, as a (n, max_new_tokens) tensor

        def test_my_engine_keeps_the_target_law():
            assert_engine_lossless(my_engine)

    A lawful engine fails this with probability about ``family_false_alarm`` (1e-6 by default).
    """
    report = audit_engine(engine, **options)
    if not report.passed:
        raise AssertionError("the engine does not keep the target's law on every case:\n" + report.table())
    return report


def audit_gallery(cases, entries=None, power_rows: int = 10_000, family_false_alarm: float = stats.FALSE_ALARM_RATE,
                  seed: int = 0) -> list[dict]:
    """Audit every engine of :data:`engine_gallery.GALLERY` on ``cases`` and, for each wrong one, estimate the
    battery's power against it: per case, from an independent sample of ``power_rows`` rows
    (:func:`engine_power`), cases taken from the lowest p-value up until the battery's power (one minus
    the product of the cases' misses; the cases are independent) reaches 0.999. Returns one dict per engine."""
    from speculative.audit.engine_gallery import GALLERY

    rows = []
    for entry in GALLERY if entries is None else entries:
        engine = entry.engine()
        report = audit_engine(engine, cases=cases, family_false_alarm=family_false_alarm, seed=seed)
        row = {"key": entry.key, "name": entry.name, "lawful": entry.lawful, "cite": entry.cite, "url": entry.url,
               "passed": report.passed, "failed": [r.name for r in report.results if not r.passed],
               "report": report, "power": None, "power_cases": []}
        if not entry.lawful:
            per_case, miss = family_false_alarm / len(cases), 1.0
            order = sorted(zip(report.results, cases), key=lambda pair: pair[0].p_value or 0.0)
            for result, case in order:
                power = engine_power(engine, case, result.n, per_case, power_rows)
                miss *= 1 - power
                row["power_cases"].append((case.name, power))
                if 1 - miss >= 0.999:
                    break
            row["power"] = 1 - miss
        rows.append(row)
    return rows
