"""Audit any verification rule against exact laws, with stated error rates.

Explained in: notebooks/09_audit.

:func:`audit_sampler` runs a battery of cases (:mod:`battery`). Each case is a target and a draft given as
exact tables (a distribution for every context), so the law of what a correct rule emits is known exactly
(:mod:`exact`). The audit draws the drafts itself, hands the sampler the probabilities, collects what it
emits, and tests the counts against that law with a chi-square test (:mod:`stats`); it returns an
:class:`report.AuditReport`. What is tested:

- ``block`` cases (small vocabularies, 1 to 4 drafted tokens, context-dependent tables): the law of the
  whole emitted block, a tuple of 1 to k+1 tokens;
- ``first`` cases (one drafted token, any vocabulary): the joint law of the emitted token and whether
  the draft was accepted: P(x, accepted) = min(p, q)(x), P(x, rejected) = max(p - q, 0)(x).

Error rates. The battery's family-wise false-alarm rate is ``family_false_alarm`` (1e-6 by default),
split equally over the cases (Bonferroni), so a correct sampler fails an audit with about that
probability. Each case's sample size comes from :func:`stats.samples_needed` for the case's stated total
variation distance at power 0.99, up to a cap (:data:`MAX_ROWS`); the report prints the distance the
sample actually detects.

Hard failures end a case at once and are reported with the input that caused them: an exception, a
result of the wrong shape, an id outside the vocabulary, or an emitted outcome the exact law gives
probability 0 (a NaN turned into a token, a token with p = 0). Where the sampler's randomness can be set
(the library's ``randomness=``, or the global RNG the ``"hf"`` adapter feeds), cases marked ``edges`` are
also run with every uniform at 0 and at the largest float below 1, so that a failure random draws would
hit once in millions of calls is found in one.

Conventions. ``"probs"`` is :func:`sampler.rejection_sample`'s: ``fn(draft_tokens (B, k), draft_probs
(B, k, V), target_probs (B, k+1, V), generator)`` returning an object with ``.tokens`` or a ``(B, k+1)``
tensor padded with -1. ``"hf"`` is Hugging Face transformers' ``_speculative_sampling(candidate_input_ids,
candidate_logits, candidate_length, new_logits)``: logits in, one row at a time, the global torch RNG.
``"pitfall"`` is :mod:`pitfalls`' one-step form ``fn(p, q, n, generator)``, which draws the draft itself
(only one-draft, context-free cases apply). Another convention is one adapter: a function that takes
``(fn, draft_tokens, draft_probs, target_probs, generator, edge)`` and returns the ``(B, k+1)`` padded
tokens; pass it as ``convention=``.
"""

from __future__ import annotations

import contextlib
import time
from fractions import Fraction
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from speculative.audit.battery import AuditCase, default_battery
from speculative.audit.report import AuditReport, CaseResult, _readable
from speculative.exact import exact
from speculative.exact.rule import accepted_mass, residual
from speculative.sampling import stats

__all__ = ["audit_sampler", "assert_lossless", "pitfall_power", "pitfall_sampler", "CONVENTIONS", "RULE_LAWS",
           "EDGE_UNIFORMS", "EDGE_ROWS", "MAX_ROWS"]

#: The uniforms an edge run fixes every draw to: 0, and the largest float32 below 1 (1 - 2^-24).
EDGE_UNIFORMS = (0.0, float(np.nextafter(np.float32(1), np.float32(0))))
_EDGE_NAMES = {EDGE_UNIFORMS[0]: "0", EDGE_UNIFORMS[1]: "1 − 2⁻²⁴"}
#: The default cap on each case's sample, per convention: Hugging Face's function takes one row per call.
MAX_ROWS = {"probs": 200_000, "pitfall": 200_000, "hf": 20_000}
#: Rows per edge run.
EDGE_ROWS = 64
#: The mass a "first" case gives a rejected token whose exact residual is 0 but whose p is not.
ROUNDING_MASS = 1e-15


# --------------------------------------------------------------------------- laws and inputs


#: The exact law of one block under each verification rule the audit knows.
RULE_LAWS = {"token": exact.speculative_block_law, "block": exact.block_verification_law}


