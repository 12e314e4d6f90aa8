"""The decoding loop's pieces timed apart from any decoding run: the calibration behind the cost model and
the profile of one block.

Explained in: notebooks/07_cost_model (the calibration) and notebooks/14_which_draft (the block profile).

:func:`calibrate_steps` times each step of the loops (a plain step, a draft step, a verification, a block)
at the middle of a run, so that a benchmark can predict its speedup from timings none of its runs made;
its raw seconds become c and v in :func:`costs.calibration_costs`. :func:`profile_block` times the parts
of one speculative block (draft forwards and sampling, the target's forward, the verification, the
bookkeeping, the host read) and whole runs with their forwards timed, to say where a block's time goes.
``_forward_costs`` times the forwards alone, for the benchmarks' ``forward_costs``.
"""

from __future__ import annotations

import statistics
from typing import Callable, Optional

import torch

from speculative import defaults
from speculative.engine.decode import (
    _advance,
    _next_token,
    _read,
    _sample,
    call_positions,
    plain_decode,
    prefill,
    speculative_decode,
)
from speculative.engine.multi_draft import multi_draft_decode
from speculative.engine.timing import Clock, median_call_seconds
from speculative.measure.costs import calibration_costs
from speculative.sampling.sampler import greedy_verify, rejection_sample, rule_sampler
from speculative.sampling.transforms import logits_problem, logits_to_probs

__all__ = ["calibrate_steps", "profile_block"]


def _forward_costs(pair, rows: list[list[int]], gammas) -> dict:
    """Return median seconds of: one draft token, one target token, and target over gamma+1 tokens,
    each call timed alone, back to back, by ``torch.utils.benchmark.Timer``."""
    device = pair.target.device
    start = call_positions([len(r) - 1 for r in rows], device)
    token = torch.tensor([[r[-1]] for r in rows], device=device)

    def median_time(model, tokens):
        # attend over the positions a first block does (the loop bounds its span the same way)
        span = max(len(r) for r in rows) + tokens.shape[1]
        cache = prefill(model, rows, length=span)
        with torch.no_grad():
            return median_call_seconds(lambda: model(tokens, start, cache, span=span, check=False))

    out = {"draft_1": median_time(pair.draft, token), "target_1": median_time(pair.target, token)}
    for gamma in gammas:
        out[f"target_{gamma + 1}"] = median_time(pair.target, token.repeat(1, gamma + 1))
    return out


def _mid_run(pair, rows: list[list[int]], max_new_tokens: int, gamma: int):
    """Return (span, {"target", "draft"}: caches, start, last token (B, 1)) for timing one step at the
    middle of a run: half of ``max_new_tokens`` past each prompt, with room for a block of ``gamma``;
    ``start`` is passed as the loop passes it (``decode.call_positions``: an int when the rows share it). The
    caches really hold the positions before the step (the prompt, then its last token repeated), as a
    wrapped transformers model needs; the library's GPT would attend over the zeros there just as fast."""
    device = pair.target.device
    middle = max_new_tokens // 2
    span = max(len(r) for r in rows) + middle + gamma + 1
    held = [r + r[-1:] * middle for r in rows]
    caches = {"target": prefill(pair.target, held, length=span), "draft": prefill(pair.draft, held, length=span)}
    start = call_positions([len(r) - 1 for r in held], device)
    last = torch.tensor([[r[-1]] for r in rows], device=device)
    return span, caches, start, last


def _calibration_decodes(pair, decode_rows, batch: int, gammas, config, max_new_tokens: int,
                         generator: torch.Generator, rule: str, chains: Optional[int] = None,
                         scheme: str = "with_replacement") -> dict[str, Callable[[], float]]:
    """Return the whole decoding calls :func:`calibrate_steps` times on ``decode_rows`` (none without
    them): ``plain_decoded`` (seconds per step, one token per row) and ``block_decoded_<gamma>`` (seconds
    per block), each timed from after its prefill to its end. With ``chains`` given the blocks are
    multi-draft decoding's (``chains`` chains after one prompt, 1 included, the root drawn by ``scheme``)
    and ``decode_rows`` holds that one prompt, whose plain decoding they are compared with."""
    if decode_rows is None:
        return {}
    rows_wanted = batch if chains is None else 1
    if len(decode_rows) != rows_wanted:
        raise ValueError(f"decode_rows must hold {rows_wanted} row(s) for this calibration, got {len(decode_rows)}")

    def decoded(gamma):
        def call() -> float:
            clock = Clock(pair.target.device)
            if gamma is None:
                result = plain_decode(pair.target, decode_rows, max_new_tokens, config, generator, clock=clock)
                return (result.seconds - result.prefill_seconds) / max_new_tokens
            if chains is not None:
                result = multi_draft_decode(pair.target, pair.draft, decode_rows[0], max_new_tokens, gamma, chains,
                                            config, generator, scheme=scheme, clock=clock)
            else:
                result = speculative_decode(pair.target, pair.draft, decode_rows, max_new_tokens, gamma, config,
                                            generator, clock=clock, rule=rule)
            return (result.seconds - result.prefill_seconds) / len(result.accepted)
        return call

    return {"plain_decoded": decoded(None), **{f"block_decoded_{g}": decoded(g) for g in gammas}}


