"""Benchmarks: measured side by side in one run, written as raw observations with what they ran on.

Explained in: notebooks/04_transforms (the sampler benchmark), notebooks/07_cost_model (the calibration),
notebooks/14_which_draft (the race of drafts and the block profile)
and notebooks/08_decoding_demo (the decode benchmark).

A benchmark here is never a timed test: it measures and returns a record (:mod:`speculative.measure.records`
documents what one holds): the raw observations, the calibrations' raw seconds, the settings and
:func:`timing.environment`. Its summary, ``results``, is :func:`analysis.analyse` of those, so a record
can be re-analysed and every figure has one source; :mod:`speculative.measure.report` formats it. Settings travel
as frozen dataclasses (:class:`SamplerSettings`, :class:`DecodeSettings`, :class:`PeerSettings`) whose
defaults come from :mod:`speculative.defaults` and which check themselves when built.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from speculative import defaults
from speculative.engine.model import GPT
from speculative.engine.timing import Clock, environment, median_call_seconds, synchronize
from speculative.measure.analysis import (
    analyse,
    calibration_costs,
    peer_decoder,
    prompts_hash,
    repeat_share,
    tokens_hash,
)
from speculative.measure.records import SCHEMA_VERSION
from speculative.sampling.sampler import draw_randomness, reference_rejection_sample, rejection_sample, rule_sampler

__all__ = ["SamplerSettings", "RunSettings", "DecodeSettings", "PeerSettings", "Decoder", "time_side_by_side",
           "bench_sampler", "bench_decode", "bench_drafts", "bench_peer", "bench_peer_runs", "calibrate_steps",
           "split_policy", "race_public_pair", "profile_block"]


def _positive_ints(name: str, values, allow_empty: bool = False) -> tuple:
    values = tuple(values)
    if (not values and not allow_empty) or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                               for v in values):
        raise ValueError(f"{name} must be integers >= 1, got {list(values)}")
    _distinct(name, values)
    return values


def _distinct(name: str, values) -> None:
    """A value listed twice would be measured twice and pooled by the analysis as one point: refuse it."""
    if len(set(values)) != len(values):
        raise ValueError(f"{name} must each be listed once, got {list(values)}")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _set(settings, **values) -> None:
    for name, value in values.items():
        object.__setattr__(settings, name, value)


def _settings(cls, settings, overrides: dict):
    """``settings`` (or the defaults) with ``overrides`` applied; an unknown name is a ValueError."""
    unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(sorted(unknown))}")
    return dataclasses.replace(settings or cls(), **overrides)


# ---------------------------------------------------------------- the sampler benchmark

@dataclass(frozen=True)
class SamplerSettings:
    """What ``bench sampler`` runs: batch sizes, vocabularies, drafted tokens per row, timed repeats, seed."""

    batches: tuple = defaults.BENCH_SAMPLER["batches"]
    vocabs: tuple = defaults.BENCH_SAMPLER["vocabs"]
    k: int = defaults.BENCH_SAMPLER["k"]
    repeats: int = defaults.BENCH_SAMPLER["repeats"]
    seed: int = defaults.BENCH_SAMPLER["seed"]
    device: str = "cpu"

    def __post_init__(self):
        _set(self, batches=_positive_ints("batches", self.batches), vocabs=_positive_ints("vocabs", self.vocabs))
        _positive_int("k", self.k), _positive_int("repeats", self.repeats)


def time_side_by_side(runs: dict[str, Callable[[], object]], repeats: int, device: str = "cpu") -> dict[str, list]:
    """Return each candidate's timed seconds, running the candidates alternately so drift hits them alike.

    Each candidate runs once as a warm-up, then ``repeats`` times, interleaved with the others.
    """
    _positive_int("repeats", repeats)
    for run in runs.values():
        run()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


def bench_sampler(settings: Optional[SamplerSettings] = None, *, progress: bool = True, **overrides) -> dict:
    """Return a record comparing the batched sampler with the plain per-row reference, per (batch, vocab).

    Both get the same inputs (random p and q, drafts from q) and fresh randomness drawn from one generator
    each call; the reference always runs on the CPU. Its summary: verified positions per second (batch *
    k per call, median of the interleaved repeats) for each, and the ratio batched / reference.
    """
    from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

    s = _settings(SamplerSettings, settings, overrides)
    k, device = s.k, s.device
    observations = []
    generator = torch.Generator(device=device).manual_seed(s.seed)
    cpu_generator = torch.Generator().manual_seed(s.seed)
    points = [(b, v) for b in s.batches for v in s.vocabs]
    for batch, vocab in tqdm(points, desc="sampler bench", disable=not progress, file=sys.stderr):
        target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=cpu_generator) * 3, dim=-1)
        draft = torch.softmax(torch.randn(batch, k, vocab, generator=cpu_generator) * 3, dim=-1)
        drafts = torch.multinomial(draft.reshape(-1, vocab), 1, generator=cpu_generator).reshape(batch, k)
        on_device = [t.to(device) for t in (drafts, draft, target)]
        inputs = (drafts, draft, target)
        seconds = time_side_by_side({
            "batched": lambda on_device=on_device: rejection_sample(*on_device, generator),
            "reference": lambda inputs=inputs, batch=batch: reference_rejection_sample(
                *inputs, draw_randomness(batch, k, cpu_generator)),
        }, repeats=s.repeats, device=device)
        observations.append({"batch": batch, "vocab": vocab, "k": k, "seconds": seconds})
    record = {"schema": SCHEMA_VERSION, "benchmark": "sampler",
              "what": "rejection_sample (vectorised over batch and positions) vs reference_rejection_sample "
                      "(plain Python, row by row), same inputs, medians of interleaved runs",
              "environment": environment(device, probe=True), "config": {"k": k, "repeats": s.repeats, "seed": s.seed},
              "observations": observations}
    record["results"] = analyse(record)
    return record


# ---------------------------------------------------------------- calibrating the loops' steps

def _forward_costs(pair, rows: list[list[int]], gammas) -> dict:
    """Return median seconds of: one draft token, one target token, and target over gamma+1 tokens,
    each call timed alone, back to back, by ``torch.utils.benchmark.Timer``."""
    from speculative.engine.decode import call_positions, prefill

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
    from speculative.engine.decode import call_positions, prefill

    device = pair.target.device
    middle = max_new_tokens // 2
    span = max(len(r) for r in rows) + middle + gamma + 1
    held = [r + r[-1:] * middle for r in rows]
    caches = {"target": prefill(pair.target, held, length=span), "draft": prefill(pair.draft, held, length=span)}
    start = call_positions([len(r) - 1 for r in held], device)
    last = torch.tensor([[r[-1]] for r in rows], device=device)
    return span, caches, start, last


def _calibration_decodes(pair, decode_rows, batch: int, gammas, config, max_new_tokens: int,
                         generator: torch.Generator, rule: str) -> dict[str, Callable[[], float]]:
    """Return the whole decoding calls :func:`calibrate_steps` times on ``decode_rows`` (none without
    them): ``plain_decoded`` (seconds per step, one token per row) and ``block_decoded_<gamma>`` (seconds
    per block), each timed from after its prefill to its end."""
    from speculative.engine.decode import plain_decode, speculative_decode

    if decode_rows is None:
        return {}
    if len(decode_rows) != batch:
        raise ValueError(f"decode_rows must hold as many rows as the calibration ({batch}), got {len(decode_rows)}")

    def decoded(gamma):
        def call() -> float:
            clock = Clock(pair.target.device)
            if gamma is None:
                result = plain_decode(pair.target, decode_rows, max_new_tokens, config, generator, clock=clock)
                return (result.seconds - result.prefill_seconds) / max_new_tokens
            result = speculative_decode(pair.target, pair.draft, decode_rows, max_new_tokens, gamma, config,
                                        generator, clock=clock, rule=rule)
            return (result.seconds - result.prefill_seconds) / len(result.accepted)
        return call

    return {"plain_decoded": decoded(None), **{f"block_decoded_{g}": decoded(g) for g in gammas}}


@torch.no_grad()
def calibrate_steps(pair, rows: list[list[int]], gammas, config, max_new_tokens: int,
                    repeats: int = defaults.BENCH_DECODE["calibration_repeats"], seed: int = 0,
                    rule: str = "token", decode_rows: Optional[list[list[int]]] = None) -> dict:
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
    raw rounds are returned too (``rounds``), and the costs come from :func:`analysis.calibration_costs`.

    ``decode_rows`` (token ids, as many rows as ``rows``; prompts that the measured runs do not decode)
    adds, to every round, whole decoding calls of ``max_new_tokens`` on them, timed without the prefill:
    ``plain_decoded``, plain decoding's seconds per step (one token per row), and ``block_decoded_<gamma>``,
    speculative decoding's seconds per block at each gamma. Those blocks pay everything the loop pays
    (writing the emitted tokens, moving positions, planning the next block, logging, its Python, the
    caches as a whole run leaves them), which the blocks timed above in a loop of their own leave out;
    their analysis is ``decoded`` in :func:`analysis.calibration_costs`.
    """
    from speculative.engine.decode import _next_token, _sample
    from speculative.sampling.sampler import greedy_verify, rule_sampler
    from speculative.sampling.transforms import logits_problem, logits_to_probs

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
    decodes = _calibration_decodes(pair, decode_rows, len(rows), gammas, config, max_new_tokens, generator, rule)
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
    from speculative.engine.decode import _advance, _next_token, _read, _sample, speculative_decode
    from speculative.sampling.sampler import greedy_verify, rejection_sample
    from speculative.sampling.transforms import logits_problem, logits_to_probs

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


