"""Audit any verification rule against exact laws, with stated error rates.

Explained in: notebooks/09_audit.

:func:`audit_sampler` runs a battery of cases. Each case is a target and a draft given as exact tables
(a distribution for every context), so the law of what a correct rule emits is known exactly
(:mod:`exact`). The audit draws the drafts itself, hands the sampler the probabilities, collects what it
emits, and tests the counts against that law with a chi-square test (:mod:`stats`). What is tested:

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
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from speculative.exact import exact
from speculative.exact.rule import accepted_mass, residual
from speculative.sampling import stats
from speculative.sampling.transforms import SamplingConfig, logits_to_probs

__all__ = ["AuditCase", "CaseResult", "AuditReport", "default_battery", "select_cases", "audit_sampler",
           "assert_lossless", "pitfall_power", "pitfall_sampler", "CONVENTIONS", "RULE_LAWS", "EDGE_UNIFORMS",
           "EDGE_ROWS", "MAX_ROWS", "EngineReport", "audit_engine", "assert_engine_lossless", "engine_power",
           "ENGINE_MAX_ROWS", "ENGINE_TIME_LIMIT", "audit_gallery"]

#: The uniforms an edge run fixes every draw to: 0, and the largest float32 below 1 (1 - 2^-24).
EDGE_UNIFORMS = (0.0, float(np.nextafter(np.float32(1), np.float32(0))))
_EDGE_NAMES = {EDGE_UNIFORMS[0]: "0", EDGE_UNIFORMS[1]: "1 − 2⁻²⁴"}
#: The default cap on each case's sample, per convention: Hugging Face's function takes one row per call.
MAX_ROWS = {"probs": 200_000, "pitfall": 200_000, "hf": 20_000}
#: Rows per edge run.
EDGE_ROWS = 64
#: The mass a "first" case gives a rejected token whose exact residual is 0 but whose p is not.
ROUNDING_MASS = 1e-15


@dataclass
class AuditCase:
    """One case: exact target and draft tables, how many drafts, and what to test."""

    name: str
    vocab: int
    gamma: int
    target: Callable  # context tuple -> list of Fractions (an exact distribution)
    draft: Callable
    law: str = "block"  # "block" (whole emitted tuple) or "first" (token and accepted?, one draft)
    dtype: torch.dtype = torch.float32
    tv: float = 0.05  # the total variation distance the sample size is chosen to detect
    edges: bool = False
    context_free: bool = False
    _cache: dict = field(default_factory=dict, repr=False)

    def probs(self, model: Callable, context: tuple) -> torch.Tensor:
        """The distribution as the sampler receives it: float64 values cast to this case's dtype."""
        key = (id(model), context)
        if key not in self._cache:
            self._cache[key] = torch.tensor([float(v) for v in model(context)], dtype=torch.float64).to(self.dtype)
        return self._cache[key]


@dataclass
class CaseResult:
    name: str
    n: int
    p_value: Optional[float]
    detectable_tv: Optional[float]
    passed: bool
    detail: str = ""
    seconds: float = 0.0
    counts: Optional[list] = None  # an engine case's counts on its law's cells, then outside them


@dataclass
class AuditReport:
    sampler: str
    convention: str
    family_false_alarm: float
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def table(self) -> str:
        """Return the report as a Markdown table with the overall verdict under it."""
        lines = ["| case | n | p-value | detectable TV | verdict |", "|---|---:|---:|---:|---|"]
        for r in self.results:
            p = "—" if r.p_value is None else _readable(r.p_value)
            tv = "—" if r.detectable_tv is None else f"{r.detectable_tv:.3f}"
            verdict = "pass" if r.passed else "**FAIL**"
            lines.append(f"| {r.name} | {r.n:,} | {p} | {tv} | {verdict}{': ' + r.detail if r.detail else ''} |")
        failed = sum(not r.passed for r in self.results)
        lines.append("")
        lines.append(f"{self.sampler} ({self.convention}): "
                     + ("every case passed" if not failed else f"{failed} of {len(self.results)} cases failed")
                     + f"; family-wise false-alarm rate {_readable(self.family_false_alarm)}; {self.seconds:.1f} s.")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"sampler": self.sampler, "convention": self.convention, "passed": self.passed,
                           "family_false_alarm": self.family_false_alarm, "seconds": self.seconds,
                           "results": [asdict(r) for r in self.results]}, indent=2)


def _readable(value: float) -> str:
    from speculative.measure.report import scientific

    return "0" if value == 0 else (f"{value:.3g}" if value >= 1e-3 else scientific(value).text)


# --------------------------------------------------------------------------- the battery


def _constant(probs: Sequence, normalise: bool = True) -> Callable:
    """A context-free table: ``probs`` as exact Fractions, normalised unless ``normalise=False`` (rows that
    must reach the sampler exactly as float32 rounding left them)."""
    table = [Fraction(v) for v in probs]
    total = sum(table)
    table = [v / total for v in table] if normalise else table
    return lambda context: table


