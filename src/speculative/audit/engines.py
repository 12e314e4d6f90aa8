"""Whole engines, end to end: tiny models whose emitted law is known exactly, and engines to audit on them.

Explained in: notebooks/12_audit_engine.

:mod:`audit` checks a verification *function*. An engine can be wrong outside it: in the q it hands the
rule, in a processor applied to one side only, in what its caches hold after a rejection. Only the law of
what a whole ``generate()`` call emits sees all of those. This module gives that law for small cases, and
the engines :func:`audit.audit_engine` runs on them.

- **Cases** (:class:`EngineCase`): a target and a draft, both the library's :class:`model.GPT` with a
  vocabulary of 3 to 8 and a context of 64 positions, randomly initialised with logits spread wide
  enough that the target is far from uniform; the draft is a noisy copy of the target. A case fixes a
  prompt, a :class:`transforms.SamplingConfig` (or :class:`transforms.PenalizedConfig`) and the number
  of emitted tokens k it audits.
- **The exact law** (:meth:`EngineCase.law`) of the first k tokens, by enumeration: one batched full
  forward of the target (no cache, no sampler) per position, over every prefix of positive probability,
  with the case's processors applied. Float64 products of float32 probabilities: exact up to float
  rounding, far below what a sample can see. The same pass gives the target's entropy and the draft's
  exact acceptance rate, averaged over the positions the law visits.
- **The engine convention** (``"models"``): ``engine(target, draft, prompt, max_new_tokens, config,
  generator, n)`` returns a ``LongTensor`` ``(n, max_new_tokens)`` of n independent continuations of
  ``prompt`` (a list of ids). The models are callable without a cache (``model(tokens)`` gives logits
  ``(B, T, V)``) and with the library's cache. :func:`library_engine` wraps this library's
  :func:`decode.speculative_decode` in it; :func:`hf_engine` wraps transformers' assisted generation.
- **A gallery** (:data:`GALLERY`): engines built on one short, batched reference engine
  (:func:`reference_engine`, full forwards, no cache, so that what each model "sees" is explicit), each
  with one flag that plants the bug class of a public thread, and a few engines that look wrong but keep
  the law.
"""

from __future__ import annotations

import copy
import dataclasses
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

__all__ = ["EngineCase", "EngineEntry", "engine_battery", "tiny_model", "nudged_copy", "processed_probs",
           "library_engine", "reference_engine", "hf_engine", "HF_CONFIGURATIONS", "GALLERY", "check_tokens",
           "MAX_SEQUENCES"]

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


# --------------------------------------------------------------------------- this library's engine


def library_engine(gamma=2, rule: str = "token", per_row: bool = False, mixed: bool = False,
                   policy: Optional[str] = None, max_gamma: int = 3) -> Callable:
    """This library's :func:`decode.speculative_decode` in the ``"models"`` convention.

    ``gamma`` is a fixed length, or ``policy`` names a draft-length policy (:func:`policy.make_policy`,
    started at ``gamma``, at most ``max_gamma`` drafts; ``auto`` gets a fixed made-up calibration: the law
    holds for any). ``mixed=True`` decodes the n rows in one batch with n rows of a prompt two tokens
    shorter, interleaved, so that rows of different lengths share every block (only the case's rows are
    returned)."""
    from speculative.engine.decode import speculative_decode
    from speculative.engine.policy import make_policy

    def engine(target, draft, prompt, max_new_tokens, config, generator, n):
        length = gamma
        if policy is not None:
            length = make_policy(policy, gamma=gamma, calibration={"c": 0.1, "v": {1: 1.3, 4: 1.4, 8: 1.6}},
                                 max_gamma=max_gamma)
        rows = [list(prompt)] * n
        if mixed:
            rows = [row for pair in zip(rows, [list(prompt[:-2]) or list(prompt)] * n) for row in pair]
        out = speculative_decode(target, draft, rows, max_new_tokens, length, config, generator, rule=rule,
                                 per_row=per_row)
        return torch.tensor(out.tokens[::2] if mixed else out.tokens)

    bits = [f"{policy} policy" if policy else f"fixed γ = {gamma}", f"{rule} verification"]
    bits += ["per-row lengths"] * per_row + ["rows of two lengths in one batch"] * mixed
    engine.__qualname__ = "speculative_decode (" + ", ".join(bits) + ")"
    return engine