# ---------------------------------------------------------------- plain vs speculative decoding

@dataclass(frozen=True)
class RunSettings:
    """What both decoding benchmarks fix: held-out prompts decoded, new tokens per row, timed repeats, seed,
    and the rounds of :func:`calibrate_steps` behind a cost model (defaults: :data:`defaults.BENCH_DECODE`,
    shared by ``bench peer``)."""

    prompts: int = defaults.BENCH_DECODE["prompts"]
    max_new_tokens: int = defaults.BENCH_DECODE["max_new_tokens"]
    repeats: int = defaults.BENCH_DECODE["repeats"]
    seed: int = defaults.BENCH_DECODE["seed"]
    calibration_repeats: int = defaults.BENCH_DECODE["calibration_repeats"]

    def __post_init__(self):
        for name in ("prompts", "max_new_tokens", "repeats", "calibration_repeats"):
            _positive_int(name, getattr(self, name))


@dataclass(frozen=True)
class DecodeSettings(RunSettings):
    """What ``bench decode`` runs (defaults: :data:`defaults.BENCH_DECODE`).

    ``gammas`` are draft lengths, or ``"auto"`` (the cost-model policy, calibrated at every length up to
    :data:`defaults.AUTO_MAX_GAMMA`); ``rules`` the verification rules ("token", "block"); ``drafts``
    above 1 adds multi-draft decoding with that many chains per block, the root drawn by ``scheme``.
    """

    gammas: tuple = defaults.BENCH_DECODE["gammas"]
    temperatures: tuple = defaults.BENCH_DECODE["temperatures"]
    batches: tuple = defaults.BENCH_DECODE["batches"]
    top_k: Optional[int] = None  # keep the k likeliest tokens (both models); None: all
    top_p: Optional[float] = None  # keep the smallest head of mass >= top_p (both models); None: all
    rules: tuple = defaults.BENCH_DECODE["rules"]
    drafts: tuple = defaults.BENCH_DECODE["drafts"]
    scheme: str = defaults.BENCH_DECODE["scheme"]

    def __post_init__(self):
        from speculative.sampling.sampler import _check_scheme

        super().__post_init__()

        gammas = tuple(self.gammas)
        fixed = [g for g in gammas if g != "auto"]
        if not gammas or any(isinstance(g, bool) or not isinstance(g, int) for g in fixed) \
                or len(set(gammas)) != len(gammas):
            raise ValueError(f"gammas must be distinct integers >= 1 or 'auto', got {list(gammas)}")
        _positive_ints("gammas", fixed, allow_empty=True)
        rules = tuple(self.rules)
        for rule in rules:
            rule_sampler(rule)  # an unknown rule fails here, before any run
        if not rules or len(set(rules)) != len(rules):
            raise ValueError(f"rules must name each verification rule once, got {list(rules)}")
        drafts = tuple(sorted(set(self.drafts)))
        if not drafts or min(drafts) < 1:
            raise ValueError(f"drafts (chains per block) must be integers >= 1, got {list(self.drafts)}")
        _check_scheme(self.scheme)
        temperatures = tuple(self.temperatures)
        if not temperatures:
            raise ValueError("gammas, temperatures and batches must each name at least one value")
        _distinct("temperatures", temperatures)
        batches = _positive_ints("batch sizes", self.batches)
        if max(drafts) > 1 and max(batches) > 1:
            raise ValueError("multi-draft decoding runs one prompt at a time (its chains are the batch): use batch 1")
        if max(batches) > self.prompts:
            raise ValueError(f"batch {max(batches)} needs more prompts than the {self.prompts} decoded per point "
                             "(--prompts)")
        if any(self.prompts % b for b in batches):
            raise ValueError(f"the number of prompts ({self.prompts}) must be a multiple of every batch size "
                             f"{list(batches)}")
        _set(self, gammas=gammas, rules=rules, drafts=drafts, temperatures=temperatures, batches=batches)

    @property
    def fixed(self) -> list:
        return [g for g in self.gammas if g != "auto"]

    def variants(self) -> list[tuple]:
        from speculative.measure.analysis import decode_variants

        return decode_variants(dataclasses.asdict(self))

    def check_pair(self, pair) -> None:
        """Raise a ValueError, before any run, if ``pair`` cannot run these settings."""
        from speculative.engine.decode import check_room, encode_prompts

        if max(self.drafts) > 1 and not isinstance(pair.target, GPT):
            raise ValueError("multi-draft decoding runs the library's GPT only, not wrapped transformers models")
        if self.prompts > len(pair.prompts):
            raise ValueError(f"{self.prompts} prompts asked for, but the pair ships {len(pair.prompts)}")
        longest_block = max(self.fixed + ([defaults.AUTO_MAX_GAMMA] if "auto" in self.gammas else []), default=1)
        rows = encode_prompts(pair.prompts[:self.prompts], pair.target.config.vocab_size)
        for model in (pair.target, pair.draft):  # the longest run first: fail now, not after an hour
            check_room(model, rows, self.max_new_tokens, lookahead=longest_block + 2)


