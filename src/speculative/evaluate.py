"""Reference laws and scores computed from full forwards of the target, with no cache and no sampler.

Explained in: notebooks/06_three_equalities (the exact law of the first bytes, task scores) and
notebooks/08_decoding_demo (a distribution check on the benchmark's model).

These are what decoding is checked against, so they share nothing with the decoding loop but the model
and :func:`transforms.logits_to_probs`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .decode import Prompt, _padded, encode_prompts
from .model import GPT
from .transforms import SamplingConfig, logits_to_probs

__all__ = ["exact_two_byte_law", "completion_bits_per_byte"]


@torch.no_grad()
def exact_two_byte_law(target: GPT, prompt: Prompt, config: SamplingConfig = SamplingConfig()) -> torch.Tensor:
    """Return the exact law (V, V) of the first two tokens the target emits after ``prompt``.

    One forward gives the first token's distribution p1; one batched forward over the V possible first
    tokens gives each p2(. | a). The law is p1(a) p2(b | a), after the sampling transforms in ``config``.
    """
    vocab = target.config.vocab_size
    ids = encode_prompts([prompt], vocab)[0]
    if len(ids) + 1 > target.config.context:
        raise ValueError("the prompt leaves no room for two more tokens in the context")
    device = target.device
    prefix = torch.tensor([ids], device=device)
    first = logits_to_probs(target(prefix)[:, -1], config)[0].double()  # (V,)
    extended = torch.cat([prefix.expand(vocab, -1), torch.arange(vocab, device=device).unsqueeze(1)], 1)
    second = logits_to_probs(target(extended)[:, -1], config).double()  # (V, V): row a is p2(. | a)
    law = first.unsqueeze(1) * second
    return law / law.sum()


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