def _law(case: AuditCase, rule: str = "token") -> dict[tuple, float]:
    """The exact law of the outcome the case tests, as {outcome: probability}. With one draft the two
    rules coincide, so ``first`` cases do not depend on ``rule``."""
    if case.law == "block":
        law = RULE_LAWS[rule](case.target, case.draft, (), case.gamma)
        return {key: float(v) for key, v in law.items()}
    if case.gamma != 1:
        raise ValueError(f"{case.name}: a 'first' case has one draft")
    # the rule's own parts (rule.py), in floats: a table left unnormalised by rounding is not exact
    p, q = [float(v) for v in case.target(())], [float(v) for v in case.draft(())]
    accepted, owed = accepted_mass(p, q), residual(p, q)
    law = {}
    for token in range(case.vocab):
        if accepted[token] > 0:
            law[(token, True)] = accepted[token]
        if p[token] > 0:
            # after a rejection the residual decides; where it is 0 only float rounding can put mass, so the
            # cell gets a negligible mass instead of none: emitting it is a deviation for the chi-square
            # test to weigh, not an impossibility (a token with p = 0 stays impossible)
            law[(token, False)] = max(owed[token], ROUNDING_MASS)
    total = sum(law.values())
    return {key: value / total for key, value in law.items()}


def _outcome(case: AuditCase, row: Sequence[int]) -> tuple:
    emitted = [int(t) for t in row if int(t) >= 0]
    if case.law == "block":
        return tuple(emitted)
    return (emitted[0], len(emitted) == 2) if emitted else ()


def _draw_inputs(case: AuditCase, n: int, generator: torch.Generator):
    """Draft n blocks from the draft table (each draft given the ones before it) and look up p and q."""
    k, vocab = case.gamma, case.vocab
    if case.context_free:  # one distribution for every context: no lookups
        p, q = case.probs(case.target, ()), case.probs(case.draft, ())
        drafts = torch.multinomial(q.double(), n * k, replacement=True, generator=generator).reshape(n, k)
        return drafts, q.expand(n, k, vocab).contiguous(), p.expand(n, k + 1, vocab).contiguous()
    drafts = torch.zeros(n, k, dtype=torch.long)
    draft_probs = torch.zeros(n, k, vocab, dtype=case.dtype)
    target_probs = torch.zeros(n, k + 1, vocab, dtype=case.dtype)
    prefixes = [()] * n
    for i in range(k + 1):
        groups: dict[tuple, list[int]] = {}
        for row, prefix in enumerate(prefixes):
            groups.setdefault(prefix, []).append(row)
        for prefix, rows in groups.items():
            index = torch.tensor(rows)
            target_probs[index, i] = case.probs(case.target, prefix)
            if i < k:
                q = case.probs(case.draft, prefix)
                draft_probs[index, i] = q
                drafts[index, i] = torch.multinomial(q.double(), len(rows), replacement=True, generator=generator)
        if i < k:
            prefixes = [prefix + (int(drafts[row, i]),) for row, prefix in enumerate(prefixes)]
    return drafts, draft_probs, target_probs


# --------------------------------------------------------------------------- conventions


def _as_tokens(result, batch: int, k: int) -> torch.Tensor:
    tokens = getattr(result, "tokens", result)
    if isinstance(tokens, (tuple, list)) and tokens and isinstance(tokens[0], torch.Tensor):
        tokens = tokens[0]
    tokens = torch.as_tensor(tokens)
    if tuple(tokens.shape) != (batch, k + 1):
        raise ValueError(f"returned tokens of shape {tuple(tokens.shape)}, expected ({batch}, {k + 1})")
    return tokens.long().cpu()


def _probs_convention(fn, drafts, draft_probs, target_probs, generator, edge):
    batch, k = drafts.shape
    if edge is None:
        return _as_tokens(fn(drafts, draft_probs, target_probs, generator), batch, k)
    from speculative.sampling.sampler import Randomness

    uniforms = torch.full((batch, k + 1), edge, dtype=torch.float64)
    return _as_tokens(fn(drafts, draft_probs, target_probs, generator, randomness=Randomness(uniforms)), batch, k)


