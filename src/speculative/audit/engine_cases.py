"""Engine cases: tiny models whose emitted law is known exactly, to audit whole engines end to end.

Explained in: notebooks/12_audit_engine.

:mod:`core` checks a verification *function*. An engine can be wrong outside it: in the q it hands the
rule, in a processor applied to one side only, in what its caches hold after a rejection. Only the law of
what a whole ``generate()`` call emits sees all of those. This module gives that law for small cases;
:func:`engine_audit.audit_engine` runs engines on them (this library's and transformers' in
:mod:`engines`, the gallery of planted bugs in :mod:`engine_gallery`).

- **Cases** (:class:`EngineCase`): a target and a draft, both the library's :class:`model.GPT` with a
  vocabulary of 3 to 8 and a context of 64 positions, randomly initialised with logits spread wide
  enough that the target is far from uniform; the draft is a noisy copy of the target. A case fixes a
  prompt, a :class:`transforms.SamplingConfig` (or :class:`transforms.PenalizedConfig`) and the number
  of emitted tokens k it audits. :func:`engine_battery` gives the default cases.
- **The exact law** (:meth:`EngineCase.law`) of the first k tokens, by enumeration: one batched full
  forward of the target (no cache, no sampler) per position, over every prefix of positive probability,
  with the case's processors applied. Float64 products of float32 probabilities: exact up to float
  rounding, far below what a sample can see. The same pass gives the target's entropy and the draft's
  exact acceptance rate, averaged over the positions the law visits.
- **The engine convention** (``"models"``): ``engine(target, draft, prompt, max_new_tokens, config,
  generator, n)`` returns a ``LongTensor`` ``(n, max_new_tokens)`` of n independent continuations of
  ``prompt`` (a list of ids). The models are callable without a cache (``model(tokens)`` gives logits
  ``(B, T, V)``) and with the library's cache. :func:`check_tokens` checks what an engine returns.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from speculative.engine.model import GPT, GPTConfig
from speculative.sampling.transforms import (
    PenalizedConfig,
    SamplingConfig,
    ServingConfig,
    logits_to_probs,
    min_p_margin,
    penalized_logits,
    serving_logits,
    serving_probs,
)

__all__ = ["EngineCase", "engine_battery", "cases_named", "tiny_model", "nudged_copy", "processed_probs",
           "check_tokens", "MAX_SEQUENCES", "CONTEXT"]

#: The most sequences a case's exact law may hold (beyond it, restrict the support with top-k or top-p).
MAX_SEQUENCES = 300_000
#: Positions of every case's models: an engine may draft well past the k tokens it is audited on.
CONTEXT = 64


# --------------------------------------------------------------------------- models and processors


def tiny_model(vocab: int, seed: int, spread: float = 2.0, d_model: int = 16, n_layer: int = 1) -> GPT:
    """A randomly initialised GPT (vocabulary ``vocab``, context 64) whose logits have a standard
    deviation of about ``spread``: its tied embedding is scaled until they do, over random contexts."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(GPTConfig(vocab_size=vocab, context=CONTEXT, n_layer=n_layer, n_head=2, d_model=d_model))
        probe = torch.randint(vocab, (64, 16))
    with torch.no_grad():
        for _ in range(4):  # the layer norms make the spread nearly linear in the embedding's scale
            scale = spread / float(model(probe).std())
            model.token_embedding.weight.mul_(scale)
    return model.eval()


def nudged_copy(model: GPT, noise: float, seed: int) -> GPT:
    """A copy of ``model`` with Gaussian noise of ``noise`` times each tensor's spread added to its weights."""
    out = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in out.parameters():
            if weight.numel() > 1:
                weight.add_(torch.randn(weight.shape, generator=generator) * (noise * float(weight.std())))
    return out.eval()


def _seen(tokens: torch.Tensor, lengths: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, V) bool: which tokens occur in each row's first ``lengths[b]`` tokens."""
    valid = torch.arange(tokens.shape[1], device=tokens.device) < lengths.unsqueeze(1)
    counts = torch.zeros(tokens.shape[0], vocab, dtype=torch.long, device=tokens.device)
    return counts.scatter_add_(1, torch.where(valid, tokens, 0), valid.long()) > 0


def processed_probs(logits: torch.Tensor, config: SamplingConfig, tokens: Optional[torch.Tensor] = None,
                    lengths: Optional[torch.Tensor] = None, prompt_length: int = 0) -> torch.Tensor:
    """The distribution sampled from, for next-token ``logits`` (B, V): the repetition penalty of a
    :class:`PenalizedConfig` (over each row's context, ``tokens[b, :lengths[b]]``), then
    :func:`transforms.logits_to_probs`; a :class:`serving.ServingConfig` is applied as a server applies it
    (:func:`serving.serving_probs`, whose penalties need the ``prompt_length``)."""
    if isinstance(config, ServingConfig):
        return serving_probs(logits, config, tokens, lengths, prompt_length)
    penalty = getattr(config, "repetition_penalty", 1)
    if penalty != 1:
        logits = penalized_logits(logits, _seen(tokens, lengths, logits.shape[-1]), penalty)
    return logits_to_probs(logits, config, check=False)


