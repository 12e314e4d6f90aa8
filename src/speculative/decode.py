"""Plain and speculative decoding with KV caches that roll back, batch >= 1, per-row acceptance.

Explained in: notebooks/08_decoding_demo (the loop) and notebooks/06_three_equalities (what it preserves).

State per row: the sequence so far (prompt + generated), of length n. The target's cache always holds
positions 0 .. n-2 (every token but the last); the draft's cache holds a prefix of that. One speculative
block:

1. the draft proposes gamma tokens one at a time, each sampled from its transformed distribution q;
2. the target scores the last token and all gamma drafts in **one** forward over gamma + 1 positions;
3. ``sampler.rejection_sample`` accepts a prefix of a drafts per row and adds one more token (from the
   residual, or the bonus token from p when all are accepted);
4. each row's length moves forward by a + 1. Rolling the caches back is free: positions past a row's
   length are stale and get overwritten, because attention never looks past a row's own position.

Rows finish at different blocks. A finished row rides along in the batched calls (computed, never
written) until half the rows are finished; then the finished ones are dropped, which costs one copy of
each cache and spares every later block their work.

After a fully accepted block the draft has not yet seen its last draft, so the next block feeds it two
tokens instead of one. The draft's bookkeeping cannot bias the output (the rule corrects for whatever q
the draft really sampled from); the target's can, and a test plants an off-by-one there to show that the
distribution test catches it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import torch

from .model import GPT
from .sampler import rejection_sample
from .transforms import SamplingConfig, logits_to_probs

__all__ = ["DecodeResult", "plain_decode", "speculative_decode", "encode_prompts", "exact_two_byte_law", "acceptance_rate",
           "completion_bits_per_byte"]

Prompt = Union[bytes, str, Sequence[int]]


@dataclass
class DecodeResult:
    tokens: list[list[int]]  # generated tokens per row, exactly max_new_tokens each (prompt excluded)
    target_forwards: int = 0  # forward calls of the target (batched: one call serves every row)
    draft_forwards: int = 0
    seconds: float = 0.0
    accepted: list[torch.Tensor] = field(default_factory=list)  # per block: (B,) accepted drafts, -1 if inactive
    gamma: int = 0
    prefill_seconds: float = 0.0  # of ``seconds``: the prompt forwards (both models' for speculative decoding)
    # with time_forwards=True: seconds spent inside the forward calls after the prefill (NaN otherwise)
    target_seconds: float = float("nan")
    draft_seconds: float = float("nan")

    def text(self, row: int = 0) -> str:
        return bytes(self.tokens[row]).decode("utf-8", errors="replace")

    def acceptance_rate(self) -> float:
        """Return alpha as measured: accepted drafts / drafts that were tested, over active rows.

        A block tests its drafts in order and stops at the first rejection, so it tests a + 1 drafts when
        it accepts a < gamma of them and gamma when it accepts all; the drafts after a rejection were never
        tested and do not count. This is the maximum-likelihood estimate of a per-draft acceptance rate.
        """
        return acceptance_rate(self.accepted, self.gamma)

    def tokens_per_block(self) -> float:
        """Return emitted tokens per target call per active row (accepted + 1, averaged)."""
        counts = torch.stack(self.accepted)
        return float((counts[counts >= 0] + 1).float().mean())


def acceptance_rate(accepted: Sequence[torch.Tensor], gamma: int) -> float:
    """Return accepted / tested drafts for per-block accepted counts (-1 marks an inactive row)."""
    if not len(accepted):
        return float("nan")
    counts = torch.cat([a.reshape(-1) for a in accepted])
    counts = counts[counts >= 0]
    tested = counts + (counts < gamma).long()
    return float(counts.sum()) / float(tested.sum())


def encode_prompts(prompts: Sequence[Prompt]) -> list[list[int]]:
    """Return prompts as lists of byte ids; raise on an empty list or an empty prompt."""
    if isinstance(prompts, (bytes, str)) or not len(prompts):
        raise ValueError("prompts must be a non-empty list of prompts (bytes, str or lists of byte ids)")
    encoded = []
    for index, prompt in enumerate(prompts):
        ids = list(prompt.encode("utf-8") if isinstance(prompt, str) else prompt)
        if not ids:
            raise ValueError(f"prompt {index} is empty: decoding needs at least one token of context")
        if any(not 0 <= t < 256 for t in ids):
            raise ValueError(f"prompt {index} holds ids outside [0, 256)")
        encoded.append(ids)
    return encoded


def _check(model: GPT, prompts: list[list[int]], max_new_tokens: int, lookahead: int) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    context = model.config.context
    longest = max(len(p) for p in prompts)
    if longest > context:
        raise ValueError(f"a prompt of {longest} tokens is longer than the context of {context}")
    if longest + max_new_tokens + lookahead > context:
        raise ValueError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) + lookahead ({lookahead}) "
                         f"exceeds the context of {context}")


def _padded(rows: list[list[int]], width: int, device) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row[:width], dtype=torch.long)
    return out.to(device)


def _prefill(model: GPT, prompts: list[list[int]], device, length: int):
    """Return a cache holding positions 0 .. n-2 of every row (right-padded; padding is never attended).

    Identical prompts are prefilled once and their cache rows copied.
    """
    unique = sorted({tuple(p) for p in prompts})
    slot = {p: i for i, p in enumerate(unique)}
    cache = model.new_cache(len(unique), length=length)
    width = max(len(p) for p in unique) - 1
    if width > 0:
        model(_padded([list(p[:-1]) for p in unique], width, device),
              torch.zeros(len(unique), dtype=torch.long, device=device), cache)
    if len(unique) == len(prompts) and all(slot[tuple(p)] == i for i, p in enumerate(prompts)):
        return cache
    return cache.select(torch.tensor([slot[tuple(p)] for p in prompts], device=device))


def _elapsed(started: float, device) -> float:
    """Return seconds since ``started``, after the device has finished its queued work."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started


