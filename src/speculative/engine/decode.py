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

Host synchronisation. Inputs are checked once, at the boundary (prompts, lengths, gamma, devices). Inside
the loop every tensor is made by the loop itself, so the models, ``logits_to_probs`` and the sampler run
with their value checks off, and every per-row decision is a ``torch.where``: one speculative block reads
back to the host once (rows finished, whether any logits were NaN or inf, which rows decode, and the
previous block's outcome, for the draft-length policy's states), and plain decoding reads nothing back
until its last token. On a GPU the work of a block is queued without a stall. A test counts these reads.
Timing is not done here: pass a :class:`timing.Clock`.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import torch

from speculative.engine.model import GPT, KVCache
from speculative.engine.policy import DraftPolicy, FixedLength
from speculative.engine.timing import NO_CLOCK, Clock
from speculative.sampling.sampler import categorical, greedy_verify, rule_sampler
from speculative.sampling.transforms import SamplingConfig, logits_problem, logits_to_probs, refuse_penalty

__all__ = ["DecodeResult", "DecodingError", "plain_decode", "speculative_decode", "encode_prompts", "check_room",
           "prefill", "reuse_prefills"]

Prompt = Union[bytes, str, Sequence[int]]


@dataclass
class DecodeResult:
    tokens: list[list[int]]  # generated tokens per row, exactly max_new_tokens each (prompt excluded)
    target_forwards: int = 0  # forward calls of the target (batched: one call serves every row)
    draft_forwards: int = 0
    accepted: list[torch.Tensor] = field(default_factory=list)  # per block: (B,) accepted drafts, -1 if inactive
    gamma: int = 0
    # from the clock, when one was passed (NaN otherwise): the whole call, the prompt forwards (both
    # models' for speculative decoding), and with Clock(forwards=True) the seconds inside the forward
    # calls after the prefill
    seconds: float = float("nan")
    prefill_seconds: float = float("nan")
    target_seconds: float = float("nan")
    draft_seconds: float = float("nan")
    timed_calls: dict = field(default_factory=dict)  # forward calls those seconds cover, per model name
    # per block, (B,) drafts each row verified (its own length), -1 if inactive (empty: multi-draft)
    lengths: list[torch.Tensor] = field(default_factory=list)

    def text(self, row: int = 0) -> str:
        return bytes(self.tokens[row]).decode("utf-8", errors="replace")

    def acceptance_rate(self) -> float:
        """Return alpha as measured: accepted drafts / drafts that were tested, over active rows
        (see :func:`stats.measured_acceptance_rate`)."""
        from speculative.sampling.stats import measured_acceptance_rate

        return measured_acceptance_rate(self.accepted, self.lengths if self.lengths else self.gamma)

    def tokens_per_block(self) -> float:
        """Return emitted tokens per target call per active row (accepted + 1, averaged)."""
        counts = torch.stack(self.accepted)
        return float((counts[counts >= 0] + 1).float().mean())


def _timed(result: DecodeResult, clock: Clock) -> DecodeResult:
    nan = float("nan")
    result.seconds = clock.marks.get("end", nan)
    result.prefill_seconds = clock.marks.get("prefill", nan)
    result.target_seconds = clock.seconds.get("target", nan)
    result.draft_seconds = clock.seconds.get("draft", nan)
    result.timed_calls = dict(clock.calls)
    return result


def encode_prompts(prompts: Sequence[Prompt], vocab_size: int = 256) -> list[list[int]]:
    """Return prompts as lists of token ids; raise on an empty list, an empty prompt or an id out of range.

    One prompt object repeated many times (``[prompt] * n``: the distribution tests decode thousands of
    rows of one prompt) is checked once; its rows share one list, which no caller writes to."""
    if isinstance(prompts, (bytes, str)) or not len(prompts):
        raise ValueError("prompts must be a non-empty list of prompts (bytes, str or lists of byte ids)")
    encoded, seen = [], {}
    for index, prompt in enumerate(prompts):
        if id(prompt) in seen:
            encoded.append(seen[id(prompt)])
            continue
        ids = list(prompt.encode("utf-8") if isinstance(prompt, str) else prompt)
        if not ids:
            raise ValueError(f"prompt {index} is empty: decoding needs at least one token of context")
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size for t in ids):
            raise ValueError(f"prompt {index} holds ids that are not integers in [0, {vocab_size})")
        seen[id(prompt)] = ids
        encoded.append(ids)
    return encoded


