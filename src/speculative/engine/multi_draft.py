"""Multi-draft speculative decoding: several draft chains per block for one prompt, verified as a tree whose
root has ``drafts`` candidates and whose other nodes have one child.

Explained in: notebooks/10_beyond_one_draft. It runs on :mod:`decode`'s caches, prefill and checks; the
chains are rows of one batch, so it needs no attention code of its own.
"""

from __future__ import annotations

from typing import Optional

import torch

from speculative.engine.decode import (
    DecodeResult,
    Prompt,
    _check_pair,
    _generator,
    _raise_if,
    _sample,
    _timed,
    check_room,
    encode_prompts,
    prefill,
)
from speculative.engine.model import GPT
from speculative.engine.timing import NO_CLOCK, Clock
from speculative.sampling.sampler import _check_scheme, draw_candidates, multi_draft_sample, rejection_sample
from speculative.sampling.transforms import SamplingConfig, logits_problem, logits_to_probs, refuse_penalty

__all__ = ["multi_draft_decode"]


@torch.no_grad()
def multi_draft_decode(target: GPT, draft: GPT, prompt: Prompt, max_new_tokens: int, gamma: int, drafts: int,
                       config: SamplingConfig = SamplingConfig(), generator: Optional[torch.Generator] = None,
                       scheme: str = "with_replacement", clock: Optional[Clock] = None) -> DecodeResult:
    """Return max_new_tokens tokens after one prompt by speculative decoding with ``drafts`` chains per block.

    Each block drafts ``drafts`` chains of ``gamma`` tokens from the same context, as ``drafts`` rows of one
    batch: their first tokens are drawn together by ``scheme`` (:func:`sampler.draw_candidates`: i.i.d.,
    without replacement, or q's top-k), the rest of each chain from q along that chain. The target scores
    every chain in **one** batched forward. The first tokens form the root of a tree whose other nodes have
    one child: the root is verified by :func:`sampler.multi_draft_sample` with the same scheme; if a
    candidate is accepted, its chain (drafted from q at the context it extends, independently of the
    other chains) is verified token-wise by :func:`sampler.rejection_sample`. Exact law:
    :func:`multi_draft.tree_law` with branching ``(drafts, 1, ..., 1)``, lossless for the three right schemes.

    Why batch rows and not a tree attention mask: the engine's caches, forwards and rollback already work
    per row, so the chains need no new attention code; the price is that each chain recomputes nothing
    shared but also shares nothing (the prefix is held ``drafts`` times in the caches), and after each
    block the chosen chain's new cache positions are copied to the other rows (a slice of gamma + 1
    positions, not the whole cache). One prompt per call: its chains are the batch. ``accepted`` counts
    the accepted drafts of each block (0 when every root candidate is rejected).
    """
    if not isinstance(target, GPT) or not isinstance(draft, GPT):
        raise TypeError("multi_draft_decode copies cache slices between rows and runs the library's GPT only, "
                        "not a wrapped transformers model")
    _check_scheme(scheme)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
    if isinstance(drafts, bool) or not isinstance(drafts, int) or drafts < 1:
        raise ValueError(f"drafts (chains per block) must be an integer >= 1, got {drafts!r}")
    if isinstance(prompt, (list, tuple)) and prompt and not isinstance(prompt[0], int):
        raise ValueError("multi_draft_decode takes one prompt (its chains are the batch), not a list of prompts")
    _check_pair(target, draft)
    refuse_penalty(config)
    row = encode_prompts([prompt], target.config.vocab_size)[0]
    check_room(target, [row], max_new_tokens, lookahead=gamma + 2)
    check_room(draft, [row], max_new_tokens, lookahead=gamma + 2)
    device = target.device
    generator = _generator(generator, device)
    clock = clock or NO_CLOCK
    clock.start()
    capacity = len(row) + max_new_tokens + gamma + 2
    target_cache = prefill(target, [row] * drafts, length=capacity)
    draft_cache = prefill(draft, [row] * drafts, length=capacity)
    clock.mark("prefill")
    target_call, draft_call = clock.wrap(target, "target"), clock.wrap(draft, "draft")
    target_forwards = draft_forwards = int(len(row) > 1)
    sequence = list(row)
    behind = 1  # tokens the draft has not yet fed: 1, or 2 after a fully accepted block
    problem = torch.zeros((), dtype=torch.bool, device=device)
    accepted_log = []
    while len(sequence) - len(row) < max_new_tokens:
        n = len(sequence)
        span = n + gamma + 1
        # 1. draft: every row feeds the same unseen tokens, then its own chain
        chunk = torch.tensor([sequence[n - behind:n]], device=device).expand(drafts, -1)
        draft_logits = draft_call(chunk, n - behind, draft_cache, span=span, check=False)[:, -1]
        problem |= logits_problem(draft_logits)
        draft_forwards += 1
        root_q = logits_to_probs(draft_logits, config, check=False)  # (k, V), the same in every row
        candidates = draw_candidates(root_q[:1], drafts, scheme, generator)  # (1, k), -1: nothing left to draw
        token = torch.where(candidates[0] >= 0, candidates[0], candidates[0, 0])
        chain, chain_q = [token], [root_q]
        for i in range(1, gamma):
            draft_logits = draft_call(token.unsqueeze(1), n + i - 1, draft_cache, span=span, check=False)[:, -1]
            problem |= logits_problem(draft_logits)
            draft_forwards += 1
            probs = logits_to_probs(draft_logits, config, check=False)
            token = _sample(probs, generator)
            chain.append(token)
            chain_q.append(probs)
        chains, chain_q = torch.stack(chain, 1), torch.stack(chain_q, 1)  # (k, gamma), (k, gamma, V)
        # 2. one target forward over the last token and every chain
        last = torch.full((drafts, 1), sequence[-1], dtype=torch.long, device=device)
        target_logits = target_call(torch.cat([last, chains], 1), n - 1, target_cache, span=span, check=False)
        problem |= logits_problem(target_logits)
        target_forwards += 1
        target_probs = logits_to_probs(target_logits, config, check=False)  # (k, gamma + 1, V)
        # 3. the root: one of the k candidates, or a token of the final residual
        root = multi_draft_sample(candidates, root_q[:1], target_probs[:1, 0], generator, scheme=scheme)
        chosen, first, bad = torch.stack([root.chosen[0], root.token[0], problem.long()]).tolist()  # host read
        _raise_if(bad)
        if chosen < 0:
            emitted, count, source = [first], 0, 0
        else:  # then token-wise along the chosen chain
            j = slice(chosen, chosen + 1)
            if gamma > 1:
                rest = rejection_sample(chains[j, 1:], chain_q[j, 1:], target_probs[j, 1:], generator,
                                        check_values=False)
                tail, count = rest.rows()[0], 1 + int(rest.num_accepted[0])
            else:
                tail, count = [int(_sample(target_probs[j, 1], generator)[0])], 1
            emitted, source = [first] + tail, chosen
        accepted_log.append(torch.tensor([count]))
        # 4. every row continues from the chosen chain: copy its freshly written positions to the others
        for cache, low in ((target_cache, n - 1), (draft_cache, n - behind)):
            cache.keys[:, :, low:span] = cache.keys[:, source:source + 1, low:span]
            cache.values[:, :, low:span] = cache.values[:, source:source + 1, low:span]
        sequence += emitted
        behind = 2 if count == gamma else 1
    _raise_if(bool(problem))
    clock.mark("end")
    tokens = [sequence[len(row):len(row) + max_new_tokens]]
    return _timed(DecodeResult(tokens=tokens, target_forwards=target_forwards, draft_forwards=draft_forwards,
                               accepted=accepted_log, gamma=gamma), clock)