# --------------------------------------------------------------------------- the reference engine and its bugs


class _Forwards:
    """Forwards of right-padded rows that all begin with ``prompt``, as full forwards compute them: the
    prompt's keys and values (all but its last token) are computed once, every later position from the
    rows' own tokens. ``self(tokens, lengths, extra)`` returns the logits (B, extra + 1, V) at positions
    lengths - 1 .. lengths - 1 + extra; what follows a row's end never reaches the positions before it.
    Rows with the same tokens run once (thousands of rows of one prompt share most of their contexts)."""

    def __init__(self, model: GPT, prompt: Sequence[int]):
        self.model, self.start = model, len(prompt) - 1
        self.full = not isinstance(model, GPT)  # another model (a loaded folder): full forwards, no cache
        if not self.full:
            self.prefix = model.new_cache(1)
            if self.start > 0:
                model(torch.tensor([list(prompt[:-1])]), 0, self.prefix)

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor, extra: int = 0) -> torch.Tensor:
        width = int(lengths.max()) + extra
        rows = tokens[:, :width].masked_fill(torch.arange(width) >= (lengths + extra).unsqueeze(1), 0)
        unique, inverse = _unique_rows(torch.cat([rows, lengths.unsqueeze(1)], 1))
        picked = []
        for chunk in unique.split(4096):
            if self.full:
                logits = self.model(chunk[:, :width])
                index = (chunk[:, -1] - 1).unsqueeze(1) + torch.arange(extra + 1)
                picked.append(logits.gather(1, index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])))
                continue
            cache = self.model.new_cache(len(chunk), length=width)
            cache.keys[:, :, :self.start] = self.prefix.keys[:, :, :self.start]
            cache.values[:, :, :self.start] = self.prefix.values[:, :, :self.start]
            logits = self.model(chunk[:, self.start:width], self.start, cache, span=width, check=False)
            index = (chunk[:, -1] - 1 - self.start).unsqueeze(1) + torch.arange(extra + 1)
            picked.append(logits.gather(1, index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])))
        return torch.cat(picked)[inverse]


_HASH = torch.randint(1, 2**62, (CONTEXT + 2,), generator=torch.Generator().manual_seed(0))