def check_room(model: GPT, prompts: list[list[int]], max_new_tokens: int, lookahead: int) -> None:
    """Raise ValueError unless the longest prompt, ``max_new_tokens`` and ``lookahead`` more positions (a
    block's drafts) fit in the model's context; ``prompts`` are encoded (:func:`encode_prompts`)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    context = model.config.context
    longest = max(len(p) for p in prompts)
    if longest > context:
        raise ValueError(f"a prompt of {longest} tokens is longer than the model's context of {context}")
    if longest + max_new_tokens + lookahead > context:
        raise ValueError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) + lookahead ({lookahead}) "
                         f"exceeds the model's context of {context}")


def _padded(rows: list[list[int]], width: int, device) -> torch.Tensor:
    """Return rows as a (len(rows), width) tensor: cut to ``width``, right-padded with zeros."""
    return torch.tensor([row[:width] + [0] * (width - len(row[:width])) for row in rows], dtype=torch.long,
                        device=device)


#: inside reuse_prefills(): (model id, prompts) -> ((model, device, weights' versions), keys, values)
_PREFILLS: Optional[dict] = None


@contextlib.contextmanager
def reuse_prefills():
    """Inside the block, :func:`prefill` computes the cache of one model on one list of prompts once and
    hands every later call a copy of it (several decoders run on the same prompts: a score compared
    across samplers). The prefill of a model whose weights changed in the meantime is computed again."""
    global _PREFILLS
    outer, _PREFILLS = _PREFILLS, {} if _PREFILLS is None else _PREFILLS
    try:
        yield
    finally:
        _PREFILLS = outer


def _prefill_unique(model: GPT, unique: list[tuple], length: int) -> KVCache:
    """The cache of positions 0 .. n-2 of each of the ``unique`` prompts, ``length`` positions long."""
    cache = model.new_cache(len(unique), length=length)
    width = max(len(p) for p in unique) - 1
    if width == 0:
        return cache
    state = None
    if _PREFILLS is not None:  # only inside the block: a wrapped model (hf.wrap) has no parameters to read
        key = (id(model), tuple(unique))
        state = (model, model.device, tuple(p._version for p in model.parameters()))
        stored = _PREFILLS.get(key)
        if stored is not None and stored[0][0] is model and stored[0][1:] == state[1:]:
            cache.keys[:, :, :width], cache.values[:, :, :width] = stored[1], stored[2]
            return cache
    model(_padded([list(p[:-1]) for p in unique], width, model.device), 0, cache, check=False)
    if state is not None:  # the positions the prefill wrote, copied; the model itself, so that an id reused
        # by another model after this one is freed cannot match
        _PREFILLS[key] = (state, cache.keys[:, :, :width].clone(), cache.values[:, :, :width].clone())
    return cache


@torch.no_grad()
def prefill(model: GPT, rows: list[list[int]], length: int) -> KVCache:
    """Return a cache of ``length`` positions holding positions 0 .. n-2 of every row (right-padded;
    padding is never attended). ``rows`` are checked token ids (see :func:`encode_prompts`).

    Identical prompts are prefilled once and their cache rows copied; inside :func:`reuse_prefills`, so
    are identical lists of prompts across calls.
    """
    device = model.device
    unique = sorted({tuple(p) for p in rows})
    slot = {p: i for i, p in enumerate(unique)}
    cache = _prefill_unique(model, unique, length)
    if len(unique) == len(rows) and all(slot[tuple(p)] == i for i, p in enumerate(rows)):
        return cache
    if len(unique) == 1:  # one prompt many times (the distribution tests): a broadcast copy is cheaper
        return cache.broadcast(len(rows))
    return cache.select(torch.tensor([slot[tuple(p)] for p in rows], device=device))


def _next_token(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator) -> torch.Tensor:
    """Return one token per row of ``logits`` (B, V) sampled under ``config``: greedily the arg-max itself
    (the one-hot's only token, with no distribution built and no uniform drawn), else by inverse CDF."""
    if config.greedy:
        return logits.argmax(dim=-1)
    return _sample(logits_to_probs(logits, config, check=False), generator)


def _sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Return one token per row of ``probs`` (B, V), by inverse-CDF sampling (no host read, never NaN)."""
    uniform = torch.rand(probs.shape[0], generator=generator, dtype=torch.float64, device=probs.device)
    return categorical(probs, uniform)


class DecodingError(RuntimeError):
    """A model misbehaved during decoding (NaN or +inf logits): not a bad input, a broken model."""


def _raise_if(problem: bool) -> None:
    if problem:
        raise DecodingError("a model produced NaN or +inf logits, or a row of logits entirely -inf, while decoding")


def _generator(generator: Optional[torch.Generator], device: torch.device) -> torch.Generator:
    if generator is None:
        return torch.Generator(device=device).manual_seed(0)
    if torch.device(generator.device).type != device.type:
        raise ValueError(f"the generator is on {generator.device} but the model is on {device}: "
                         "make it with torch.Generator(device=...)")
    return generator


@torch.no_grad()
def plain_decode(model: GPT, prompts: Sequence[Prompt], max_new_tokens: int,
                 config: SamplingConfig = SamplingConfig(), generator: Optional[torch.Generator] = None,
                 clock: Optional[Clock] = None) -> DecodeResult:
    """Return max_new_tokens tokens per prompt, sampled one at a time from the model (one forward each).

    ``clock`` (a :class:`timing.Clock`) records the prefill, the end and, if it times forwards, the
    seconds inside the model's calls; without one nothing is timed.
    """
    refuse_penalty(config)
    rows = encode_prompts(prompts, model.config.vocab_size)
    check_room(model, rows, max_new_tokens, lookahead=0)
    device = model.device
    generator = _generator(generator, device)
    clock = clock or NO_CLOCK
    clock.start()
    longest = max(len(r) for r in rows)
    cache = prefill(model, rows, length=longest + max_new_tokens)
    clock.mark("prefill")
    call = clock.wrap(model, "target")
    shared = len({len(r) for r in rows}) == 1  # every row at one position: a host int, a slice write
    lengths = torch.tensor([len(r) for r in rows], device=device)
    last = torch.tensor([r[-1] for r in rows], device=device)
    problem = torch.zeros((), dtype=torch.bool, device=device)
    generated = []
    for step in range(max_new_tokens):
        start = len(rows[0]) - 1 + step if shared else lengths - 1 + step
        logits = call(last.unsqueeze(1), start, cache, span=longest + step, check=False)[:, -1]  # (B, V)
        problem |= logits_problem(logits)
        last = _next_token(logits, config, generator)
        generated.append(last)
    _raise_if(bool(problem))
    tokens = torch.stack(generated, 1).tolist()
    clock.mark("end")
    prefilled = int(longest > 1)  # a prompt of one token needs no prefill forward
    return _timed(DecodeResult(tokens=tokens, target_forwards=max_new_tokens + prefilled), clock)


@torch.no_grad()
def speculative_decode(target: GPT, draft: GPT, prompts: Sequence[Prompt], max_new_tokens: int, gamma,
                       config: SamplingConfig = SamplingConfig(), generator: Optional[torch.Generator] = None,
                       sampler: Optional[Callable] = None, clock: Optional[Clock] = None,
                       rule: str = "token", per_row: bool = False) -> DecodeResult:
    """Return max_new_tokens tokens per prompt by speculative decoding with blocks of ``gamma`` drafts.

    The emitted tokens have the target's distribution under ``config`` (see the module docstring);
    draft and target go through the same :func:`logits_to_probs`. ``sampler`` is the verification rule
    (``rejection_sample``'s signature, called with ``check_values=False``); chapters swap in a biased one
    from ``pitfalls`` to show what a wrong rule does on a real model pair. ``rule`` names a lossless one
    instead: ``"token"`` (token-wise, the default) or ``"block"`` (block verification, Sun et al.); pass
    one of ``rule`` and ``sampler``. ``clock`` (a :class:`timing.Clock`) records the prefill, the end and,
    if it times forwards, the seconds inside each model's calls; without one nothing is timed.

    ``gamma`` is a draft-length policy (:mod:`policy`) that chooses each row's length before each block
    from that row's past, and may stop drafting after a token the draft was unsure of; a number is the
    fixed policy ``FixedLength(gamma)``. Rows of one batch draft in step, so the batch pays for its longest
    row's drafts and a target forward over all of them whatever each row asked for. By default the rows
    therefore share each block: its length is ``policy.batch_length`` of the decoding rows' states (the
    cost model: the length that maximises the batch's expected tokens per unit of time; the other
    policies: the longest any row asks for), drafting stops early only when every row's confidence stop
    has fired, and every row verifies every draft. That length depends on the other rows' pasts and
    drafts and, through a confidence stop, on this row's own drafts, never on this row's verification
    draws; ``exact.shared_batch_law`` enumerates rows sharing blocks and finds each row's output an
    independent draw from the target's law (tested for the shipped policies under either rule), and the
    engine law tests check it on the real pair. With ``per_row=True`` each row keeps its own length k
    instead (the others' extra drafts are padding, computed but never verified): the sampler verifies it
    as a block of k drafts (``lengths=``, which ``sampler`` must then take): under either rule its first
    k drafts are tested as usual and, if all pass, its next token is drawn from the target at position
    k + 1, exactly as a block of k drafts would end (block verification of k drafts is not the first k
    positions of a longer block's test). ``exact.adaptive_sequence_law`` checks the law of one row's
    policies, confidence stops included, by enumeration. A finished row riding along asks for nothing.
    ``lengths`` in the result holds each block's (B,) verified lengths, -1 where a row was not decoding.

    Host reads: one per block, which also brings the previous block's outcome back for the policy's
    states, and, for a policy that stops on confidence, one per draft step (to stop drafting when every
    row has stopped).
    """
    policy = _as_policy(gamma)
    # greedily, with the token-wise rule, p and q are one-hot: compare arg-maxes (sampler.greedy_verify,
    # the same outcome as rejection_sample on the one-hots) instead of building distributions
    fast_greedy = config.greedy and sampler is None and rule == "token"
    sampler = _verifier(sampler, rule, per_row)
    _check_pair(target, draft)
    refuse_penalty(config)
    rows = encode_prompts(prompts, target.config.vocab_size)
    for model in (target, draft):
        check_room(model, rows, max_new_tokens, lookahead=policy.max_gamma + 2)
    device, batch = target.device, len(rows)
    generator = _generator(generator, device)
    clock = clock or NO_CLOCK
    clock.start()
    longest = max(len(r) for r in rows)
    capacity = longest + max_new_tokens + policy.max_gamma + 2  # <= both contexts (checked above)
    target_cache, draft_cache = prefill(target, rows, length=capacity), prefill(draft, rows, length=capacity)
    clock.mark("prefill")
    target_call, draft_call = clock.wrap(target, "target"), clock.wrap(draft, "draft")
    target_forwards = draft_forwards = int(longest > 1)  # the prefill's forward, if the prompts needed one
    # (B, capacity + 1): prompt, then generated tokens; the last column is scratch, where the writes of
    # finished rows and of padding go instead of being masked out (a mask would need a host read)
    sequence, scratch = _padded(rows, capacity + 1, device), capacity
    # per decoding row (R of them): decoding row i is row origin[i] of the batch; ends[i] = n, its tokens so
    # far (prompt included); behind[i], the tokens its draft has not yet fed: 1, or 2 after a full block
    origin = torch.arange(batch, device=device)  # (R,)
    ends = torch.tensor([len(r) for r in rows], device=device)  # (R,)
    prompt_ends, behind = ends.clone(), torch.ones(batch, dtype=torch.long, device=device)  # (R,), (R,)
    problem = torch.zeros((), dtype=torch.bool, device=device)  # any NaN / inf logits so far
    states, origin_host = [policy.start() for _ in range(batch)], list(range(batch))  # on the host
    outcome, accepted_log, lengths_log = None, [], []  # outcome: (3, R), the last block's, not yet read
    bound = longest  # on the host: no row's n exceeds it (a block adds at most its drafts + 1)
    while True:
        active = ends - prompt_ends < max_new_tokens  # (R,)
        at = torch.where(active, ends, prompt_ends)  # (R,): where each row's block starts
        finished, bad, active_host, past, (at_host, behind_host) = _read(active, problem, outcome, at, behind)
        _raise_if(bad)
        for o, was_active, accepted, full in zip(origin_host, *past):  # the last block's outcome, per row
            if was_active:
                states[o] = policy.update(states[o], accepted, bool(full))
        if finished == len(active_host):
            break
        if finished and 2 * finished >= len(active_host):
            # half the rows are done: drop them (one copy of each cache) so that later blocks stop
            # computing them; below that, finished rows ride along, parked at their prompt. A stable
            # sort puts the active rows first, in order, without reading the mask back.
            keep = torch.argsort((~active).to(torch.int8), stable=True)[:len(active_host) - finished]
            target_cache, draft_cache = target_cache.select(keep), draft_cache.select(keep)
            origin, ends, prompt_ends, behind, active, at = (t[keep] for t in (origin, ends, prompt_ends, behind,
                                                                               active, at))
            origin_host, at_host, behind_host = ([v for v, a in zip(values, active_host) if a]
                                                 for values in (origin_host, at_host, behind_host))
            active_host = [1] * len(origin_host)
        block_gamma, row_gamma = _plan(policy, states, origin_host, active_host, per_row, device)  # int, (R,)
        span = min(bound + block_gamma + 1, capacity)  # every position this block writes lies below it
        # positions as host ints when the rows share them (slice writes), else as (R,) tensors
        start, lag = _shared(at_host, behind_host) or (at, behind)
        # 1. draft up to block_gamma tokens; the first step feeds the 1 or 2 tokens the draft has not seen
        first = start - lag  # rows behind by one also feed a padding slot at n, rewritten later
        if isinstance(first, int):
            unseen = sequence[origin, first:first + 2]  # (R, 2)
        else:
            unseen = torch.stack([sequence[origin, first], sequence[origin, first + 1]], 1)  # (R, 2)
        drafts, draft_probs, row_gamma, draft_problem = _draft_block(
            draft_call, draft_cache, unseen, first, lag, start, active, row_gamma, block_gamma, span, policy,
            config, generator, keep_probs=not fast_greedy)  # (R, k), (R, k, V) or None, (R,), ()
        block_gamma = drafts.shape[1]  # k: fewer than planned when every row stopped early
        draft_forwards += block_gamma  # one forward per draft (the first also feeds the unseen tokens)
        if not per_row:  # shared: every row verifies every draft
            row_gamma = torch.full_like(row_gamma, block_gamma)
        # 2. one target forward over the last token and the k drafts
        last = sequence[origin, start - 1:start] if isinstance(start, int) else sequence[origin, at - 1].unsqueeze(1)
        target_logits = target_call(torch.cat([last, drafts], 1), start - 1, target_cache, span=span,
                                    check=False)  # (R, k+1, V)
        problem = problem | draft_problem | logits_problem(target_logits)
        target_forwards += 1
        # 3. accept a prefix of each row's drafts and add the correction or bonus token; the inputs were
        # made here, so the sampler's value checks (each a host read) are off
        if fast_greedy:
            out = greedy_verify(drafts, target_logits.argmax(dim=-1), row_gamma if per_row else None)
        else:
            target_probs = logits_to_probs(target_logits, config, check=False)  # (R, k+1, V)
            out = sampler(drafts, draft_probs, target_probs, generator, check_values=False,
                          **({"lengths": row_gamma} if per_row else {}))
        num_accepted, emitted = out.num_accepted.to(device), out.tokens.to(device)  # (R,), (R, k+1)
        outcome = torch.stack([active.long(), num_accepted, (num_accepted == row_gamma).long()])  # (3, R)
        accepted_log.append(_in_batch(torch.where(active, num_accepted, -1), origin, batch))  # (B,)
        lengths_log.append(_in_batch(torch.where(active, row_gamma, -1), origin, batch))  # (B,)
        # 4. write the emitted tokens and move each row forward; nothing to undo in the caches
        ends, behind = _advance(sequence, scratch, origin, at, active, ends, emitted, num_accepted, block_gamma)
        bound = min(bound + block_gamma + 1, capacity)
    full = sequence.tolist()
    accepted, lengths = torch.stack([torch.stack(accepted_log), torch.stack(lengths_log)]).cpu()  # (blocks, B)
    tokens = [full[b][len(row):len(row) + max_new_tokens] for b, row in enumerate(rows)]
    clock.mark("end")
    return _timed(DecodeResult(tokens=tokens, target_forwards=target_forwards, draft_forwards=draft_forwards,
                               accepted=list(accepted.unbind(0)), gamma=policy.max_gamma,
                               lengths=list(lengths.unbind(0))), clock)


def _as_policy(gamma) -> DraftPolicy:
    """Return ``gamma`` as a draft-length policy: a policy as it is, a number as ``FixedLength``."""
    if isinstance(gamma, DraftPolicy):
        return gamma
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1 or a draft-length policy, got {gamma!r}")
    return FixedLength(gamma)


def _verifier(sampler: Optional[Callable], rule: str, per_row: bool) -> Callable:
    """Return the verification rule: ``sampler``, or the lossless rule called ``rule``."""
    if sampler is None:
        return rule_sampler(rule)
    if rule != "token":
        raise ValueError(f"pass either rule={rule!r} or a sampler, not both")
    parameters = inspect.signature(sampler).parameters.values()
    if per_row and not any(p.name == "lengths" or p.kind is p.VAR_KEYWORD for p in parameters):
        raise ValueError("per_row=True verifies each row at its own length: the sampler must take lengths= "
                         "(as sampler.rejection_sample does)")
    return sampler


def _check_pair(target: GPT, draft: GPT) -> None:
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(f"vocabulary mismatch: target has {target.config.vocab_size} tokens, "
                         f"draft has {draft.config.vocab_size}")
    if target.device != draft.device:
        raise ValueError(f"target is on {target.device} but draft is on {draft.device}: put both on one device")


def _read(active: torch.Tensor, problem: torch.Tensor, outcome: Optional[torch.Tensor], at: torch.Tensor,
          behind: torch.Tensor):
    """Return, in one host read: how many rows are finished, whether any logits were bad, which rows
    decode (a list of 0/1), the last block's (3, R) outcome as three lists (empty before the first), and
    each row's next block start ``at`` and ``behind`` (two lists)."""
    count = len(active)
    parts = [(~active).sum().unsqueeze(0), problem.long().unsqueeze(0), active.long(), at, behind]
    host = torch.cat(parts + ([] if outcome is None else [outcome.reshape(-1)])).tolist()
    rows = [host[2 + i * count:2 + (i + 1) * count] for i in range(3)]
    past = host[2 + 3 * count:]
    return host[0], host[1], rows[0], [past[i * count:(i + 1) * count] for i in range(3)], rows[1:]


def call_positions(starts: Sequence[int], device) -> int | torch.Tensor:
    """Return start positions as the decoding loop passes them to a forward: one host int when every row
    starts at the same position (the caches are then written by slices), else a (B,) tensor. Timings
    of single steps use it, so that they time the forward the loop runs."""
    starts = list(starts)
    return starts[0] if len(set(starts)) == 1 else torch.tensor(starts, device=device)


def _shared(at_host: list, behind_host: list) -> Optional[tuple[int, int]]:
    """Return (at, behind) when every row's block starts at one position and feeds its draft as many
    unseen tokens (one prompt length, or batch 1): the block's forwards then take int positions, which
    write the caches by slices instead of scattering by index. None when the rows differ."""
    if len(set(at_host)) == 1 and len(set(behind_host)) == 1:
        return at_host[0], behind_host[0]
    return None


def _plan(policy: DraftPolicy, states: list, origin_host: list, active_host: list, per_row: bool, device):
    """Return the block's length (the longest asked for) and each row's (R,), from the decoding rows'
    states: shared, one length for them all; per row, each its own; a finished row is given 1."""
    decoding = [states[o] for o, a in zip(origin_host, active_host) if a]
    asked = [policy.length(state) for state in decoding] if per_row else [policy.batch_length(decoding)]
    if any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= policy.max_gamma for k in asked):
        raise ValueError(f"the policy {policy.describe()} asked for draft lengths {sorted(set(asked))}; "
                         f"each must be an integer in [1, {policy.max_gamma}]")
    own = iter(asked if per_row else asked * len(decoding))
    return max(asked), torch.tensor([next(own) if a else 1 for a in active_host], device=device)


def _draft_block(call, cache: KVCache, unseen: torch.Tensor, first, behind, at, active: torch.Tensor,
                 row_gamma: torch.Tensor, block_gamma: int, span: int, policy: DraftPolicy, config: SamplingConfig,
                 generator: torch.Generator, keep_probs: bool = True):
    """Return up to ``block_gamma`` drafts per row (R, k), the q each was sampled from (R, k, V; None
    unless ``keep_probs``), each row's length after its confidence stops (R,), and whether any draft
    logits were bad. Greedily without ``keep_probs`` a draft is the arg-max itself, no q built.

    ``unseen`` (R, 2) are the tokens from position ``first`` on, of which the draft has not fed the last
    ``behind``, and the block starts at ``at``: (R,) tensors, or ints when every row shares them (the
    forwards then write the cache by slices); drafting stops early, at k < block_gamma, only when every
    decoding row has stopped. The draft's logits are checked for NaN / inf once, all steps together."""
    logits = call(unseen, first, cache, span=span, check=False)
    if isinstance(behind, int):  # every row at one position
        draft_logits = logits[:, behind - 1]  # (R, V) at position n - 1
    else:
        draft_logits = logits[torch.arange(len(at), device=at.device), behind - 1]
    seen = [draft_logits]  # every step's logits, checked together at the end (one check, not one per step)
    confident = type(policy).stop_after is not DraftPolicy.stop_after  # it may stop drafting early
    drafts, draft_probs = [], []
    for i in range(block_gamma):
        if keep_probs or not config.greedy:
            probs = logits_to_probs(draft_logits, config, check=False)  # (R, V)
            token = _sample(probs, generator)  # (R,)
            draft_probs.append(probs)
        else:
            token = draft_logits.argmax(dim=-1)  # (R,): the one-hot q's token
        drafts.append(token)
        if confident:  # stop right after a token the draft was unsure of
            # its probability under q; when decoding greedily q is one-hot, so (as transformers does)
            # under the draft's softmax at temperature 1
            sure = probs if config.temperature > 0 else torch.softmax(draft_logits.float(), -1)
            stop = policy.stop_after(sure.gather(1, token.unsqueeze(1)).squeeze(1))
            row_gamma = torch.where(stop & (row_gamma > i + 1), i + 1, row_gamma)
            if i + 1 < block_gamma and not bool(((row_gamma > i + 1) & active).any()):  # a host read
                break
        if i + 1 < block_gamma:
            draft_logits = call(token.unsqueeze(1), at + i, cache, span=span, check=False)[:, -1]  # (R, V)
            seen.append(draft_logits)
    problem = logits_problem(torch.stack(seen))
    return torch.stack(drafts, 1), torch.stack(draft_probs, 1) if draft_probs else None, row_gamma, problem


def _advance(sequence: torch.Tensor, scratch: int, origin: torch.Tensor, at: torch.Tensor, active: torch.Tensor,
             ends: torch.Tensor, emitted: torch.Tensor, num_accepted: torch.Tensor, block_gamma: int):
    """Write a block's emitted tokens (R, k+1; -1 past each row's last) into ``sequence`` from each row's
    ``at``, and return each row's new end and how many tokens its draft has not yet fed (``behind``: 2
    after a full block, else 1). A finished row's writes go to the ``scratch`` column."""
    write = (emitted >= 0) & active.unsqueeze(1)  # (R, k+1): finished rows are computed, never written
    columns = torch.where(write, at.unsqueeze(1) + torch.arange(block_gamma + 1, device=at.device), scratch)
    sequence[origin.unsqueeze(1).expand_as(columns), columns] = emitted.clamp(min=0)
    return ends + torch.where(active, num_accepted + 1, 0), torch.where(num_accepted == block_gamma, 2, 1)


def _in_batch(values: torch.Tensor, origin: torch.Tensor, batch: int) -> torch.Tensor:
    """Return (B,) ``values`` of the decoding rows at their rows of the batch, -1 at the rows dropped."""
    if len(origin) == batch:
        return values
    return torch.full((batch,), -1, dtype=values.dtype, device=values.device).index_copy_(0, origin, values)