def _support_margin(logits: torch.Tensor, config: SamplingConfig, kept: torch.Tensor) -> float:
    """How far the case is from a support decided by rounding: the smallest gap between the lowest kept
    and the highest dropped logit, and (top-p) between the mass before the crossing token and top_p."""
    margin = float("inf")
    if not kept.all():
        x = logits.float() / float(config.temperature)
        low = x.masked_fill(~kept, float("inf")).amin(-1)
        high = x.masked_fill(kept, float("-inf")).amax(-1)
        margin = float((low - high).min())
    if config.top_p is not None and config.top_p < 1:
        probs = torch.softmax(logits.float() / float(config.temperature), -1)
        if config.top_k is not None:
            probs = torch.where(kept | (probs > 0), probs, 0)
        sorted_probs = torch.sort(probs, -1, descending=True).values
        before = torch.cumsum(sorted_probs, -1) - sorted_probs
        margin = min(margin, float((before - float(config.top_p)).abs().min()))
    return margin


def _margin(logits, config, kept, tokens, lengths, prompt_length) -> float:
    """:func:`_support_margin` of the logits a config truncates: after a serving config's bias and
    penalties, and with its min-p margin too."""
    if not isinstance(config, ServingConfig):
        return _support_margin(logits, config, kept)
    x = serving_logits(logits, config, tokens, lengths, prompt_length)
    return min(_support_margin(x, config, kept), min_p_margin(x, config))


# --------------------------------------------------------------------------- cases and their exact laws


@dataclass
class EngineCase:
    """One case of the engine battery: models, a prompt, the processors, and k, the tokens audited."""

    name: str
    target: GPT
    draft: GPT
    prompt: list
    config: SamplingConfig
    length: int = 9
    tv: float = 0.07  # the total variation distance the sample size is chosen to detect at power 0.99
    _law: Optional[tuple] = field(default=None, repr=False)

    @property
    def vocab(self) -> int:
        return self.target.config.vocab_size

    def law(self) -> tuple[np.ndarray, np.ndarray]:
        """Return (codes, probs): the law of the first k emitted tokens, each sequence coded as the
        base-V number of its tokens, sorted by code."""
        if self._law is None:
            self._law = _enumerate(self)
        return self._law[0], self._law[1]

    @property
    def entropy_bits(self) -> float:
        """The target's entropy per emitted token under the case's processors (bits), over the law."""
        self.law()
        return self._law[2]

    @property
    def acceptance(self) -> float:
        """The draft's exact acceptance rate, sum min(p, q), averaged over the positions the law visits."""
        self.law()
        return self._law[3]

    @property
    def margin(self) -> float:
        self.law()
        return self._law[4]

    def run(self, engine: Callable, generator: torch.Generator, n: int):
        """What ``engine`` (the ``"models"`` convention) returns for n rows of this case."""
        return engine(self.target, self.draft, list(self.prompt), self.length, self.config, generator, n)

    def codes_of(self, tokens: torch.Tensor) -> np.ndarray:
        """The base-V codes of emitted rows (n, k)."""
        powers = self.vocab ** np.arange(self.length - 1, -1, -1, dtype=np.int64)
        return tokens.cpu().numpy().astype(np.int64) @ powers