@torch.no_grad()
def calibrate_steps(pair, rows: list[list[int]], gammas, config, max_new_tokens: int,
                    repeats: int = defaults.BENCH_DECODE["calibration_repeats"], seed: int = 0,
                    rule: str = "token", decode_rows: Optional[list[list[int]]] = None, chains: Optional[int] = None,
                    scheme: str = "with_replacement") -> dict:
    """Return the median seconds of each step of the decoding loops, timed apart from any decoding run.

    A step is what the loops do per call, not the forward alone: a plain step is one target forward,
    its NaN check, ``logits_to_probs`` and a sample; a draft step the same with the draft; a verification
    step at gamma is a target forward over gamma + 1 positions, ``logits_to_probs``, the sampler and the
    block's one host read; a block at gamma is gamma draft steps followed by a verification step, timed
    as one unit, since a forward that runs right after another model's forwards finds colder caches than
    one repeated alone. Each is timed at the middle of a run (half of ``max_new_tokens`` past the
    prompt), with ``torch.utils.benchmark.Timer``; the steps are interleaved and the whole round is
    repeated ``repeats`` times, and the median of each is kept, so that drift on a shared machine hits
    every step alike. Returned, relative to the plain step: c (a draft step), v(gamma) (a block minus its
    draft steps: the verification as the loop pays for it) and v_alone(gamma) (a verification step
    repeated alone). ``rule`` is the verification rule whose sampler the verification step runs. The
    raw rounds are returned too (``rounds``), and the costs come from :func:`costs.calibration_costs`.

    ``decode_rows`` (token ids, as many rows as ``rows``; prompts that the measured runs do not decode)
    adds, to every round, whole decoding calls of ``max_new_tokens`` on them, timed without the prefill:
    ``plain_decoded``, plain decoding's seconds per step (one token per row), and ``block_decoded_<gamma>``,
    speculative decoding's seconds per block at each gamma. Those blocks pay everything the loop pays
    (writing the emitted tokens, moving positions, planning the next block, logging, its Python, the
    caches as a whole run leaves them), which the blocks timed above in a loop of their own leave out;
    their analysis is ``decoded`` in :func:`costs.calibration_costs`. For multi-draft decoding (``chains``
    given, 1 included), ``rows`` holds ``chains`` copies of one prompt and ``decode_rows`` one held-out
    prompt, decoded plainly and with ``chains`` chains per block (``scheme``).
    """
    device = pair.target.device
    generator = torch.Generator(device=device).manual_seed(seed)
    span, caches, start, last = _mid_run(pair, rows, max_new_tokens, max(gammas))
    vocab = pair.target.config.vocab_size
    sampler = rule_sampler(rule)
    fast_greedy = config.greedy and rule == "token"

    def single(name):
        model, cache = getattr(pair, name), caches[name]
        # plain decoding always takes the arg-max greedily; a draft step only where the loop's fast path does
        quick = name == "target" or fast_greedy

        def step():
            logits = model(last, start, cache, span=span, check=False)[:, -1]
            logits_problem(logits)
            if quick:
                _next_token(logits, config, generator)
            else:
                _sample(logits_to_probs(logits, config, check=False), generator)
        return step

    def verify(gamma):
        tokens = last.repeat(1, gamma + 1)
        draft_probs = torch.full((len(rows), gamma, vocab), 1.0 / vocab, device=device)

        def step():
            logits = pair.target(tokens, start, caches["target"], span=span, check=False)
            problem = logits_problem(logits)
            if fast_greedy:  # as the loop verifies greedily under the token-wise rule
                out = greedy_verify(tokens[:, 1:], logits.argmax(dim=-1))
            else:
                out = sampler(tokens[:, 1:], draft_probs, logits_to_probs(logits, config, check=False),
                              generator, check_values=False)
            torch.stack([out.num_accepted.sum(), problem.long()]).tolist()  # the block's host read
        return step

    def block(gamma):  # gamma draft steps, then the verification, as the loop runs them
        draft_step, verify_step = single("draft"), verify(gamma)

        def step():
            for _ in range(gamma):
                draft_step()
            verify_step()
        return step

    steps = {"plain": single("target"), "draft": single("draft"),
             **{f"verify_{g}": verify(g) for g in gammas}, **{f"block_{g}": block(g) for g in gammas}}
    decodes = _calibration_decodes(pair, decode_rows, len(rows), gammas, config, max_new_tokens, generator, rule,
                                   chains, scheme)
    rounds = {name: [] for name in (*steps, *decodes)}
    for _ in range(repeats):
        for name, step in steps.items():
            rounds[name].append(median_call_seconds(step, min_run_time=0.2))
        for name, decode in decodes.items():
            rounds[name].append(decode())
    seconds = {name: statistics.median(times) for name, times in rounds.items()}
    return calibration_costs({"seconds": seconds, "rounds": rounds, "repeats": repeats})