def _unique_rows(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(key, dim=0, return_inverse=True)``, faster: rows are grouped by a 64-bit hash
    (wrapping integer arithmetic), and the grouping is checked row by row (a collision falls back)."""
    hashes = (key * _HASH[:key.shape[1]]).sum(1)
    _, first, inverse = _unique_first(hashes)
    unique = key[first]
    if not bool((unique[inverse] == key).all()):
        return torch.unique(key, dim=0, return_inverse=True)
    return unique, inverse


def _unique_first(values: torch.Tensor):
    """(unique values, the index of one row holding each, the inverse map)."""
    unique, inverse = torch.unique(values, return_inverse=True)
    first = torch.empty(len(unique), dtype=torch.long).scatter_(0, inverse, torch.arange(len(values)))
    return unique, first, inverse


def _write(buffer: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Write each row's first ``counts[b]`` of ``tokens`` at ``lengths[b]``; return the new lengths."""
    columns = lengths.unsqueeze(1) + torch.arange(tokens.shape[1])
    keep = torch.arange(tokens.shape[1]) < counts.unsqueeze(1)
    rows = torch.arange(len(buffer)).unsqueeze(1).expand_as(columns)
    buffer[rows[keep], columns[keep]] = tokens[keep]
    return lengths + counts


def _argmax_verify(drafts, draft_probs, target_probs, generator):
    """SGLang #31214's path at T > 0: accept a draft only if it is the target's arg-max, emit the arg-max."""
    best = target_probs.argmax(-1)  # (B, k + 1)
    matched = (drafts == best[:, :-1]).long().cumprod(1)
    accepted = matched.sum(1)
    return accepted, best.gather(1, accepted.unsqueeze(1)).squeeze(1)


def _point_residual_verify(drafts, draft_probs, target_probs, generator):
    """xLLM #2175's residual: accept as the rule does, but after a rejection of x sample from p with only
    p(x) lowered by q(x), not from max(p - q, 0) over the whole vocabulary."""
    batch, k = drafts.shape
    p_drafted = target_probs[:, :k].gather(2, drafts.unsqueeze(2)).squeeze(2)
    q_drafted = draft_probs.gather(2, drafts.unsqueeze(2)).squeeze(2)
    uniforms = torch.rand(batch, k, generator=generator)
    accepted = (uniforms * q_drafted < p_drafted).long().cumprod(1).sum(1)
    rows = torch.arange(batch)
    at = accepted.clamp(max=k - 1)
    residual = target_probs[rows, accepted].clone()
    rejected = accepted < k
    drafted = drafts[rows, at]
    lowered = (residual[rows, drafted] - q_drafted[rows, at]).clamp(min=0)
    residual[rows[rejected], drafted[rejected]] = lowered[rejected]
    residual = torch.where(residual.sum(1, keepdim=True) > 0, residual, target_probs[rows, accepted])
    final = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return accepted, final


def _hybrid_block_verify(drafts, draft_probs, target_probs, generator):
    """vLLM-Ascend #7807's mix of the two rules: every drafted position is kept or not by the token-wise
    test min(1, p/q) on its own, the block is cut after the last kept one (earlier rejections
    notwithstanding), and the token after the cut comes from the token-wise residual max(p - q, 0)."""
    batch, k = drafts.shape
    p_drafted = target_probs[:, :k].gather(2, drafts.unsqueeze(2)).squeeze(2)
    q_drafted = draft_probs.gather(2, drafts.unsqueeze(2)).squeeze(2)
    kept = torch.rand(batch, k, generator=generator) * q_drafted < p_drafted
    accepted = (kept.long() * torch.arange(1, k + 1)).amax(1)
    rows = torch.arange(batch)
    residual = target_probs[rows, accepted].clone()
    cut = accepted < k
    residual[cut] = (residual[cut] - draft_probs[rows[cut], accepted[cut]]).clamp(min=0)
    residual = torch.where(residual.sum(1, keepdim=True) > 0, residual, target_probs[rows, accepted])
    final = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return accepted, final


def bf16_probs(logits: torch.Tensor, config, tokens=None, lengths=None, prompt_length: int = 0) -> torch.Tensor:
    """The draft distribution DeepSpec #31 sampled from: :func:`processed_probs` of the logits rounded to
    bfloat16 (the model's native dtype there), while the rule was handed the float32 one."""
    return processed_probs(logits.to(torch.bfloat16).float(), config, tokens, lengths, prompt_length)


@torch.no_grad()
def reference_engine(target, draft, prompt, max_new_tokens, config, generator, n, *, gamma: int = 2,
                     bug: Optional[str] = None) -> torch.Tensor:
    """A short, batched speculative decoder in the ``"models"`` convention that recomputes every position
    after the prompt from tokens (no cache to roll back) and keeps what each model sees as explicit
    buffers: ``seen_t`` (the target's context) and ``seen_d`` (the draft's), right-padded. Correct, both
    hold exactly the emitted tokens after every block. ``bug`` plants one of the gallery's bug classes
    (:data:`GALLERY`) or one of its lawful oddities."""
    from speculative.sampling.sampler import rejection_sample

    if bug == "shared_stream":  # TensorRT-LLM #19487: side-by-side requests replay one random stream
        half = reference_engine(target, draft, prompt, max_new_tokens, config, generator, (n + 1) // 2,
                                gamma=gamma)
        return half.repeat_interleave(2, 0)[:n]
    start = len(prompt)
    target_forward, draft_forward = _Forwards(target, prompt), _Forwards(draft, prompt)
    out = torch.zeros(n, CONTEXT + 1, dtype=torch.long)
    out[:, :len(prompt)] = torch.tensor(prompt)
    seen_t, seen_d = out.clone(), out.clone()
    ends = torch.full((n,), len(prompt))
    ends_t, ends_d = ends.clone(), ends.clone()
    late = torch.zeros(n, dtype=torch.bool)  # bug "late": rows whose rollback was skipped last block
    draft_config = config
    if bug == "draft_temperature":  # lawful: the draft samples at its own temperature, the rule gets that q
        draft_config = type(config)(**{**config.__dict__, "temperature": 1.5 * config.temperature})
    target_config = config
    if bug == "penalty_ignored":  # TensorRT-LLM #17701: both sides sample as if there were no penalty
        target_config = draft_config = SamplingConfig(config.temperature, config.top_k, config.top_p)
    if bug == "logit_bias_ignored":  # vLLM #38202: under speculation the request's bias is dropped
        target_config = draft_config = dataclasses.replace(config, logit_bias=())
    if bug == "deterministic_draft":  # lawful: the draft proposes its arg-max and the rule gets q one-hot
        draft_config = dataclasses.replace(config, temperature=0)
    block_start = bug == "penalty_per_step"  # SGLang #33643: penalties see the output as of the block start
    while int((ends - len(prompt)).min()) < max_new_tokens:
        k = gamma if bug != "random_gamma" else int(torch.randint(1, gamma + 2, (1,), generator=generator))
        drafts = torch.zeros(n, k, dtype=torch.long)
        draft_probs = torch.zeros(n, k, target.config.vocab_size)
        raw_probs = torch.zeros_like(draft_probs)
        for j in range(k):
            logits = draft_forward(seen_d, ends_d + j)[:, 0]
            q = processed_probs(logits, draft_config, seen_d, ends_d + j * (not block_start), start)
            sampled = q
            if bug == "bf16_draft":  # DeepSpec #31: drawn from bfloat16 logits, judged with the float32 q
                sampled = bf16_probs(logits, draft_config, seen_d, ends_d + j, start)
            drafts[:, j] = torch.multinomial(sampled, 1, generator=generator).squeeze(1)
            draft_probs[:, j] = q
            raw_probs[:, j] = torch.softmax(logits.float() / float(draft_config.temperature or 1), -1)
            seen_d[torch.arange(n), ends_d + j] = drafts[:, j]
        _write(seen_t, ends_t, drafts, torch.full((n,), k))  # the target reads the drafts after its context
        logits = target_forward(seen_t, ends_t, extra=k)  # (n, k + 1, V)
        target_probs = torch.stack([processed_probs(logits[:, i], target_config, seen_t,
                                                    ends_t + i * (not block_start), start)
                                    for i in range(k + 1)], 1)
        if bug == "settings_not_expanded":  # vLLM 0.32 on CPU: draft positions verified without the settings
            plain = dataclasses.replace(target_config, temperature=1, top_k=None, top_p=None)
            target_probs[:, :k] = torch.stack([processed_probs(logits[:, i], plain, seen_t, ends_t + i, start)
                                               for i in range(k)], 1)
        if bug in ("argmax_verify", "point_residual", "block_hybrid"):
            verify = {"argmax_verify": _argmax_verify, "point_residual": _point_residual_verify,
                      "block_hybrid": _hybrid_block_verify}[bug]
            accepted, final = verify(drafts, draft_probs, target_probs, generator)
            emitted = torch.cat([drafts, torch.zeros(n, 1, dtype=torch.long)], 1)
            emitted[torch.arange(n), accepted] = final
        else:
            verified = raw_probs if bug == "raw_q" else draft_probs
            result = rejection_sample(drafts, verified, target_probs, generator, check_values=False)
            accepted, emitted = result.num_accepted, result.tokens.clamp(min=0)
        active = ends - len(prompt) < max_new_tokens  # a finished row stays as it is
        ends = _write(out, ends, emitted, torch.where(active, accepted + 1, 0))
        ends_t, late = _roll_target(bug, seen_t, out, ends, ends_t, emitted, accepted, k, late)
        ends_d = _roll_draft(bug, seen_d, out, ends, ends_d, emitted, accepted, k)
        seen_t[~active], seen_d[~active] = out[~active], out[~active]
        ends_t, ends_d = torch.where(active, ends_t, ends), torch.where(active, ends_d, ends)
    return out[:, len(prompt):len(prompt) + max_new_tokens]


def _keep_drafts(seen: torch.Tensor, ends: torch.Tensor, emitted, accepted, k: int) -> torch.Tensor:
    """A context that was never rewound: all k drafts stay, then the block's last token follows them."""
    last = emitted.gather(1, accepted.unsqueeze(1))
    return _write(seen, ends + k, last, torch.ones(len(seen), dtype=torch.long))


def _roll_target(bug, seen_t, out, ends, ends_t, emitted, accepted, k, late):
    """After a block: what the target's context holds next (a correct engine: exactly the emitted tokens).
    Returns its new lengths and, for bug "late", the rows whose rollback is left for the next block.
    A context about to outgrow the models' 64 positions is rebuilt from the emitted tokens, which heals
    a planted slip for that row (it can happen inside the nine audited tokens on the longest prompt)."""
    full = accepted == k
    if bug == "target_not_rewound":  # mlx-lm #1109: the rejected drafts stay in the target's context
        new, late = _keep_drafts(seen_t, ends_t, emitted, accepted, k), late
    elif bug == "late":  # openvino.genai #4190: a rejection is rolled back one block late, row by row
        kept = _keep_drafts(seen_t, ends_t, emitted, accepted, k)  # this block's rollback skipped ...
        due = late.clone()
        seen_t[due] = out[due]  # ... and the last block's, due now, done
        new = torch.where(due, ends, kept)
        late = ~due & ~full  # rows whose rejection this block is left for the next
    elif bug == "shared_offset":  # mlx-vlm #1155: every row's offset moves by the whole block; the
        _write(seen_t, ends_t, emitted, accepted + 1)  # rejected tail is blanked, not rolled back
        _write(seen_t, ends_t + accepted + 1, torch.zeros(len(out), k + 1, dtype=torch.long), k - accepted)
        new, late = ends_t + k + 1, late
    elif bug == "bonus_not_cached":  # after a full block the bonus token's entry never reaches the target
        _write(seen_t, ends_t, emitted, accepted + 1 - full.long())
        new = ends_t + accepted + 1 - full.long()
    else:
        seen_t.copy_(out)
        new = ends.clone()
    over = new + 2 * k + 3 > CONTEXT  # a context about to overflow is rebuilt from the emitted tokens
    if bug == "bonus_not_cached":  # it lags instead: rebuild it when the emitted tokens near the end
        over = ends + 2 * k + 3 > CONTEXT
    seen_t[over] = out[over]
    return torch.where(over, ends, new), late


def _roll_draft(bug, seen_d, out, ends, ends_d, emitted, accepted, k):
    """The draft's context after a block; bug "draft_not_rewound" keeps its rejected drafts (lawful)."""
    if bug == "draft_bonus_lost":  # vLLM #9730: after a full block the draft's context lacks the bonus token
        full = accepted == k
        _write(seen_d, ends_d, emitted, accepted + 1 - full.long())
        new = ends_d + accepted + 1 - full.long()
        over = ends + 2 * k + 3 > CONTEXT
        seen_d[over] = out[over]
        return torch.where(over, ends, new)
    if bug != "draft_not_rewound":
        seen_d.copy_(out)
        return ends.clone()
    new = _keep_drafts(seen_d, ends_d, emitted, accepted, k)
    over = new + 2 * k + 3 > CONTEXT
    seen_d[over] = out[over]
    return torch.where(over, ends, new)


@dataclass(frozen=True)
class EngineEntry:
    """One engine of the gallery: what it does, whether it keeps the law, and the thread it stands for."""

    key: str
    name: str
    lawful: bool
    what: str
    cite: str = ""  # a key of book/references.bib
    url: str = ""
    bug: Optional[str] = None
    penalty: bool = False  # needs the repetition-penalty case to show
    truncation: bool = False  # needs a case with top-k or top-p to show
    needs: tuple = ()  # serving entries: the serving cases it runs on ("paired": two requests side by side)

    def engine(self) -> Callable:
        def run(target, draft, prompt, max_new_tokens, config, generator, n):
            return reference_engine(target, draft, prompt, max_new_tokens, config, generator, n, bug=self.bug)

        run.__qualname__ = self.name
        return run


GALLERY = [
    EngineEntry("reference", "the reference engine", True, "a correct engine: both contexts are the emitted tokens"),
    EngineEntry("raw_q", "drafts from processed logits, raw q in the rule", False,
                "draws each draft from the top-k / top-p processed draft distribution but hands the rule the "
                "unprocessed softmax as q", "transformers47932", "https://github.com/huggingface/transformers/issues/47932",
                "raw_q", truncation=True),
    EngineEntry("penalty_ignored", "repetition penalty ignored", False,
                "decodes, drafts and verifies as if no repetition penalty had been asked for",
                "tensorrtllm17701", "https://github.com/NVIDIA/TensorRT-LLM/pull/17701", "penalty_ignored",
                penalty=True),
    EngineEntry("argmax_verify", "arg-max verification at T > 0", False,
                "accepts a draft only when it is the target's arg-max and emits the arg-max, whatever the "
                "temperature", "sglang31214", "https://github.com/sgl-project/sglang/pull/31214", "argmax_verify"),
    EngineEntry("target_not_rewound", "the target's cache is not rewound", False,
                "keeps the rejected drafts in the target's context after a rejection",
                "mlxlm1109", "https://github.com/ml-explore/mlx-lm/pull/1109", "target_not_rewound"),
    EngineEntry("bonus_not_cached", "the bonus token never reaches the target's cache", False,
                "after a fully accepted block the target's context lacks the bonus token (vLLM #9730 is the "
                "same slip on the draft's side, which is lawful: see below)", bug="bonus_not_cached"),
    EngineEntry("late", "a rejection rolled back one block late", False,
                "after a rejection, the row's next block still sees the rejected drafts; the rollback comes a "
                "block later",
                "openvino4190", "https://github.com/openvinotoolkit/openvino.genai/issues/4190", "late"),
    EngineEntry("shared_offset", "offsets not rolled back, row by row", False,
                "advances every row's target context by the whole block and blanks the rejected tail "
                "instead of rolling the row's offset back",
                "mlxvlm1155", "https://github.com/Blaizzy/mlx-vlm/pull/1155", "shared_offset"),
    EngineEntry("draft_not_rewound", "the draft's cache is not rewound", True,
                "keeps the rejected drafts in the draft's context: worse drafts, the same law"),
    EngineEntry("draft_bonus_lost", "the bonus token never reaches the draft's cache", True,
                "the draft's context lacks the bonus token after a full block: lower acceptance, the same law",
                "vllm9730", "https://github.com/vllm-project/vllm/pull/9730", "draft_bonus_lost"),
    EngineEntry("draft_temperature", "a draft at another temperature", True,
                "the draft samples at 1.5 times the temperature and the rule is given that q"),
    EngineEntry("random_gamma", "a random draft length", True,
                "draws each block's length uniformly from 1..3 with the engine's generator"),
]


# --------------------------------------------------------------------------- transformers' assisted generation


#: The transformers configurations ``audit-engine hf`` audits: a label, generate() settings, and the
#: battery cases (by name) they run on; ``None`` for the assistant means prompt-lookup decoding.
_CONSTANT = {"num_assistant_tokens": 3, "num_assistant_tokens_schedule": "constant",
             "assistant_confidence_threshold": 0.0}
HF_CONFIGURATIONS = {
    "T = 1, constant γ = 3": (dict(_CONSTANT), ["V = 3, T = 1"]),
    "T = 0.7, top-k 4, top-p 0.9": (dict(_CONSTANT), ["V = 6, T = 0.7, top-k 4, top-p 0.9"]),
    "repetition penalty 1.5": (dict(_CONSTANT), ["V = 3, repetition penalty 1.5"]),
    "heuristic schedule": ({**_CONSTANT, "num_assistant_tokens_schedule": "heuristic"}, ["V = 4, top-k 3"]),
    "confidence threshold 0.4": ({**_CONSTANT, "num_assistant_tokens": 5, "assistant_confidence_threshold": 0.4},
                                 ["V = 3, T = 1"]),
    "prompt lookup": ({"prompt_lookup_num_tokens": 3}, ["V = 3, T = 1"]),
}


def _hf_sampling(config: SamplingConfig) -> dict:
    return {"do_sample": True, "temperature": float(config.temperature), "top_k": config.top_k or 0,
            "top_p": float(config.top_p) if config.top_p is not None else 1.0,
            "repetition_penalty": float(getattr(config, "repetition_penalty", 1.0))}


def hf_engine(settings: dict) -> Callable:
    """transformers' ``generate()`` in the ``"models"`` convention: the case's models exported with
    :func:`hf.export`, ``do_sample`` with the case's processors, and ``settings`` (the assistant's
    generation-config fields, or ``prompt_lookup_num_tokens`` for prompt-lookup decoding, which has no
    assistant). One row per call; its randomness is the global torch RNG, seeded from ``generator``."""
    from transformers import GenerationConfig

    from speculative.engine.hf import _quiet, export

    exported: dict = {}
    lookup = "prompt_lookup_num_tokens" in settings

    def engine(target, draft, prompt, max_new_tokens, config, generator, n):
        for model in (target, draft):
            if id(model) not in exported:
                exported[id(model)] = (model, export(model))  # keep the model alive: ids are reused
        hf_target, hf_draft = exported[id(target)][1], exported[id(draft)][1]
        ids = torch.tensor([list(prompt)])
        kwargs = {"prompt_lookup_num_tokens": settings["prompt_lookup_num_tokens"]} if lookup else \
            {"assistant_model": hf_draft}
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
        rows = []
        with _quiet():
            for _ in range(n):
                if not lookup:  # each call starts from the settings: the heuristic schedule writes its state back
                    hf_draft.generation_config = GenerationConfig(**settings)
                out = hf_target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                         min_new_tokens=max_new_tokens, pad_token_id=0, **kwargs,
                                         **_hf_sampling(config))
                rows.append(out[0, ids.shape[1]:])
        return torch.stack(rows)

    engine.__qualname__ = "transformers generate(" + ", ".join(f"{k}={v}" for k, v in settings.items()) + ")"
    return engine


def cases_named(cases: Sequence[EngineCase], names: Sequence[str]) -> list[EngineCase]:
    """The cases whose names are in ``names``, in that order."""
    by_name = {case.name: case for case in cases}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise ValueError(f"no battery case named {', '.join(map(repr, missing))}")
    return [by_name[name] for name in names]