class _ForwardClock:
    """Adds up the seconds spent inside each model's forward calls, synchronising the device around them.

    It times the calls where they really happen, inside the decoding loop, between the other model's
    calls and the loop's own work, rather than a forward repeated alone in a tight loop (the benchmark
    records both, and they can differ widely). Only the calls are timed, not the work between them.
    Synchronising costs a CUDA run some overlap, so there a benchmark measures speed in other runs.
    """

    def __init__(self, device):
        self.seconds = {"target": 0.0, "draft": 0.0}
        self.cuda = str(device).startswith("cuda")

    def wrap(self, model, name):
        def call(*args):
            if self.cuda:
                torch.cuda.synchronize()
            began = time.perf_counter()
            out = model(*args)
            if self.cuda:
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - began
            return out
        return call


def _sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.no_grad()
def plain_decode(model: GPT, prompts: Sequence[Prompt], max_new_tokens: int,
                 config: SamplingConfig = SamplingConfig(), generator: Optional[torch.Generator] = None,
                 time_forwards: bool = False) -> DecodeResult:
    """Return max_new_tokens tokens per prompt, sampled one at a time from the model (one forward each).

    ``time_forwards=True`` also records the seconds spent inside the forwards after the prefill.
    """
    rows = encode_prompts(prompts)
    _check(model, rows, max_new_tokens, lookahead=0)
    device = model.token_embedding.weight.device
    generator = generator or torch.Generator(device=device).manual_seed(0)
    started = time.perf_counter()
    cache = _prefill(model, rows, device, length=max(len(r) for r in rows) + max_new_tokens)
    prefill_seconds = _elapsed(started, device)
    lengths = torch.tensor([len(r) for r in rows], device=device)
    last = torch.tensor([r[-1] for r in rows], device=device)
    generated = []
    clock = _ForwardClock(device)
    if time_forwards:
        model = clock.wrap(model, "target")
    for _ in range(max_new_tokens):
        logits = model(last.unsqueeze(1), lengths - 1, cache)[:, -1]  # (B, V)
        last = _sample(logits_to_probs(logits, config), generator)
        generated.append(last)
        lengths = lengths + 1
    tokens = torch.stack(generated, 1).tolist()
    return DecodeResult(tokens=tokens, target_forwards=max_new_tokens + 1, seconds=time.perf_counter() - started,
                        prefill_seconds=prefill_seconds,
                        target_seconds=clock.seconds["target"] if time_forwards else float("nan"))