def _decode_observation(result, **labels) -> dict:
    """The raw observation of one timed decoding call (see :mod:`speculative.measure.records`)."""
    out = {**labels, "seconds": result.seconds, "prefill_seconds": result.prefill_seconds,
           "target_seconds": result.target_seconds, "draft_seconds": result.draft_seconds,
           "timed_calls": dict(result.timed_calls)}
    if labels["decoder"] is not None:
        out["accepted"] = torch.stack(result.accepted).tolist()
        if labels["decoder"][0] == "auto":
            out["lengths"] = torch.stack(result.lengths).tolist()
    return out


def bench_decode(pair, settings: Optional[DecodeSettings] = None, *, progress: bool = True, **overrides) -> dict:
    """Return a record of plain vs speculative decoding, side by side, for every (batch, T, gamma, rule).

    ``settings`` (a :class:`DecodeSettings`; any of its fields may be given as keywords instead) are
    checked before the first run, so a bad one fails at once and no record is written. Runs on the
    device the pair's weights are on (``pair.target.device``).

    For each batch size b and temperature (with ``top_k`` / ``top_p`` if given), the first ``prompts``
    held-out prompts are decoded in groups of b: first a calibration (:func:`calibrate_steps`, the
    loop's steps timed apart from any run), then ``repeats`` rounds in which every group is decoded by
    plain decoding and by speculative decoding at every gamma and verification rule, in turn, with the
    same seed; each rule has its own calibration. ``drafts`` above 1 adds multi-draft decoding
    (:func:`decode.multi_draft_decode`) at batch 1, calibrated with that many rows; those rows have rule
    ``"chains"`` and run for every k in ``drafts``, 1 included (the same loop with one chain), so that
    chains are compared with chains. Every call is kept as an observation; on a CPU the forwards are
    timed inside the timed runs (it costs nothing there), on CUDA in one extra run per decoder.

    The summary (:func:`analysis.analyse`) gives per point: the pooled speedup of the decode phase with a
    95% bootstrap interval over groups and the speedup of each repeat; alpha (accepted / tested drafts);
    tokens per target call; the **prediction** tokens per call / (gamma c + v) with c and v from the
    calibration (none of this run's timings) and the **efficiency** speedup / prediction; the in-situ
    *decomposition* from this run's own forward timings, kept apart under its own name; the forwards
    timed alone; and the share of each output's positions that repeat an 8-gram seen before.
    """
    from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

    from speculative.engine.decode import encode_prompts
    from speculative.sampling.transforms import SamplingConfig

    s = _settings(DecodeSettings, settings, overrides)
    s.check_pair(pair)
    device, vocab, variants = pair.target.device, pair.target.config.vocab_size, s.variants()
    calibrated = sorted(set(s.fixed) | (set(range(1, defaults.AUTO_MAX_GAMMA + 1)) if "auto" in s.gammas else set()))
    # timing each forward costs a CPU run nothing, so the timed runs themselves give c and v in situ; on
    # CUDA it costs a synchronisation per forward, so separate runs do
    in_run = device.type != "cuda"
    total = sum(s.prompts // b for b in s.batches) * len(s.temperatures) * s.repeats * (1 + len(variants))
    bar = tqdm(total=total, desc="decode bench", disable=not progress, file=sys.stderr)
    observations, calibrations, forward_costs = [], [], []
    for batch in s.batches:
        groups = [pair.prompts[i:i + batch] for i in range(0, s.prompts, batch)]
        forward_costs.append({"batch": batch, "seconds": _forward_costs(pair, encode_prompts(groups[0], vocab),
                                                                        s.fixed)})
        for temperature in s.temperatures:
            config = SamplingConfig(temperature=temperature, top_k=s.top_k, top_p=s.top_p)
            point = {"batch": batch, "temperature": config.temperature}
            costs = {}
            for rule, k in sorted({(v[1], v[2]) for v in variants}):
                raw = calibrate_steps(pair, encode_prompts(groups[0] * k, vocab), calibrated, config, s.max_new_tokens,
                                      repeats=s.calibration_repeats, seed=s.seed,
                                      rule="token" if rule == "chains" else rule)
                calibrations.append({**point, "rule": rule, "drafts": k,
                                     **{key: raw[key] for key in ("seconds", "rounds", "repeats")}})
                costs[(rule, k)] = raw
            runner = _DecodeRunner(pair, s, config, costs)
            runner.warm_up(groups[0])
            for repeat in range(s.repeats):
                for index, group in enumerate(groups):
                    for variant in [None, *variants]:
                        result = runner.run(group, variant, s.seed + repeat, in_run)
                        observations.append(runner.observe(result, prompts=group, variant=variant,
                                                           first_repeat=repeat == 0, **point, repeat=repeat,
                                                           group=index))
                        bar.update()
            if not in_run:  # one extra run per decoder, its forwards timed; its speed is not used
                for variant in [None, *variants]:
                    result = runner.run(groups[0], variant, s.seed, True)
                    observations.append(runner.observe(result, prompts=groups[0], variant=variant,
                                                       first_repeat=False, **point, repeat=0, group=0,
                                                       timing_run=True))
    bar.close()
    record = {
        "schema": SCHEMA_VERSION, "benchmark": "decode",
        "what": "plain vs speculative decoding, side by side, same prompts and seeds; decode phase (after the "
                "prefill), totals over repeats; prediction from a separate calibration of the loop's steps",
        "environment": environment(device, probe=True), "pair_sha256": pair.sha256,
        "pair": {k: pair.info[k] for k in ("target_validation_bpb", "draft_validation_bpb", "target_parameters",
                                          "draft_parameters") if k in pair.info},
        "prompts_sha256": prompts_hash(pair.prompts),
        "config": {**dataclasses.asdict(s), "auto_max_gamma": defaults.AUTO_MAX_GAMMA,
                   "forward_times_from": "the timed runs" if in_run else "one extra run per decoder (its speed unused)",
                   "dtype": str(pair.target.dtype)},
        "calibrations": calibrations, "forward_costs": forward_costs, "observations": observations,
    }
    record["results"] = analyse(record)
    return record


def _independent_runs(bench, runs: int, own: tuple) -> dict:
    """Return one record of ``runs`` calls of ``bench()`` made one after another: the fields they share
    once, each run's ``own`` fields (its environment, calibrations, observations...) in the top-level
    ``runs`` list, and the summary of :func:`analysis.analyse` (per configuration each run's row and the
    range of the runs' figures: the drift between runs that the interval within one run does not cover)."""
    _positive_int("runs", runs)
    each = [bench() for _ in range(runs)]
    record = {k: v for k, v in each[0].items() if k not in (*own, "results")}
    record["what"] = f"{runs} independent runs, one after another, each of: {record['what']}"
    record["config"] = {**record["config"], "runs": runs}
    record["runs"] = [{k: run[k] for k in own} for run in each]
    record["results"] = analyse(record)
    return record


def bench_decode_runs(pair, settings: Optional[DecodeSettings] = None, *, runs: int, progress: bool = True,
                      **overrides) -> dict:
    """Return a record of ``runs`` independent runs of :func:`bench_decode` with the same settings, one after
    another: each is calibrated, warmed up and timed afresh, and kept whole (its environment, calibrations
    and observations) in the record's top-level ``runs`` list (:func:`_independent_runs`)."""
    return _independent_runs(lambda: bench_decode(pair, settings, progress=progress, **overrides), runs,
                             ("environment", "calibrations", "forward_costs", "observations"))


class _DecodeRunner:
    """Runs one decoder of a decode benchmark at one (batch, temperature) and turns its result into an
    observation."""

    def __init__(self, pair, settings: DecodeSettings, config, calibrations: dict):
        self.pair, self.settings, self.config, self.calibrations = pair, settings, config, calibrations

    def warm_up(self, group) -> None:
        from speculative.engine.decode import plain_decode, speculative_decode

        pair, warm = self.pair, torch.Generator(device=self.pair.target.device).manual_seed(self.settings.seed)
        plain_decode(pair.target, group, 8, self.config, warm)  # not timed
        speculative_decode(pair.target, pair.draft, group, 8, (self.settings.fixed or [4])[0], self.config, warm)

    def run(self, group, variant, seed: int, time_forwards: bool):
        from speculative.engine.decode import multi_draft_decode, plain_decode, speculative_decode
        from speculative.engine.policy import make_policy

        pair, s = self.pair, self.settings
        clock = Clock(pair.target.device, forwards=time_forwards)
        generator = torch.Generator(device=pair.target.device).manual_seed(seed)
        if variant is None:
            return plain_decode(pair.target, group, s.max_new_tokens, self.config, generator, clock=clock)
        gamma, rule, chains = variant
        if gamma == "auto":
            gamma = make_policy("auto", calibration=self.calibrations[(rule, chains)],
                                max_gamma=defaults.AUTO_MAX_GAMMA)
        if rule == "chains":
            return multi_draft_decode(pair.target, pair.draft, group[0], s.max_new_tokens, gamma, chains, self.config,
                                      generator, scheme=s.scheme, clock=clock)
        return speculative_decode(pair.target, pair.draft, group, s.max_new_tokens, gamma, self.config, generator,
                                  clock=clock, rule=rule)

    def observe(self, result, prompts, variant, first_repeat: bool, **labels) -> dict:
        from speculative.engine.decode import encode_prompts

        out = _decode_observation(result, **labels, decoder=None if variant is None else list(variant))
        if variant is not None and first_repeat and not labels.get("timing_run"):
            rows = encode_prompts(prompts, self.pair.target.config.vocab_size)
            out["repeat_share"] = [repeat_share(row, prompt) for row, prompt in zip(result.tokens, rows)]
        return out


# ---------------------------------------------------------------- drafts raced against each other

def _profiles(pair, s: DecodeSettings) -> list[dict]:
    """:func:`profile_block` of ``pair``'s draft at gamma 4 on its first prompt, at every temperature of
    ``s``, and greedily also on the path the loop took before the greedy fast path."""
    from speculative.engine.decode import encode_prompts
    from speculative.sampling.transforms import SamplingConfig

    rows, out = encode_prompts(pair.prompts[:1], pair.target.config.vocab_size), []
    for temperature in s.temperatures:
        config = SamplingConfig(temperature=temperature, top_k=s.top_k, top_p=s.top_p)
        for fast in ((True, False) if config.greedy else (True,)):
            out.append(profile_block(pair, rows, 4, config, s.max_new_tokens, repeats=s.calibration_repeats,
                                     seed=s.seed, fast_greedy=fast))
    return out


def _held_out(pair, raced: int, batch: int) -> Optional[list[list[int]]]:
    """Return the ``batch`` prompts that follow the ``raced`` ones in the pair's set, encoded, for the
    calibration's whole decoding calls; None when the set has too few left."""
    from speculative.engine.decode import encode_prompts

    rest = pair.prompts[raced:raced + batch]
    return encode_prompts(rest, pair.target.config.vocab_size) if len(rest) == batch else None


def _check_drafts(pair, drafts: dict, s: DecodeSettings, profile: bool) -> None:
    """Raise a ValueError, before any run, if a draft of ``drafts`` cannot race beside ``pair``'s target."""
    from speculative.engine.decode import check_room, encode_prompts

    for name, other in drafts.items():
        if other.target is not pair.target:
            raise ValueError(f"draft {name!r} is raced with another target: build it with drafts.with_draft(pair, ...)")
        s.check_pair(other)
    if profile:  # the profile drafts 4 tokens a block, whatever gammas are raced: fail now, not after the race
        first = next(iter(drafts.values()))
        for model in (first.target, first.draft):
            check_room(model, encode_prompts(pair.prompts[:1], pair.target.config.vocab_size), s.max_new_tokens,
                       lookahead=4 + 2)


def bench_drafts(pair, drafts: dict, settings: Optional[DecodeSettings] = None, *, runs: int = 1,
                 progress: bool = True, profile: bool = False, **overrides) -> dict:
    """Return a record of plain decoding and speculative decoding with each of several drafts, side by
    side in one run: every group of prompts is decoded by plain decoding, then by each draft at each
    gamma, with the same seed, round after round.

    ``drafts`` maps a name to a pair that shares ``pair``'s target (:func:`drafts.with_draft`; ``pair``
    itself races under its own name if given). Each draft has its own calibration and forward costs, so
    each gets its own prediction; the plain runs are shared. The record (benchmark ``"drafts"``) keeps
    every observation with its ``draft`` (null for plain decoding), and ``runs`` independent runs, one
    after another, in its ``runs`` list; :func:`analysis.analyse` gives one decode row per draft and
    point, and :func:`analysis.compare_drafts` the paired ratio of two drafts' speedups. With ``profile``
    each run ends with :func:`profile_block` of the first draft at gamma 4 and every temperature (greedily
    also on the path it took before the greedy fast path), kept under ``profiles``
    (:func:`analysis.block_profile` reads one).
    """
    from tqdm import tqdm

    from speculative.engine.decode import encode_prompts
    from speculative.measure.drafts import draft_training
    from speculative.sampling.transforms import SamplingConfig

    _positive_int("runs", runs)
    s = _settings(DecodeSettings, settings, overrides)
    if not drafts:
        raise ValueError("bench_drafts needs at least one draft to race")
    if s.rules != ("token",) or s.drafts != (1,) or "auto" in s.gammas:
        raise ValueError("bench_drafts races drafts at fixed gammas under the token-wise rule, one chain")
    _check_drafts(pair, drafts, s, profile)
    device, vocab = pair.target.device, pair.target.config.vocab_size
    if device.type == "cuda":  # on CUDA timing each forward costs a sync per call, which would slow the runs
        raise ValueError("bench_drafts times the forwards inside its runs, which is right on a CPU only")
    variants = s.variants()
    total = runs * sum(s.prompts // b for b in s.batches) * len(s.temperatures) * s.repeats \
        * (1 + len(drafts) * len(variants))
    bar = tqdm(total=total, desc="drafts race", disable=not progress, file=sys.stderr)
    each = []
    for _ in range(runs):
        observations, calibrations, forward_costs = [], [], []
        for batch in s.batches:
            groups = [pair.prompts[i:i + batch] for i in range(0, s.prompts, batch)]
            rows = encode_prompts(groups[0], vocab)
            held_out = _held_out(pair, s.prompts, batch)
            for name, other in drafts.items():
                forward_costs.append({"batch": batch, "draft": name, "seconds": _forward_costs(other, rows, s.fixed)})
            for temperature in s.temperatures:
                config = SamplingConfig(temperature=temperature, top_k=s.top_k, top_p=s.top_p)
                point = {"batch": batch, "temperature": config.temperature}
                runners = {}
                for name, other in drafts.items():
                    raw = calibrate_steps(other, rows, s.fixed, config, s.max_new_tokens,
                                          repeats=s.calibration_repeats, seed=s.seed, decode_rows=held_out)
                    calibrations.append({**point, "rule": "token", "drafts": 1, "draft": name,
                                         **{key: raw[key] for key in ("seconds", "rounds", "repeats")}})
                    runners[name] = _DecodeRunner(other, s, config, {("token", 1): raw})
                    runners[name].warm_up(groups[0])
                for repeat in range(s.repeats):
                    for index, group in enumerate(groups):
                        labels = {**point, "repeat": repeat, "group": index}
                        plain = next(iter(runners.values()))
                        result = plain.run(group, None, s.seed + repeat, True)
                        observations.append({**plain.observe(result, group, None, False, **labels), "draft": None})
                        bar.update()
                        for name, runner in runners.items():
                            for variant in variants:
                                result = runner.run(group, variant, s.seed + repeat, True)
                                observations.append({**runner.observe(result, group, variant, repeat == 0, **labels),
                                                     "draft": name})
                                bar.update()
        each.append({"environment": environment(device, probe=True), "calibrations": calibrations,
                     "forward_costs": forward_costs, "observations": observations,
                     "profiles": _profiles(next(iter(drafts.values())), s) if profile else []})
    bar.close()
    record = {
        "schema": SCHEMA_VERSION, "benchmark": "drafts",
        "what": "plain decoding and speculative decoding with each draft, side by side, same prompts and seeds; "
                "decode phase, totals over repeats; each draft's prediction from its own calibration",
        "pair_sha256": pair.sha256, "prompts_sha256": prompts_hash(pair.prompts),
        "drafts": {name: {"sha256": other.sha256, "draft_config": other.draft.config.to_dict(),
                          "draft_parameters": other.draft.num_parameters(),
                          "from": other.info.get("draft_from", "the pair's own draft"),
                          "training": draft_training(other),
                          "compiled": other.info.get("draft_compiled")}
                   for name, other in drafts.items()},
        "config": {**dataclasses.asdict(s), "auto_max_gamma": defaults.AUTO_MAX_GAMMA,
                   "forward_times_from": "the timed runs", "dtype": str(pair.target.dtype), "runs": runs,
                   "calibration_decodes": "the prompts after those raced, one per row, at each batch size where "
                                          "the pair's set has them left"},
    }
    record.update(each[0] if runs == 1 else {"runs": each})
    if runs == 1:
        record["config"].pop("runs")
    record["results"] = analyse(record)
    return record


# ---------------------------------------------------------------- this engine against transformers

def split_policy(name: str) -> tuple[str, str]:
    """Return (policy, verification rule) of a raced policy's name: ``auto`` -> (auto, token), ``auto+block``
    -> (auto, block). The token-wise rule is the default and is never spelled out, so each decoder has one
    name."""
    if not isinstance(name, str):
        raise ValueError(f"a policy name must be a string, got {name!r}")
    base, plus, rule = name.partition("+")
    if plus and rule != "block":
        raise ValueError(f"unknown verification rule {rule!r} in policy {name!r}; the only suffix is +block")
    return base, rule or "token"


@dataclass(frozen=True)
class PeerSettings(RunSettings):
    """What ``bench peer`` races (defaults: :data:`defaults.BENCH_PEER`): temperatures, this engine's fixed
    draft length (and the fixed schedule's), transformers' schedules, this engine's draft-length policies
    (``name`` or ``name+block``); prompts, new tokens, timed rounds and seed as :class:`RunSettings`."""

    temperatures: tuple = defaults.BENCH_PEER["temperatures"]
    gamma: int = defaults.BENCH_PEER["gamma"]
    schedules: tuple = defaults.BENCH_PEER["schedules"]
    policies: tuple = defaults.BENCH_PEER["policies"]

    def __post_init__(self):
        from speculative.engine.hf import HF_SCHEDULES
        from speculative.engine.policy import POLICIES

        super().__post_init__()

        policies, schedules, temperatures = tuple(self.policies), tuple(self.schedules), tuple(self.temperatures)
        if not policies or len({split_policy(p) for p in policies}) != len(policies) or any(
                split_policy(p)[0] not in POLICIES for p in policies):
            raise ValueError(f"policies must be distinct names among {', '.join(POLICIES)}, each optionally with "
                             f"+block, got {list(policies)}")
        _positive_int("gamma", self.gamma)
        if not temperatures or any(t < 0 for t in temperatures):
            raise ValueError(f"temperatures must be >= 0, got {list(temperatures)}")
        _distinct("temperatures", temperatures)
        _distinct("schedules", schedules)
        if not schedules or any(s not in HF_SCHEDULES for s in schedules):
            raise ValueError(f"schedules must be among {', '.join(HF_SCHEDULES)}, got {list(schedules)}")
        _set(self, policies=policies, schedules=schedules, temperatures=temperatures)


@dataclass(frozen=True)
class Decoder:
    """One decoder of the race: its ``name`` in the record, how to ``run`` it on one prompt (ids, new
    tokens), and how its result ``counts`` (blocks, drafted, accepted); None for a plain decoder."""

    name: str
    run: Callable
    counts: Optional[Callable] = None


def _engine_counts(result) -> tuple[int, int, int]:
    """(target calls that emitted tokens, drafted, accepted) of this engine's run of one row."""
    accepted = [a for block in result.accepted for a in block.reshape(-1).tolist() if a >= 0]
    if result.lengths:  # a policy: each block's own length
        drafted = sum(n for block in result.lengths for n in block.reshape(-1).tolist() if n >= 0)
    else:
        drafted = result.gamma * len(accepted)
    return len(accepted), drafted, sum(accepted)


def _assisted_counts(result) -> tuple[int, int, int]:
    return len(result.drafted), sum(result.drafted), sum(result.accepted)


def _tokens(result) -> list[int]:
    tokens = result if isinstance(result, list) else result.tokens
    return tokens[0] if tokens and isinstance(tokens[0], list) else tokens


def _peer_decoders(pair, s: PeerSettings, config, seed: int, policies: dict, models: dict) -> list[Decoder]:
    """The race's decoders at one temperature and seed, in the order each prompt meets them."""
    from speculative.engine.decode import plain_decode, speculative_decode
    from speculative.engine.hf import assisted_generate, plain_generate

    device, t = pair.target.device, config.temperature

    def generator():
        return torch.Generator(device=device).manual_seed(seed)

    def ours(policy, rule):
        return lambda row, n: speculative_decode(pair.target, pair.draft, [row], n, policy, config, generator(),
                                                 rule=rule)

    def assisted(schedule):
        return lambda row, n: assisted_generate(models["hf_target"], models["hf_draft"], row, n, t, schedule,
                                                s.gamma, seed)

    out = [Decoder(peer_decoder(p), ours(policies[p], split_policy(p)[1]), _engine_counts) for p in s.policies]
    out.append(Decoder("ours_plain", lambda row, n: plain_decode(pair.target, [row], n, config, generator())))
    if "wrapped" in models:
        out.append(Decoder("ours_on_hf_models", lambda row, n: speculative_decode(
            *models["wrapped"], [row], n, s.gamma, config, generator()), _engine_counts))
    out.append(Decoder("hf_plain", lambda row, n: plain_generate(models["hf_target"], row, n, t, seed)))
    out += [Decoder(f"hf_{schedule}", assisted(schedule), _assisted_counts) for schedule in s.schedules]
    return out


def _peer_policies(pair, s: PeerSettings, config, rows) -> tuple[dict, list]:
    """Each raced policy's object at one temperature, and the raw calibrations of the cost-model ones
    (calibrated at this temperature and rule, before any timed run)."""
    from speculative.engine.policy import make_policy

    policies, calibrations = {}, []
    for p in s.policies:
        base, rule = split_policy(p)
        if base == "fixed":
            policies[p] = s.gamma
        elif base == "auto":
            raw = calibrate_steps(pair, rows[:1], list(range(1, defaults.AUTO_MAX_GAMMA + 1)), config,
                                  s.max_new_tokens, repeats=s.calibration_repeats, seed=s.seed, rule=rule)
            policies[p] = make_policy("auto", calibration=raw, max_gamma=defaults.AUTO_MAX_GAMMA)
            calibrations.append({"temperature": config.temperature, "policy": p,
                                 **{key: raw[key] for key in ("seconds", "rounds", "repeats")}})
        else:
            policies[p] = make_policy(base, s.gamma, max_gamma=defaults.PEER_MAX_GAMMA)
    return policies, calibrations


def bench_peer(pair, settings: Optional[PeerSettings] = None, *, progress: bool = True, **overrides) -> dict:
    """Return a record of this engine against transformers' assisted generation on the same models, side by side.

    The shipped pair is exported to transformers' GPT-2 (:func:`hf.export`: equal logits), so both sides
    decode the same models, prompts and number of new tokens at batch 1 (the batch transformers'
    assisted generation supports), on one machine, in one run. For each temperature, every prompt is
    decoded in turn by every :class:`Decoder`: this engine under each raced policy (``fixed`` at
    ``gamma`` is ``ours``; ``heuristic`` and ``confidence`` may draft up to
    :data:`defaults.PEER_MAX_GAMMA`, as transformers' default does; ``auto``, the cost model, is
    calibrated at this temperature first; ``+block`` runs a policy under block verification), its plain
    decoding (``ours_plain``), this engine on the exported models through :func:`hf.wrap`
    (``ours_on_hf_models``: the same loop with transformers' forwards, at the fixed ``gamma``),
    ``generate`` without an assistant (``hf_plain``) and ``generate(assistant_model=...)`` under each
    schedule (:data:`hf.HF_SCHEDULES`). Each call is timed whole (prefill included); the round repeats
    ``repeats`` times after a warm-up. The summary (:func:`analysis.analyse`) has one row per
    (temperature, schedule, policy), and at temperature 0 says whether every decoder emitted the same
    tokens as the first.

    ``pair`` may also be a wrapped transformers pair (:func:`hf.pair`, :func:`hf.load_pair`): then
    ``ours`` runs this engine on the wrapped models, transformers runs the models themselves, and there
    is no ``ours_on_hf_models``. transformers stops at an end-of-sequence token unless told otherwise;
    every call here asks for exactly ``max_new_tokens`` (``min_new_tokens``), which masks that token on
    transformers' side only, so greedy outputs can differ where a model would end its text.
    """
    import importlib.util

    import transformers
    from tqdm import tqdm

    from speculative.engine.decode import check_room, encode_prompts
    from speculative.engine.hf import export, wrap
    from speculative.sampling.transforms import SamplingConfig

    s = _settings(PeerSettings, settings, overrides)
    if s.prompts > len(pair.prompts):
        raise ValueError(f"{s.prompts} prompts asked for, but the pair ships {len(pair.prompts)}")
    rows = encode_prompts(pair.prompts[:s.prompts], pair.target.config.vocab_size)
    for model in (pair.target, pair.draft):  # transformers' default schedule drafts up to 20 tokens
        check_room(model, rows, s.max_new_tokens, lookahead=max(s.gamma, 20, defaults.PEER_MAX_GAMMA) + 2)
    device = pair.target.device
    if isinstance(pair.target, GPT):  # the library's models: export them; ours also runs on the exports
        models = {"hf_target": export(pair.target), "hf_draft": export(pair.draft)}
        if "fixed" in s.policies:
            models["wrapped"] = (wrap(models["hf_target"]), wrap(models["hf_draft"]))
    else:  # a wrapped transformers pair: ours already runs transformers' forwards
        models = {"hf_target": pair.target.model, "hf_draft": pair.draft.model}
    per_prompt = len(_peer_decoders(pair, s, SamplingConfig(), s.seed, {p: s.gamma for p in s.policies}, models))
    bar = tqdm(total=len(s.temperatures) * s.repeats * s.prompts * per_prompt, desc="peer race", disable=not progress,
               file=sys.stderr)
    observations, calibrations = [], []
    for temperature in s.temperatures:
        config = SamplingConfig(temperature=temperature)
        policies, calibrated = _peer_policies(pair, s, config, rows)
        calibrations += calibrated
        for decoder in _peer_decoders(pair, s, config, s.seed, policies, models):  # warm-up, not timed
            decoder.run(rows[0], 16)
        for repeat in range(s.repeats):
            decoders = _peer_decoders(pair, s, config, s.seed + repeat, policies, models)
            for index, row in enumerate(rows):
                for decoder in decoders:
                    synchronize(device)
                    began = time.perf_counter()
                    result = decoder.run(row, s.max_new_tokens)
                    synchronize(device)
                    seconds = time.perf_counter() - began
                    blocks, drafted, accepted = decoder.counts(result) if decoder.counts else (0, 0, 0)
                    observations.append({"temperature": config.temperature, "repeat": repeat, "prompt": index,
                                         "decoder": decoder.name, "seconds": seconds, "blocks": blocks,
                                         "drafted": drafted, "accepted": accepted,
                                         "tokens_sha256": tokens_hash(_tokens(result))})
                    bar.update()
    bar.close()
    sklearn = importlib.util.find_spec("sklearn") is not None
    record = {
        "schema": SCHEMA_VERSION, "benchmark": "peer",
        "what": "this engine vs transformers' assisted generation on the same exported models, batch 1, side by "
                "side, every prompt decoded by every decoder in turn; whole calls timed (prefill included)",
        "environment": {**environment(device, probe=True), "transformers": transformers.__version__,
                        "scikit_learn_installed": sklearn},
        "pair_sha256": pair.sha256, "prompts_sha256": prompts_hash(pair.prompts[:s.prompts]),
        "config": {**dataclasses.asdict(s), "peer_max_gamma": defaults.PEER_MAX_GAMMA,
                   "auto_max_gamma": defaults.AUTO_MAX_GAMMA, "dtype": str(pair.target.dtype),
                   "hf_default": "transformers' GenerationConfig defaults: num_assistant_tokens 20, schedule "
                   f"constant, assistant_confidence_threshold {defaults.CONFIDENCE_THRESHOLD}"
                   + ("" if sklearn else " (not adapted: scikit-learn is not installed)")},
        "calibrations": calibrations, "observations": observations,
    }
    if "draft_from" in pair.info:  # a candidate draft (drafts.with_draft): name it, and its own hash
        record["draft"] = {"from": pair.info["draft_from"], "sha256": pair.info["draft_sha256"],
                           "base_pair_sha256": pair.info.get("base_pair_sha256")}
    record["results"] = analyse(record)
    return record


def bench_peer_runs(pair, settings: Optional[PeerSettings] = None, *, runs: int, progress: bool = True,
                    **overrides) -> dict:
    """Return a record of ``runs`` independent races of :func:`bench_peer` with the same settings, one after
    another, each warmed up and timed afresh and kept whole (its environment, calibrations, observations)
    in the record's ``runs`` list; the summary gives each run's row and the range over the runs of this
    engine's speed over transformers' (:func:`_independent_runs`)."""
    return _independent_runs(lambda: bench_peer(pair, settings, progress=progress, **overrides), runs,
                             ("environment", "calibrations", "observations"))


def race_public_pair(target: str, draft: str, device: str = "cuda", dtype=torch.bfloat16,
                     prompts=(), gammas=(2, 4, 6), max_new_tokens: int = 128, repeats: int = 1,
                     calibration_repeats: int = defaults.BENCH_DECODE["calibration_repeats"],
                     progress: bool = False) -> dict:
    """Load ``target`` and ``draft`` with :func:`hf.load_pair` and return two records measured on them:
    ``decode`` (:func:`bench_decode`: plain vs this engine at each gamma, T = 0 and 1, batch 1) and
    ``peer`` (:func:`bench_peer`: this engine at the middle gamma vs transformers' assisted generation,
    default and fixed schedules). What chapter 08 runs for GPU readers; tested offline on tiny
    checkpoints."""
    from speculative.engine.hf import load_pair

    loaded = load_pair(target, draft, prompts, device=device, dtype=dtype)
    count = len(loaded.prompts)
    decode = bench_decode(loaded, gammas=tuple(gammas), temperatures=(0.0, 1.0), batches=(1,),
                          max_new_tokens=max_new_tokens, repeats=repeats, prompts=count,
                          calibration_repeats=calibration_repeats, progress=progress)
    peer = bench_peer(loaded, gamma=sorted(gammas)[len(gammas) // 2], prompts=count, max_new_tokens=max_new_tokens,
                      repeats=repeats, calibration_repeats=calibration_repeats, progress=progress)
    return {"decode": decode, "peer": peer}