@contextlib.contextmanager
def _global_rng(edge: Optional[float]):
    """Feed the global torch RNG: unchanged, or every ``torch.rand_like`` draw fixed at ``edge``."""
    if edge is None:
        yield
        return
    original = torch.rand_like
    torch.rand_like = lambda tensor, *args, **kwargs: torch.full_like(tensor, edge, *args, **kwargs)
    try:
        yield
    finally:
        torch.rand_like = original


def _hf_convention(fn, drafts, draft_probs, target_probs, generator, edge):
    """Call Hugging Face's ``_speculative_sampling`` row by row, as assisted generation does (batch 1)."""
    import inspect

    batch, k = drafts.shape
    out = torch.full((batch, k + 1), -1, dtype=torch.long)
    # transformers 4.x takes is_done_candidate as a fifth argument; 5.x dropped it
    extra = {"is_done_candidate": False} if "is_done_candidate" in inspect.signature(fn).parameters else {}
    torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))  # its randomness: the global RNG
    draft_logits, target_logits = draft_probs.log(), target_probs.log()  # softmax(log p) = p; log 0 = -inf
    with _global_rng(edge):
        for row in range(batch):
            valid, _ = fn(drafts[row:row + 1], draft_logits[row:row + 1], k, target_logits[row:row + 1], **extra)
            valid = valid.reshape(-1)
            if valid.numel() > k + 1:
                raise ValueError(f"returned {valid.numel()} tokens for {k} drafts")
            out[row, :valid.numel()] = valid
    return out


def _pitfall_convention(fn, drafts, draft_probs, target_probs, generator, edge):
    """One-step samplers ``fn(p, q, n, generator)`` that draw the draft themselves (the pitfall gallery)."""
    batch = drafts.shape[0]
    tokens = torch.as_tensor(fn(target_probs[0, 0].double(), draft_probs[0, 0].double(), batch, generator)).long()
    if tuple(tokens.shape) != (batch,):
        raise ValueError(f"returned shape {tuple(tokens.shape)}, expected ({batch},)")
    return torch.stack([tokens, torch.full_like(tokens, -1)], 1)


CONVENTIONS = {"probs": _probs_convention, "hf": _hf_convention, "pitfall": _pitfall_convention}


# --------------------------------------------------------------------------- the audit


def _applies(case: AuditCase, convention) -> Optional[str]:
    if convention == "pitfall" and not (case.context_free and case.gamma == 1):
        return "the one-step convention has no drafted blocks"
    return None


def _sample_size(probs: Sequence[float], case: AuditCase, per_case: float, max_rows: int) -> int:
    """The samples the case needs to detect its stated TV at power 0.99 (the pooled cells depend on n)."""
    n = 2000
    for _ in range(3):
        n = min(stats.samples_needed(stats.pooled(probs, n), tv=case.tv, false_alarm=per_case), max_rows)
    return n