@torch.no_grad()
def speculative_decode(target: GPT, draft: GPT, prompts: Sequence[Prompt], max_new_tokens: int, gamma: int,
                       config: SamplingConfig = SamplingConfig(), generator: Optional[torch.Generator] = None,
                       sampler: Callable = rejection_sample, time_forwards: bool = False) -> DecodeResult:
    """Return max_new_tokens tokens per prompt by speculative decoding with blocks of ``gamma`` drafts.

    The emitted tokens have the target's distribution under ``config`` (see the module docstring);
    draft and target go through the same :func:`logits_to_probs`. ``sampler`` is the verification rule
    (``rejection_sample``'s signature); chapters swap in a biased one from ``pitfalls`` to show what a
    wrong rule does on a real model pair. ``time_forwards=True`` also records the seconds spent inside
    each model's forwards after the prefill.
    """
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(f"vocabulary mismatch: target has {target.config.vocab_size} tokens, "
                         f"draft has {draft.config.vocab_size}")
    rows = encode_prompts(prompts)
    _check(target, rows, max_new_tokens, lookahead=gamma + 2)
    _check(draft, rows, max_new_tokens, lookahead=gamma + 2)
    device = target.token_embedding.weight.device
    generator = generator or torch.Generator(device=device).manual_seed(0)
    batch = len(rows)
    started = time.perf_counter()
    capacity = max(len(r) for r in rows) + max_new_tokens + gamma + 2
    target_cache = _prefill(target, rows, device, length=min(capacity, target.config.context))
    draft_cache = _prefill(draft, rows, device, length=min(capacity, draft.config.context))
    prefill_seconds = _elapsed(started, device)
    target_forwards, draft_forwards = 1, 1
    sequence = _padded(rows, capacity, device)  # (B, capacity): prompt, then generated tokens, every row
    origin = torch.arange(batch, device=device)  # decoding row i is row origin[i] of the batch
    lengths = torch.tensor([len(r) for r in rows], device=device)  # n per decoding row
    prompt_lengths = lengths.clone()
    draft_behind = torch.ones(batch, dtype=torch.long, device=device)  # tokens the draft has not yet fed: 1 or 2
    accepted_log = []
    clock = _ForwardClock(device)
    if time_forwards:
        target, draft = clock.wrap(target, "target"), clock.wrap(draft, "draft")
    while True:
        active = lengths - prompt_lengths < max_new_tokens
        finished = int((~active).sum())
        if finished == len(active):
            break
        if 2 * finished >= len(active):
            # half the rows are done: drop them (one copy of each cache) so that later blocks stop
            # computing them; below that, finished rows ride along, parked at their prompt
            keep = active.nonzero().squeeze(1)
            target_cache, draft_cache = target_cache.select(keep), draft_cache.select(keep)
            origin, lengths, prompt_lengths, draft_behind = (t[keep] for t in (origin, lengths, prompt_lengths,
                                                                                draft_behind))
            active = active[keep]
        rows_index = torch.arange(len(origin), device=device)
        at = torch.where(active, lengths, prompt_lengths)
        behind = torch.where(active, draft_behind, 1)
        # 1. draft gamma tokens; the first step feeds the 1 or 2 tokens the draft has not seen
        first_start = at - behind  # rows behind by one also feed a padding slot at n, rewritten later
        chunk = torch.stack([sequence[origin, first_start], sequence[origin, first_start + 1]], 1)
        logits = draft(chunk, first_start, draft_cache)
        draft_logits = [logits[rows_index, behind - 1]]  # (B, V) at position n - 1
        draft_forwards += 1
        drafts, draft_probs = [], []
        for i in range(gamma):
            probs = logits_to_probs(draft_logits[-1], config)
            token = _sample(probs, generator)
            drafts.append(token)
            draft_probs.append(probs)
            if i + 1 < gamma:
                draft_logits.append(draft(token.unsqueeze(1), at + i, draft_cache)[:, -1])
                draft_forwards += 1
        drafts = torch.stack(drafts, 1)  # (B, gamma)
        # 2. one target forward over the last token and the gamma drafts
        last = sequence[origin, at - 1].unsqueeze(1)
        target_logits = target(torch.cat([last, drafts], 1), at - 1, target_cache)  # (B, gamma+1, V)
        target_forwards += 1
        # 3. accept a prefix and add the correction or bonus token
        # probabilities from logits_to_probs are valid by construction (it rejects NaN logits), so the
        # sampler's O(B k V) value scan is skipped here; shapes and ids are still checked
        out = sampler(drafts, torch.stack(draft_probs, 1), logits_to_probs(target_logits, config),
                      generator, check_values=False)
        block = torch.where(active, out.num_accepted, -1).cpu()  # -1: the row was not decoding in this block
        if len(origin) < batch:  # rows were dropped: put each count back at its row of the batch
            block = torch.full((batch,), -1, dtype=torch.long).index_copy_(0, origin.cpu(), block)
        accepted_log.append(block)
        # 4. write the emitted tokens and move each row forward; nothing to undo in the caches
        positions = at.unsqueeze(1) + torch.arange(gamma + 1, device=device)
        emitted = out.tokens.to(device)
        keep = (emitted >= 0) & active.unsqueeze(1)  # finished rows are computed but never written
        sequence[origin.unsqueeze(1).expand_as(positions)[keep], positions[keep]] = emitted[keep]
        lengths = lengths + torch.where(active, out.num_emitted.to(device), 0)
        draft_behind = torch.where(out.num_accepted.to(device) == gamma, 2, 1)
    tokens = [sequence[b, len(row):len(row) + max_new_tokens].tolist() for b, row in enumerate(rows)]
    return DecodeResult(tokens=tokens, target_forwards=target_forwards, draft_forwards=draft_forwards,
                        seconds=time.perf_counter() - started, prefill_seconds=prefill_seconds,
                        accepted=accepted_log, gamma=gamma,
                        target_seconds=clock.seconds["target"] if time_forwards else float("nan"),
                        draft_seconds=clock.seconds["draft"] if time_forwards else float("nan"))