@torch.no_grad()
def profile_block(pair, rows: list[list[int]], gamma: int, config, max_new_tokens: int = 128,
                  repeats: int = 5, seed: int = 0, fast_greedy: bool = True) -> dict:
    """Return where a speculative block's time goes: raw median seconds of its parts, each timed alone,
    and of whole decoding runs with their forwards timed inside them.

    The parts, as ``decode.speculative_decode`` runs them at a fixed ``gamma`` on ``rows`` (token ids):
    ``draft_forwards`` (gamma one-token draft forwards), ``draft_sampling`` (gamma times
    ``logits_to_probs`` and a sample, or greedily the arg-max), ``target_forward`` (gamma + 1 positions),
    ``verification`` (the NaN check, ``logits_to_probs`` and the sampler, or greedily
    ``sampler.greedy_verify``), ``bookkeeping`` (the block's gathers, writes and position updates) and
    ``host_read`` (the block's one read back). Each round times every part once, interleaved; the
    medians over ``repeats`` rounds are kept. ``runs`` holds ``repeats`` whole decoding calls of
    ``max_new_tokens`` (decode seconds, seconds inside forwards, blocks): their share outside the
    forwards is what the parts beyond the forwards add up to, in the loop as it runs. With
    ``fast_greedy=False`` a greedy block is profiled as it ran before the greedy fast path: one-hot
    distributions built, sampled and verified by ``sampler.rejection_sample`` (the loop takes that path
    when the sampler is passed explicitly).
    """
    device = pair.target.device
    generator = torch.Generator(device=device).manual_seed(seed)
    span, caches, start, last = _mid_run(pair, rows, max_new_tokens, gamma)
    drafts = last.repeat(1, gamma)
    draft_logits = pair.draft(last, start, caches["draft"], span=span, check=False)[:, -1]
    target_logits = pair.target(last.repeat(1, gamma + 1), start, caches["target"], span=span, check=False)
    draft_probs = logits_to_probs(draft_logits, config, check=False).unsqueeze(1).repeat(1, gamma, 1)
    sequence = torch.zeros(len(rows), span + 1, dtype=torch.long, device=device)
    ends = torch.as_tensor(start, device=device).expand(len(rows)) + 1
    active, origin = torch.ones(len(rows), dtype=torch.bool, device=device), torch.arange(len(rows), device=device)

    def draft_forwards():
        for i in range(gamma):
            pair.draft(last, start + i, caches["draft"], span=span, check=False)

    fast = fast_greedy and config.greedy

    def draft_sampling():
        for _ in range(gamma):
            if fast:
                _next_token(draft_logits, config, generator)
            else:
                _sample(logits_to_probs(draft_logits, config, check=False), generator)

    def target_forward():
        pair.target(torch.cat([last, drafts], 1), start, caches["target"], span=span, check=False)

    def verification():
        logits_problem(target_logits)
        if fast:
            return greedy_verify(drafts, target_logits.argmax(dim=-1))
        return rejection_sample(drafts, draft_probs, logits_to_probs(target_logits, config, check=False), generator,
                                check_values=False)

    out = verification()

    def bookkeeping():  # the gathers of the unseen and last tokens, the outcome, the logs and the writes
        at = torch.where(active, ends, ends)
        if isinstance(start, int):  # rows at one position (batch 1, say), as decode._shared passes them
            sequence[origin, start:start + 2], sequence[origin, start:start + 1]
        else:
            torch.stack([sequence[origin, at - 1], sequence[origin, at]], 1), sequence[origin, at - 1].unsqueeze(1)
        num_accepted, emitted = out.num_accepted, out.tokens
        outcome = torch.stack([active.long(), num_accepted, (num_accepted == gamma).long()])
        torch.where(active, num_accepted, -1), torch.where(active, num_accepted, -1)
        _advance(sequence, span, origin, at, active, ends, emitted, num_accepted, gamma)
        return outcome

    outcome = bookkeeping()
    parts = {"draft_forwards": draft_forwards, "draft_sampling": draft_sampling, "target_forward": target_forward,
             "verification": verification, "bookkeeping": bookkeeping,
             "host_read": lambda: _read(active, logits_problem(target_logits), outcome, ends, ends)}
    rounds = {name: [] for name in parts}
    runs = []
    for repeat in range(repeats):
        for name, part in parts.items():
            rounds[name].append(median_call_seconds(part, min_run_time=0.1))
        clock = Clock(device, forwards=True)
        result = speculative_decode(pair.target, pair.draft, rows, max_new_tokens, gamma, config,
                                    torch.Generator(device=device).manual_seed(seed + repeat), clock=clock,
                                    sampler=None if fast else rejection_sample)
        runs.append({"decode_seconds": result.seconds - result.prefill_seconds,
                     "forward_seconds": result.target_seconds + result.draft_seconds,
                     "blocks": len(result.accepted)})
    return {"gamma": gamma, "temperature": config.temperature, "batch": len(rows), "repeats": repeats,
            "fast_greedy": fast, "rounds": rounds, "runs": runs}

