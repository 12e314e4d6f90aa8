"""The sampler audit's battery: cases given as exact tables, chosen to find the ways a rule goes wrong.

Explained in: notebooks/09_audit.

An :class:`AuditCase` is a target and a draft given as exact tables (a distribution for every context),
the number of drafts, and what the audit tests on it (:mod:`core`): ``block`` cases (small vocabularies,
1 to 4 drafted tokens, context-dependent tables) test the law of the whole emitted block; ``first``
cases (one drafted token, any vocabulary) the joint law of the emitted token and whether the draft was
accepted. :func:`default_battery` holds random pairs from V = 2 to 32,000, p = q, tokens the target
rules out, a near one-hot pair, a pair whose residual is zero only by rounding, context-dependent
tables for blocks of 1 to 4 drafted tokens, half-precision inputs and transformed (temperature, top-k,
top-p) pairs; cases marked ``edges`` are also run with every uniform at its extremes.
:func:`select_cases` picks some by name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Optional, Sequence

import torch

from speculative.exact import exact
from speculative.exact.pitfall_laws import SEED_P, SEED_Q
from speculative.sampling.transforms import SamplingConfig, logits_to_probs

__all__ = ["AuditCase", "default_battery", "select_cases"]


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
        cases.append(AuditCase(f"context-dependent tables, blocks of {gamma}", 4, gamma,
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