@torch.no_grad()
def exact_two_byte_law(target: GPT, prompt: Prompt, config: SamplingConfig = SamplingConfig()) -> torch.Tensor:
    """Return the exact law (256, 256) of the first two bytes the target emits after ``prompt``.

    One forward gives the first byte's distribution p1; one batched forward over the 256 possible first
    bytes gives each p2(. | a). The law is p1(a) p2(b | a), after the sampling transforms in ``config``.
    """
    ids = encode_prompts([prompt])[0]
    vocab = target.config.vocab_size
    if len(ids) + 1 > target.config.context:
        raise ValueError("the prompt leaves no room for two more bytes in the context")
    device = target.token_embedding.weight.device
    prefix = torch.tensor([ids], device=device)
    first = logits_to_probs(target(prefix)[:, -1], config)[0].double()  # (V,)
    extended = torch.cat([prefix.expand(vocab, -1), torch.arange(vocab, device=device).unsqueeze(1)], 1)
    second = logits_to_probs(target(extended)[:, -1], config).double()  # (V, V): row a is p2(. | a)
    law = first.unsqueeze(1) * second
    return law / law.sum()


@torch.no_grad()
def completion_bits_per_byte(target: GPT, prompts: Sequence[Prompt], completions: Sequence[Sequence[int]]) -> torch.Tensor:
    """Return, per row, the mean -log2 p(byte | context) the target assigns to the completion's bytes."""
    rows = encode_prompts(prompts)
    if len(rows) != len(completions):
        raise ValueError(f"{len(rows)} prompts but {len(completions)} completions")
    lengths = [len(r) + len(c) for r, c in zip(rows, completions)]
    if max(lengths) > target.config.context:
        raise ValueError("a prompt plus its completion exceeds the target's context")
    device = target.token_embedding.weight.device
    width = max(lengths)
    tokens = _padded([r + list(c) for r, c in zip(rows, completions)], width, device)
    logprobs = torch.log_softmax(target(tokens).double(), dim=-1)  # (B, width, V)
    out = []
    for b, (prompt, completion) in enumerate(zip(rows, completions)):
        start = len(prompt)
        picked = logprobs[b, start - 1:start - 1 + len(completion)].gather(
            -1, torch.tensor(list(completion), device=device).unsqueeze(1))
        out.append(-picked.mean() / torch.log(torch.tensor(2.0, dtype=torch.float64)))
    return torch.stack(out)