@torch.no_grad()
def _enumerate(case: EngineCase) -> tuple:
    vocab, prompt = case.vocab, list(case.prompt)
    if len(prompt) + case.length > CONTEXT:
        raise ValueError(f"case {case.name!r}: the prompt and {case.length} tokens exceed the context of {CONTEXT}")
    kept = vocab if case.config.top_k is None else min(vocab, case.config.top_k)
    if case.config.top_p is None and not case.config.greedy and kept ** case.length > MAX_SEQUENCES:
        raise ValueError(f"case {case.name!r}: the law's support holds {kept}^{case.length} sequences, past "
                         f"{MAX_SEQUENCES:,}; restrict it (top-k, top-p) or audit fewer tokens")
    prefixes = torch.empty(1, 0, dtype=torch.long)
    codes, probs = np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.float64)
    entropy = accepted = 0.0
    margin = float("inf")
    for _ in range(case.length):
        tokens = torch.cat([torch.tensor(prompt).expand(len(prefixes), -1), prefixes], 1)
        lengths = torch.full((len(tokens),), tokens.shape[1])
        step_p, step_q = [], []
        for chunk, chunk_lengths in zip(tokens.split(4096), lengths.split(4096)):
            target_logits = case.target(chunk)[:, -1]
            p = processed_probs(target_logits, case.config, chunk, chunk_lengths, len(prompt))
            margin = min(margin, _margin(target_logits, case.config, p > 0, chunk, chunk_lengths, len(prompt)))
            step_p.append(p.double())
            step_q.append(processed_probs(case.draft(chunk)[:, -1], case.config, chunk, chunk_lengths,
                                          len(prompt)).double())
        p, q = torch.cat(step_p).numpy(), torch.cat(step_q).numpy()
        entropy -= float((probs[:, None] * np.where(p > 0, p * np.log2(np.where(p > 0, p, 1)), 0)).sum())
        accepted += float((probs * np.minimum(p, q).sum(1)).sum())
        rows, nexts = np.nonzero(p > 0)
        if rows.size > MAX_SEQUENCES:
            raise ValueError(f"case {case.name!r}: the law's support grows past {MAX_SEQUENCES:,} sequences; "
                             "restrict it (top-k, top-p) or audit fewer tokens")
        codes, probs = codes[rows] * vocab + nexts, probs[rows] * p[rows, nexts]
        prefixes = torch.cat([prefixes[torch.from_numpy(rows)], torch.from_numpy(nexts).unsqueeze(1)], 1)
    order = np.argsort(codes)
    return codes[order], probs[order] / probs.sum(), entropy / case.length, accepted / case.length, margin


def engine_battery(penalty: bool = False, config: Optional[SamplingConfig] = None) -> list[EngineCase]:
    """Return the default engine cases (see the module docstring and notebooks/12_audit_engine).

    Four cases of different vocabularies, prompt lengths and processors, each auditing k = 9 tokens
    (at least three blocks for an engine that drafts at most 3 tokens a block); ``penalty=True`` adds a
    case with transformers' repetition penalty. ``config`` replaces every case's processors (the CLI's
    ``--temperature`` and friends); a config that leaves the support too large raises ``ValueError``.
    """
    specs = [  # name, vocab, seed, spread, noise, prompt length, config
        ("V = 3, T = 1", 3, 1, 0.8, 3.0, 5, SamplingConfig()),
        ("V = 4, top-k 3", 4, 2, 0.8, 3.0, 23, SamplingConfig(top_k=3)),
        ("V = 6, T = 0.7, top-k 4, top-p 0.9", 6, 3, 0.6, 2.5, 40, SamplingConfig(0.7, top_k=4, top_p=0.9)),
        ("V = 8, top-k 2", 8, 4, 0.6, 3.0, 11, SamplingConfig(top_k=2)),
    ]
    if penalty:
        specs.append(("V = 3, repetition penalty 1.5", 3, 5, 0.8, 3.0, 7, PenalizedConfig(repetition_penalty=1.5)))
    cases = []
    for name, vocab, seed, spread, noise, prompt_length, case_config in specs:
        target = tiny_model(vocab, seed, spread)
        draft = nudged_copy(target, noise, seed + 100)
        prompt = torch.randint(vocab, (prompt_length,), generator=torch.Generator().manual_seed(seed)).tolist()
        if config is not None:
            name, case_config = f"V = {vocab}, {config.describe()}", config
        cases.append(EngineCase(name, target, draft, prompt, case_config))
    return cases


# --------------------------------------------------------------------------- checking what an engine returns


def check_tokens(result, n: int, case: EngineCase) -> torch.Tensor:
    """Return the engine's result as a (n, k) LongTensor, or raise ``ValueError`` naming what is wrong."""
    tokens = getattr(result, "tokens", result)
    try:
        tokens = torch.as_tensor(tokens)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"returned {type(result).__name__}, not a tensor of token ids ({error})") from None
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise ValueError(f"returned {tokens.dtype} values, not integer token ids")
    if tuple(tokens.shape) != (n, case.length):
        raise ValueError(f"returned shape {tuple(tokens.shape)}, expected ({n}, {case.length})")
    tokens = tokens.long().cpu()
    bad = (tokens < 0) | (tokens >= case.vocab)
    if bad.any():
        row = int(bad.any(1).nonzero()[0])
        raise ValueError(f"emitted {tokens[row].tolist()}, with an id outside 0..{case.vocab - 1}")
    return tokens


def cases_named(cases: Sequence[EngineCase], names: Sequence[str]) -> list[EngineCase]:
    """The cases whose names are in ``names``, in that order."""
    by_name = {case.name: case for case in cases}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise ValueError(f"no battery case named {', '.join(map(repr, missing))}")
    return [by_name[name] for name in names]

