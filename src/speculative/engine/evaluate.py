"""Reference laws and scores computed from full forwards of the target, with no cache and no sampler.

Explained in: notebooks/06_three_equalities (the exact law of the first bytes, task scores).

These are what decoding is checked against, so they share nothing with the decoding loop but the model
and :func:`transforms.logits_to_probs`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from speculative.engine.decode import Prompt, _padded, encode_prompts
from speculative.engine.model import GPT
from speculative.sampling.transforms import SamplingConfig, logits_to_probs

__all__ = ["exact_two_byte_law", "exact_sequence_law", "completion_bits_per_byte", "IdentifierTask",
           "identifier_tasks", "identifier_exact_match"]


@torch.no_grad()
def exact_two_byte_law(target: GPT, prompt: Prompt, config: SamplingConfig = SamplingConfig(), draft: GPT = None,
                       step: Callable = None) -> torch.Tensor:
    """Return the exact law (V, V) of the first two tokens emitted after ``prompt``.

    One forward gives the first token's distribution p1; one batched forward over the V possible first
    tokens gives each p2(. | a). The law is p1(a) p2(b | a), after the sampling transforms in ``config``:
    the target's own law, which a lossless decoder keeps. With ``draft`` and ``step``, it is the law of a
    decoder whose token at each position has the law ``step(p, q)`` (rows of p and q: the target's and
    the draft's distributions at that context), whatever happened at the position before: a verification
    rule whose slip is the same at every position (the resampling pitfall, say), not one whose law
    depends on where in a block the position falls.
    """
    if (draft is None) != (step is None):
        raise ValueError("pass draft and step together, or neither")
    vocab = target.config.vocab_size
    ids = encode_prompts([prompt], vocab)[0]
    if len(ids) + 1 > target.config.context:
        raise ValueError("the prompt leaves no room for two more tokens in the context")
    device = target.device
    prefix = torch.tensor([ids], device=device)
    extended = torch.cat([prefix.expand(vocab, -1), torch.arange(vocab, device=device).unsqueeze(1)], 1)
    first, second = (logits_to_probs(target(x)[:, -1], config).double() for x in (prefix, extended))
    if step is not None:
        first, second = (step(p, logits_to_probs(draft(x)[:, -1], config).double())
                         for p, x in ((first, prefix), (second, extended)))
    law = first[0].unsqueeze(1) * second  # row a: p1(a) p2(. | a)
    return law / law.sum()


@torch.no_grad()
def exact_sequence_law(target: GPT, prompt: Prompt, config: SamplingConfig, length: int,
                       max_sequences: int = 4096) -> tuple[dict[tuple[int, ...], float], float]:
    """Return (law, margin): the exact law of the first ``length`` tokens the target emits after ``prompt``.

    ``law`` maps each token sequence of positive probability to that probability (float64 products of
    the per-step probabilities under ``config``). It is enumerated over the support, one level per
    token, with one batched full forward (no cache) per level, so ``config`` must keep the support small
    (top-k, top-p or greedy); more than ``max_sequences`` sequences raises. ``margin`` is the smallest gap,
    over every context enumerated, between the lowest kept logit and the highest dropped one: when it is
    far above float rounding, a decoder whose forwards round differently still keeps the same tokens.
    """
    vocab = target.config.vocab_size
    ids = encode_prompts([prompt], vocab)[0]
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an integer >= 1, got {length!r}")
    if len(ids) + length - 1 > target.config.context:
        raise ValueError("the prompt leaves no room for that many tokens in the context")
    device = target.device
    frontier, margin = {(): 1.0}, float("inf")
    for _ in range(length):
        prefixes = list(frontier)
        tokens = torch.tensor([ids + list(p) for p in prefixes], device=device)
        logits = torch.cat([target(chunk)[:, -1] for chunk in tokens.split(256)])  # (N, V)
        probs = logits_to_probs(logits, config).double().cpu()
        kept = probs > 0
        if not kept.all():
            low = logits.float().masked_fill(~kept.to(device), float("inf")).amin(-1)
            high = logits.float().masked_fill(kept.to(device), float("-inf")).amax(-1)
            margin = min(margin, float((low - high).min()))
        grown = {}
        for row, prefix in enumerate(prefixes):
            for token in kept[row].nonzero().flatten().tolist():
                grown[prefix + (token,)] = frontier[prefix] * float(probs[row, token])
        if len(grown) > max_sequences:
            raise ValueError(f"the support grows past {max_sequences} sequences: restrict it (top-k, top-p)")
        frontier = grown
    return frontier, margin


@torch.no_grad()
def completion_bits_per_byte(target: GPT, prompts: Sequence[Prompt],
                             completions: Sequence[Sequence[int]]) -> torch.Tensor:
    """Return, per row, the mean -log2 p(byte | context) the target assigns to the completion's bytes."""
    rows = encode_prompts(prompts, target.config.vocab_size)
    if len(rows) != len(completions):
        raise ValueError(f"{len(rows)} prompts but {len(completions)} completions")
    lengths = [len(r) + len(c) for r, c in zip(rows, completions)]
    if max(lengths) > target.config.context:
        raise ValueError("a prompt plus its completion exceeds the target's context")
    device = target.device
    tokens = _padded([r + list(c) for r, c in zip(rows, completions)], max(lengths), device)
    logprobs = torch.log_softmax(target(tokens).double(), dim=-1)  # (B, width, V)
    out = []
    for b, (prompt, completion) in enumerate(zip(rows, completions)):
        start = len(prompt)
        picked = logprobs[b, start - 1:start - 1 + len(completion)].gather(
            -1, torch.tensor(list(completion), device=device).unsqueeze(1))
        out.append(-picked.mean() / torch.log(torch.tensor(2.0, dtype=torch.float64)))
    return torch.stack(out)


_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class IdentifierTask:
    """Complete the identifier that ``prompt`` ends inside of: the right answer is ``answer``."""

    prompt: bytes
    answer: bytes


def identifier_tasks(text: bytes, count: int, context: int = 96, typed: int = 2, min_length: int = 6,
                     max_length: int = 14, seed: int = 0) -> list[IdentifierTask]:
    """Return ``count`` identifier-completion tasks drawn from ``text`` (use held-out text).

    Each task is an identifier of ``min_length`` to ``max_length`` bytes whose first ``typed`` bytes end
    the prompt (``context`` bytes in all): the completion must supply the rest of that identifier, and
    nothing more, as a code editor's completion would. Chosen at random by ``seed``, without repeats.
    """
    if not 0 < typed < min_length <= max_length:
        raise ValueError(f"need 0 < typed < min_length <= max_length, got {typed}, {min_length}, {max_length}")
    found = [m for m in _IDENTIFIER.finditer(text)
             if m.start() >= context - typed and min_length <= len(m.group()) <= max_length]
    if len(found) < count:
        raise ValueError(f"text has {len(found)} identifiers of {min_length}-{max_length} bytes, {count} asked for")
    chosen = sorted(random.Random(seed).sample(range(len(found)), count))
    tasks = []
    for index in chosen:
        match = found[index]
        cut = match.start() + typed
        tasks.append(IdentifierTask(text[cut - context:cut], match.group()[typed:]))
    return tasks


def identifier_exact_match(tasks: Sequence[IdentifierTask], completions: Sequence[Sequence[int]]) -> torch.Tensor:
    """Return one bool per task: does the completion finish the identifier exactly?

    The completed identifier is the completion's leading run of identifier bytes; it must equal the
    answer and be followed by a byte that ends it (a completion still inside the identifier when it
    stops does not count).
    """
    if len(tasks) != len(completions):
        raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
    hits = []
    for task, tokens in zip(tasks, completions):
        out = bytes(tokens)
        run = re.match(rb"[A-Za-z0-9_]*", out).group()
        hits.append(run == task.answer and len(run) < len(out))
    return torch.tensor(hits, dtype=torch.bool)