def _run_case(fn, adapter, case: AuditCase, per_case: float, max_rows: int, seed: int, can_edge: bool,
              convention: str, rule: str = "token") -> CaseResult:
    began = time.perf_counter()
    law = _law(case, rule)
    outcomes = list(law)
    probs = [law[o] for o in outcomes] + [0.0]  # the last cell: anything the exact law rules out
    n = _sample_size(probs, case, per_case, max_rows)
    if convention == "pitfall":  # it ignores the draws, only the law of its output token is tested
        outcomes = list(range(case.vocab))
        probs = [float(v) for v in case.target(())] + [0.0]
    index = {o: i for i, o in enumerate(outcomes)}
    generator = torch.Generator().manual_seed(seed)
    counts = np.zeros(len(probs), dtype=np.int64)
    chunk = min(n, max(256, 4_000_000 // (case.vocab * (case.gamma + 1))))
    done = 0
    while done < n:
        size = min(chunk, n - done)
        inputs = _draw_inputs(case, size, generator)
        try:
            tokens = adapter(fn, *inputs, generator, None)
        except Exception as error:  # noqa: BLE001 - any crash is a finding
            return CaseResult(case.name, done, None, None, False, f"raised {type(error).__name__}: "
                              f"{str(error).splitlines()[0][:120]}", time.perf_counter() - began)
        if ((tokens < -1) | (tokens >= case.vocab)).any():
            bad = int(((tokens < -1) | (tokens >= case.vocab)).any(1).nonzero()[0])
            return CaseResult(case.name, done, None, None, False, f"emitted id {tokens[bad].tolist()} outside "
                              f"0..{case.vocab - 1} for drafts {inputs[0][bad].tolist()}", time.perf_counter() - began)
        for row, emitted in enumerate(tokens.tolist()):
            key = emitted[0] if convention == "pitfall" else _outcome(case, emitted)
            cell = index.get(key)
            if cell is None:
                return CaseResult(case.name, done + row, None, None, False,
                                  f"emitted {emitted} (drafts {inputs[0][row].tolist()}), "
                                  "which the exact law rules out",
                                  time.perf_counter() - began)
            counts[cell] += 1
        done += size
    if probs[-1] == 0 and counts[-1] == 0:
        counts, probs = counts[:-1], probs[:-1]
    fit = stats.goodness_of_fit(counts, probs)
    detail = ""
    passed = fit.p_value >= per_case
    if passed and case.edges and can_edge:
        for edge in EDGE_UNIFORMS:
            inputs = _draw_inputs(case, EDGE_ROWS, generator)
            if case.context_free:  # draft every token q can draft, in turn, so each path is driven
                support = (case.probs(case.draft, ()) > 0).nonzero().reshape(-1)
                inputs[0][:, 0] = support[torch.arange(EDGE_ROWS) % support.numel()]
            try:
                tokens = adapter(fn, *inputs, generator, edge)
            except Exception as error:  # noqa: BLE001
                passed = False
                detail = (f"with every uniform at {_EDGE_NAMES[edge]} it raised {type(error).__name__}: "
                          f"{str(error).splitlines()[0][:120]}")
                break
            bad = [row for row, emitted in enumerate(tokens.tolist()) if _outcome(case, emitted) not in index]
            if bad:
                passed = False
                detail = (f"with every uniform at {_EDGE_NAMES[edge]} it emitted {tokens[bad[0]].tolist()} for "
                          f"drafts {inputs[0][bad[0]].tolist()}, which the exact law rules out")
                break
        else:
            detail = "edges (every uniform at 0, then at 1 − 2⁻²⁴) passed"
    elif not passed:
        detail = f"law rejected (p < {_readable(per_case)})"
    tv = stats.detectable_tv(n, stats.pooled(probs, n), false_alarm=per_case)
    return CaseResult(case.name, n, fit.p_value, tv, passed, detail, time.perf_counter() - began)


def _edges_supported(fn, convention) -> bool:
    if convention == "hf":
        return True
    if convention != "probs":
        return False
    import inspect

    try:
        return "randomness" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


@contextlib.contextmanager
def _in_scratch(cases, progress: bool, label: str):
    """Yield the cases to run (with a progress bar if asked) inside a scratch folder that is deleted
    afterwards, so a relative write by the audited code cannot land in the caller's folder (an absolute
    path still can: the audit does not sandbox the code it calls)."""
    import tempfile

    iterator = cases
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(cases, desc=label, unit="case")
    with tempfile.TemporaryDirectory(prefix="speculative-audit-") as scratch, contextlib.chdir(scratch):
        yield iterator


def audit_sampler(fn: Callable, *, convention="probs", cases: Optional[list[AuditCase]] = None,
                  family_false_alarm: float = stats.FALSE_ALARM_RATE, max_rows: Optional[int] = None,
                  seed: int = 0, name: Optional[str] = None, progress: bool = False,
                  rule: str = "token") -> AuditReport:
    """Audit the verification rule ``fn`` (see the module docstring) and return the report.

    ``convention`` is ``"probs"``, ``"hf"``, ``"pitfall"`` or an adapter function. ``max_rows`` caps each
    case's sample (default 200,000; 20,000 for ``"hf"``, whose function takes one row per call, so that its
    audit stays near a minute on 2 CPU cores; the report shows the TV each sample detects). ``rule`` is
    the verification rule ``fn`` claims to implement, which fixes the exact law of a whole block:
    ``"token"`` (token-wise, the default) or ``"block"`` (block verification, Sun et al.).
    Raises ``TypeError`` when ``fn`` is not callable and ``ValueError`` for an unknown convention or rule.
    """
    if rule not in RULE_LAWS:
        raise ValueError(f"unknown rule {rule!r}; known: {', '.join(RULE_LAWS)}")
    if not callable(fn):
        raise TypeError(f"the sampler must be callable, got {type(fn).__name__}")
    adapter = CONVENTIONS.get(convention) if isinstance(convention, str) else convention
    if adapter is None or not callable(adapter):
        raise ValueError(f"unknown convention {convention!r}; known: {', '.join(CONVENTIONS)} or an adapter function")
    label = convention if isinstance(convention, str) else getattr(convention, "__name__", "custom")
    if max_rows is None:
        max_rows = MAX_ROWS.get(label, MAX_ROWS["probs"])
    cases = default_battery() if cases is None else cases
    chosen = [c for c in cases if _applies(c, label) is None]
    if not chosen:
        raise ValueError(f"no case of the battery applies to the {label!r} convention")
    report = AuditReport(name or getattr(fn, "__qualname__", repr(fn)), label, family_false_alarm)
    per_case = family_false_alarm / len(chosen)
    can_edge = _edges_supported(fn, label)
    began = time.perf_counter()
    with _in_scratch(chosen, progress, "audit") as iterator:
        for number, case in enumerate(iterator):
            report.results.append(_run_case(fn, adapter, case, per_case, max_rows, seed + number, can_edge,
                                            label, rule))
    report.seconds = time.perf_counter() - began
    return report


def pitfall_power(pitfall, cases: Optional[list[AuditCase]] = None, family_false_alarm: float =
                  stats.FALSE_ALARM_RATE, max_rows: Optional[int] = None, max_vocab: int = 64) -> dict[str, float]:
    """Return the probability that the battery (run with the ``"pitfall"`` convention) rejects ``pitfall``'s
    sampler, per case and over all of them (key ``"battery"``), from the pitfall's exact law.

    ``max_rows`` caps each case's sample as in :func:`audit_sampler` (default ``MAX_ROWS["pitfall"]``).

    Only cases with a vocabulary up to ``max_vocab`` are counted (exact laws over larger ones are slow),
    so the battery's figure is a lower bound. Cases are independent, so the battery misses a wrong rule
    only if every case misses it.
    """
    cases = default_battery() if cases is None else cases
    max_rows = MAX_ROWS["pitfall"] if max_rows is None else max_rows
    chosen = [c for c in cases if _applies(c, "pitfall") is None]
    per_case = family_false_alarm / len(chosen)
    out, miss = {}, 1.0
    for case in chosen:
        if case.vocab > max_vocab:
            continue
        p, q = [Fraction(v) for v in case.target(())], [Fraction(v) for v in case.draft(())]
        p, q = [v / sum(p) for v in p], [v / sum(q) for v in q]  # exact laws need rows that sum to 1
        law = _law(case)
        n = _sample_size([law[o] for o in law] + [0.0], case, per_case, max_rows)
        wrong = pitfall.exact(p, q, **pitfall.options)
        out[case.name] = stats.power(n, [float(v) for v in p] + [0.0], [float(v) for v in wrong], per_case)
        miss *= 1 - out[case.name]
    out["battery"] = 1 - miss
    return out


def pitfall_sampler(pitfall) -> Callable:
    """Return ``pitfall``'s one-step sampler with its demo options (for the ``"pitfall"`` convention)."""
    import functools

    options = {key: float(v) if isinstance(v, Fraction) else v for key, v in pitfall.options.items()}
    return functools.partial(pitfall.sample, **options)


def assert_lossless(fn: Callable, **options) -> AuditReport:
    """Audit ``fn`` and raise ``AssertionError`` with the report's table when any case fails.

    For a team's own CI, e.g. in a pytest file::

        from speculative.audit.core import assert_lossless
        from my_engine import verify  # verify(draft_tokens, draft_probs, target_probs, generator)

        def test_verify_is_lossless():
            assert_lossless(verify)

    A correct rule fails this with probability about ``family_false_alarm`` (1e-6 by default; the p-values
    rest on the chi-square approximation).
    """
    report = audit_sampler(fn, **options)
    if not report.passed:
        raise AssertionError("the sampler is not lossless on every case:\n" + report.table())
    return report
