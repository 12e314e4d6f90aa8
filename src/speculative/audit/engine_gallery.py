"""The engine gallery: a short, batched reference engine, and engines built on it with one planted bug each.

Explained in: notebooks/12_audit_engine (and notebooks/13_audit_serving for the bugs serving adds).

:func:`reference_engine` is a speculative decoder in the ``"models"`` convention (:mod:`engine_cases`)
that recomputes every position from tokens (full forwards, no cache to roll back), so that what each
model "sees" is an explicit buffer. Correct, both contexts hold exactly the emitted tokens after every
block; its ``bug`` flag plants the bug class of a public thread instead (a q the rule never sampled from,
a penalty ignored, a cache not rewound, ...). :data:`GALLERY` lists those engines (:class:`EngineEntry`),
with a few that look wrong but keep the law.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from speculative.audit.engine_cases import CONTEXT, processed_probs
from speculative.engine.model import GPT
from speculative.sampling.transforms import SamplingConfig

__all__ = ["reference_engine", "bf16_probs", "EngineEntry", "GALLERY"]


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