def _random_pair(vocab: int, seed: int, zero_chance: float = 0.2) -> tuple[list, list]:
    rng = random.Random(seed)
    return (exact.random_rational_distribution(vocab, rng, 20, zero_chance),
            exact.random_rational_distribution(vocab, rng, 20, zero_chance))


def _float_pair(vocab: int, seed: int, config: SamplingConfig = SamplingConfig(), spread: float = 2.0):
    """A target and a draft from random logits, transformed by ``config`` (both the same way), as float32."""
    generator = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(vocab, generator=generator) * spread
    draft_logits = target_logits + torch.randn(vocab, generator=generator)
    return [logits_to_probs(logits, config) for logits in (target_logits, draft_logits)]


def _near_equal(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 rows with p <= q at every token and p < q at one: max(p - q, 0) is all zero.

    q is a softmax; p is q with one small entry lowered (p is not renormalised, as a rounding shortfall
    would leave it). The entry and the step are chosen so that the property survives the round trip the
    ``"hf"`` adapter makes (log, then the sampler's own softmax), so every convention sees a zero residual.
    """
    q = torch.softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 2, 0)

    def zero_residual(a, b):
        return bool((a <= b).all() and (a < b).any())

    for token in torch.argsort(q)[:8].tolist():
        for step in (1e-2, 3e-3, 1e-3, 3e-4, 1e-4):
            p = q.clone()
            p[token] = q[token] * (1 - step)
            seen_p, seen_q = (x.log().reshape(1, 1, -1).softmax(-1).reshape(-1) for x in (p, q))
            if zero_residual(p, q) and zero_residual(seen_p, seen_q):
                return p, q
    raise RuntimeError(f"no zero-residual pair found for seed {seed}")


def default_battery() -> list[AuditCase]:
    """Return the default cases (see the module docstring); about a minute on 2 CPU cores for a fast sampler."""
    from speculative.audit.pitfalls import SEED_P, SEED_Q

    cases = [AuditCase("three-token example", 3, 1, _constant(SEED_P), _constant(SEED_Q), law="first",
                       tv=0.02, context_free=True)]
    for vocab in (2, 8, 64):
        p, q = _random_pair(vocab, seed=vocab)
        cases.append(AuditCase(f"random pair, V = {vocab}", vocab, 1, _constant(p), _constant(q), law="first",
                               tv=0.03 if vocab < 64 else 0.05, context_free=True))
    for vocab in (1000, 32000):
        p, q = _float_pair(vocab, seed=vocab)
        cases.append(AuditCase(f"random pair, V = {vocab}", vocab, 1, _constant(p.tolist()),
                               _constant(q.tolist()), law="first", tv=0.1, context_free=True))
    p, _ = _random_pair(8, seed=11, zero_chance=0.0)
    cases.append(AuditCase("p = q exactly", 8, 1, _constant(p), _constant(p), law="first", tv=0.03,
                           edges=True, context_free=True))
    p, q = _random_pair(8, seed=12, zero_chance=0.0)
    p = [v if i % 3 else Fraction(0) for i, v in enumerate(p)]  # drafts the target gives probability 0
    cases.append(AuditCase("drafted tokens with p(x) = 0", 8, 1, _constant(p), _constant(q), law="first",
                           tv=0.03, edges=True, context_free=True))
    sharp = torch.zeros(64)
    sharp[3], sharp[5] = 12.0, 4.0
    p, q = torch.softmax(sharp, 0), torch.softmax(sharp.flip(0) * 0.5 + sharp * 0.5, 0)
    cases.append(AuditCase("near one-hot pair", 64, 1, _constant(p.tolist()), _constant(q.tolist()), law="first",
                           tv=0.03, context_free=True))
    p, q = _near_equal(64, seed=13)
    cases.append(AuditCase("equal up to rounding, zero residual", 64, 1, _constant(p.tolist(), normalise=False),
                           _constant(q.tolist(), normalise=False), law="first", tv=0.05, edges=True,
                           context_free=True))
    for gamma in (1, 2, 3, 4):
        cases.append(AuditCase(f"context-dependent tables, k = {gamma}", 4, gamma,
                               exact.RandomTableModel(4, 100 + gamma), exact.RandomTableModel(4, 200 + gamma),
                               law="block", tv=0.05))
    for dtype in (torch.float16, torch.bfloat16):
        p, q = _float_pair(64, seed=14)
        cases.append(AuditCase(f"{str(dtype).removeprefix('torch.')} inputs, V = 64", 64, 1,
                               _constant(p.to(dtype).double().tolist()), _constant(q.to(dtype).double().tolist()),
                               law="first", dtype=dtype, tv=0.05, context_free=True))
    for label, config in (("temperature 0.5", SamplingConfig(temperature=0.5)),
                          ("top-k 5", SamplingConfig(top_k=5)), ("top-p 0.8", SamplingConfig(top_p=0.8))):
        p, q = _float_pair(64, seed=15, config=config)
        cases.append(AuditCase(f"{label}, V = 64", 64, 1, _constant(p.tolist()), _constant(q.tolist()),
                               law="first", tv=0.05, context_free=True))
    return cases


def select_cases(names: Sequence[str], cases: Optional[list[AuditCase]] = None) -> list[AuditCase]:
    """Return the cases of ``cases`` (default: :func:`default_battery`) whose name contains any of ``names``
    (case-insensitive), in battery order: a smaller audit, e.g. a quick check in a team's CI or the CLI's
    ``--case``. The family-wise false-alarm rate of an audit of them is unchanged (it is split over fewer
    cases). Raises ``ValueError`` naming a text that matches no case, with the names there are.
    """
    cases = default_battery() if cases is None else cases
    if isinstance(names, str):
        names = [names]
    for name in names:
        if not any(name.lower() in case.name.lower() for case in cases):
            raise ValueError(f"no case of the battery is named like {name!r}; the cases are: "
                             + "; ".join(case.name for case in cases))
    return [case for case in cases if any(name.lower() in case.name.lower() for name in names)]


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


# --------------------------------------------------------------------------- whole engines


#: The default cap on each engine case's sample, per convention ("hf": one generate() call per row).
ENGINE_MAX_ROWS = {"models": 60_000, "hf": 3_000}
#: Seconds an engine may spend on one case before the case fails (per convention).
ENGINE_TIME_LIMIT = {"models": 120.0, "hf": 300.0}


@dataclass
class EngineReport(AuditReport):
    """An :class:`AuditReport` of a whole engine, with what each case is (k tokens, the target's entropy
    and the draft's exact acceptance rate)."""

    cases: list[dict] = field(default_factory=list)

    def table(self) -> str:
        lines = ["| case | k | entropy (bits/token) | α | n | p-value | detectable TV | verdict |",
                 "|---|---:|---:|---:|---:|---:|---:|---|"]
        for info, r in zip(self.cases, self.results):
            p = "—" if r.p_value is None else _readable(r.p_value)
            tv = "—" if r.detectable_tv is None else f"{r.detectable_tv:.3f}"
            verdict = ("pass" if r.passed else "**FAIL**") + (": " + r.detail if r.detail else "")
            lines.append(f"| {r.name} | {info['k']} | {info['entropy_bits']:.2f} | {info['acceptance']:.2f} | "
                         f"{r.n:,} | {p} | {tv} | {verdict} |")
        failed = sum(not r.passed for r in self.results)
        lines += ["", f"{self.sampler} ({self.convention}): "
                  + ("every case passed" if not failed else f"{failed} of {len(self.results)} cases failed")
                  + f"; family-wise false-alarm rate {_readable(self.family_false_alarm)}; {self.seconds:.1f} s."]
        return "\n".join(lines)

    def to_json(self) -> str:
        record = json.loads(super().to_json())
        record["cases"] = self.cases
        return json.dumps(record, indent=2)


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
    from speculative.audit.engines import check_tokens

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
    """Audit a whole speculative-decoding engine against the exact law of what it emits (:mod:`engines`).

    ``convention="models"``: ``engine(target, draft, prompt, max_new_tokens, config, generator, n)``
    returns a ``LongTensor`` ``(n, max_new_tokens)`` of n independent continuations (see
    :mod:`engines`). ``convention="hf"``: ``engine`` is a dict of transformers generation settings
    (:data:`engines.HF_CONFIGURATIONS`), run through :func:`engines.hf_engine`. ``cases`` defaults to
    :func:`engines.engine_battery` (without the repetition-penalty case).

    Error rates: the family-wise false-alarm rate is split equally over the cases (Bonferroni); each
    case's sample is the one that detects its stated TV (``case.tv``) at power 0.99, up to ``max_rows``
    (default :data:`ENGINE_MAX_ROWS`); the report gives the TV each sample detects. A case fails at once,
    with one line, when the engine raises, returns the wrong shape or dtype, emits an id outside the
    vocabulary or a sequence the exact law rules out, or runs past ``time_limit`` seconds (default
    :data:`ENGINE_TIME_LIMIT`). The engine runs in a scratch folder that is deleted afterwards.
    """
    from speculative.audit.engines import engine_battery, hf_engine

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

        from speculative.audit.core import assert_engine_lossless

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
    """Audit every engine of :data:`engines.GALLERY` on ``cases`` and, for each wrong one, estimate the
    battery's power against it: per case, from an independent sample of ``power_rows`` rows
    (:func:`engine_power`), cases taken from the lowest p-value up until the battery's power (one minus
    the product of the cases' misses; the cases are independent) reaches 0.999. Returns one dict per engine."""
    from speculative.audit.engines import GALLERY

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
