"""Benchmarks: measured side by side in one run, reported as ratios, recorded with what they ran on.

Explained in: notebooks/04_transforms (the sampler benchmark).

A benchmark here is never a timed test: it measures, prints and writes a JSON record. Every record
carries :func:`environment` (device, torch version, thread count, CPU, Python), so a reader can tell what
a number was measured on.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from . import defaults
from .book import demo_settings  # noqa: F401  (importable from here, as it was before book.py)
from .model import GPT
from .sampler import draw_randomness, reference_rejection_sample, rejection_sample
from .timing import Clock, environment, median_call_seconds, synchronize

__all__ = ["environment", "time_side_by_side", "bench_sampler", "bench_decode", "calibrate_steps", "per_plain_step",
           "length_prices", "repeat_share", "write_record",
           "format_sampler_table", "format_decode_table", "compare_variants", "SAMPLER_LEGEND", "DECODE_LEGEND",
           "bench_peer", "format_peer_table", "PEER_LEGEND", "speed_ratio"]


def time_side_by_side(runs: dict[str, Callable[[], object]], repeats: int, device: str = "cpu") -> dict[str, dict]:
    """Return per-run timing statistics, running the candidates alternately so drift hits them alike.

    Each candidate runs once as a warm-up, then ``repeats`` times, interleaved with the others.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
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
    return {
        name: {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "repeats": len(ts)}
        for name, ts in times.items()
    }


def bench_sampler(
    batches: Iterable[int] = defaults.BENCH_SAMPLER["batches"],
    vocabs: Iterable[int] = defaults.BENCH_SAMPLER["vocabs"],
    k: int = defaults.BENCH_SAMPLER["k"],
    repeats: int = defaults.BENCH_SAMPLER["repeats"],
    seed: int = defaults.BENCH_SAMPLER["seed"],
    device: str = "cpu",
    progress: bool = True,
) -> dict:
    """Return a record comparing the batched sampler with the plain per-row reference, per (batch, vocab).

    Both get the same inputs (random p and q, drafts from q) and fresh randomness drawn from one generator
    each call; the reference always runs on the CPU. Reported: verified positions per second (batch * k
    per call) for each, and the ratio batched / reference.
    """
    from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

    points = [(b, v) for b in batches for v in vocabs]
    rows = []
    generator = torch.Generator(device=device).manual_seed(seed)
    cpu_generator = torch.Generator().manual_seed(seed)
    for batch, vocab in tqdm(points, desc="sampler bench", disable=not progress, file=sys.stderr):
        target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=cpu_generator) * 3, dim=-1)
        draft = torch.softmax(torch.randn(batch, k, vocab, generator=cpu_generator) * 3, dim=-1)
        drafts = torch.multinomial(draft.reshape(-1, vocab), 1, generator=cpu_generator).reshape(batch, k)
        on_device = [t.to(device) for t in (drafts, draft, target)]
        inputs = (drafts, draft, target)
        timings = time_side_by_side(
            {
                "batched": lambda on_device=on_device: rejection_sample(*on_device, generator),
                "reference": lambda inputs=inputs, batch=batch: reference_rejection_sample(
                    *inputs, draw_randomness(batch, k, cpu_generator)),
            },
            repeats=repeats,
            device=device,
        )
        positions = batch * k
        batched_rate = positions / timings["batched"]["median_s"]
        reference_rate = positions / timings["reference"]["median_s"]
        rows.append({
            "batch": batch, "k": k, "vocab": vocab,
            "batched_positions_per_s": batched_rate,
            "reference_positions_per_s": reference_rate,
            "speedup": batched_rate / reference_rate,
            "timings": timings,
        })
    return {
        "benchmark": "sampler",
        "what": "rejection_sample (vectorised over batch and positions) vs reference_rejection_sample "
                "(plain Python, row by row), same inputs, medians of interleaved runs",
        "environment": environment(device),
        "config": {"k": k, "repeats": repeats, "seed": seed},
        "results": rows,
    }


SAMPLER_LEGEND = ("batch: rows per call; V: vocabulary; pos/s: drafted positions verified per second (batch x k per "
                  "call, median of interleaved runs); ratio: batched / reference")


def _table(headers: list[str], rows: list[list[str]], notes: list[str], markdown: bool) -> str:
    """Return a table: plain text, columns right-aligned (for a terminal), or Markdown (for a page)."""
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---:|" * len(headers)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines + [""] + [f"{note}\n" for note in notes]).rstrip() + "\n"
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = [" ".join(f"{cell:>{w}}" for cell, w in zip(line, widths)) for line in [headers, *rows]]
    return "\n".join(lines + notes)


def format_sampler_table(record: dict, markdown: bool = False) -> str:
    """Return the sampler record as a table (plain text, or Markdown with ``markdown=True``) with a legend."""
    rows = [[str(row["batch"]), str(row["vocab"]), f"{row['batched_positions_per_s']:,.0f}",
             f"{row['reference_positions_per_s']:,.0f}", f"{row['speedup']:.1f}x"] for row in record["results"]]
    env = record["environment"]
    notes = [f"measured on {env['device']} ({env.get('accelerator', env['cpu'])}), torch {env['torch']}, "
             f"{env['threads']} threads", SAMPLER_LEGEND]
    return _table(["batch", "V", "batched pos/s", "reference pos/s", "ratio"], rows, notes, markdown)


def write_record(record: dict, path: Optional[str]) -> Optional[Path]:
    """Write ``record`` as indented JSON to ``path`` (folders created); return the path, or None."""
    if not path:
        return None
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        partial.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
        partial.replace(out)  # atomic: a reader never sees half a record
    finally:
        partial.unlink(missing_ok=True)
    return out


def _forward_costs(pair, rows: list[list[int]], gammas) -> dict:
    """Return median seconds of: one draft token, one target token, and target over gamma+1 tokens,
    each call timed alone, back to back, by ``torch.utils.benchmark.Timer``."""
    from .decode import prefill

    device = pair.target.device
    start = torch.tensor([len(r) - 1 for r in rows], device=device)
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


@torch.no_grad()
def calibrate_steps(pair, rows: list[list[int]], gammas, config, max_new_tokens: int, repeats: int = 5,
                    seed: int = 0, rule: str = "token") -> dict:
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
    repeated alone). ``rule`` is the verification rule whose sampler the verification step runs.
    """
    from .decode import _sample, prefill
    from .sampler import rule_sampler
    from .transforms import logits_problem, logits_to_probs

    device = pair.target.device
    generator = torch.Generator(device=device).manual_seed(seed)
    middle = max_new_tokens // 2
    span = max(len(r) for r in rows) + middle + max(gammas) + 1
    start = torch.tensor([len(r) - 1 + middle for r in rows], device=device)
    last = torch.tensor([[r[-1]] for r in rows], device=device)
    # the caches really hold the positions before the step (the prompt, then its last token repeated), as a
    # wrapped transformers model needs; the library's GPT would attend over the zeros there just as fast
    held = [r + r[-1:] * middle for r in rows]
    caches = {"target": prefill(pair.target, held, length=span), "draft": prefill(pair.draft, held, length=span)}
    vocab = pair.target.config.vocab_size
    sampler = rule_sampler(rule)

    def single(name):
        model, cache = getattr(pair, name), caches[name]

        def step():
            logits = model(last, start, cache, span=span, check=False)[:, -1]
            logits_problem(logits)
            _sample(logits_to_probs(logits, config, check=False), generator)
        return step

    def verify(gamma):
        tokens = last.repeat(1, gamma + 1)
        draft_probs = torch.full((len(rows), gamma, vocab), 1.0 / vocab, device=device)

        def step():
            logits = pair.target(tokens, start, caches["target"], span=span, check=False)
            problem = logits_problem(logits)
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
    rounds = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            rounds[name].append(median_call_seconds(step, min_run_time=0.2))
    seconds = {name: statistics.median(times) for name, times in rounds.items()}
    return {"seconds": seconds, **_step_costs(seconds, gammas, seconds["plain"]), "repeats": repeats}


def _step_costs(seconds: dict, gammas, plain_seconds: float) -> dict:
    """c, v and v_alone from a calibration's median seconds, relative to a plain step of ``plain_seconds``.

    v(gamma) is what a block costs beyond its gamma draft steps (the verification as the loop pays it:
    right after the draft's forwards, with the caches they leave). When timing noise makes that
    difference zero or negative (tiny models, whose steps cost about the same), it cannot measure the
    verification, so v_alone(gamma), the verification step timed alone, stands in for it; the gammas
    where it did are listed under ``v_from_alone``, so that no record hides the substitution.
    """
    draft = seconds["draft"]
    v, fallback = {}, []
    for g in gammas:
        loop = seconds[f"block_{g}"] - g * draft
        if not loop > 0:
            loop = seconds[f"verify_{g}"]
            fallback.append(g)
        v[g] = loop / plain_seconds
    return {"c": draft / plain_seconds, "v": v, "v_alone": {g: seconds[f"verify_{g}"] / plain_seconds for g in gammas},
            "v_from_alone": fallback}


def per_plain_step(calibration: dict, plain_seconds: float) -> dict:
    """Return ``calibration`` (from :func:`calibrate_steps`) with c, v and v_alone relative to a plain step
    of ``plain_seconds`` instead of its own: multi-draft decoding runs k rows per step, but is compared
    with plain decoding of one row, so its steps must be counted in that row's plain steps."""
    return {**calibration, **_step_costs(calibration["seconds"], list(calibration["v"]), plain_seconds),
            "relative_to_plain_seconds": plain_seconds}


def repeat_share(tokens: list[int], context: list[int], n: int = 8) -> float:
    """Return the share of generated positions whose n-gram (the n tokens ending there) already occurred
    earlier in ``context`` + ``tokens``: how much of an output repeats itself or its prompt. Positions
    with fewer than n tokens before them in the whole text end no n-gram and are not counted."""
    text = list(context) + list(tokens)
    seen, repeated, positions = set(), 0, 0
    for end in range(n, len(text) + 1):
        gram = tuple(text[end - n:end])
        if end > len(context):
            positions += 1
            repeated += gram in seen
        seen.add(gram)
    return repeated / positions if positions else float("nan")


def _ci(columns: list, statistic: Callable, seed: int) -> list[float]:
    """Return a 95% percentile bootstrap interval (2,000 resamples, paired over prompts) of ``statistic``
    of the per-prompt ``columns``."""
    from scipy.stats import bootstrap

    if len(columns[0]) < 2:
        return [float("nan"), float("nan")]
    result = bootstrap(tuple(columns), statistic, paired=True, vectorized=False, n_resamples=2000,
                       confidence_level=0.95, method="percentile", random_state=seed)
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]


def _interval(plain_seconds: list[float], spec_seconds: list[float], seed: int) -> list[float]:
    """Return a 95% bootstrap interval (percentile, over groups of prompts) for the pooled speedup."""
    return _ci([plain_seconds, spec_seconds], lambda a, b: sum(a) / sum(b), seed)


def speed_ratio(seconds: list[float], baseline_seconds: list[float], seed: int = 0) -> tuple[float, list[float]]:
    """Return how many times as fast a decoder ran as a baseline on the same prompts and tokens (pooled:
    baseline seconds / its seconds) with a 95% bootstrap interval paired over prompts, from the
    per-prompt seconds a record keeps (e.g. ``seconds_per_prompt`` of :func:`bench_peer`'s rows)."""
    return sum(baseline_seconds) / sum(seconds), _interval(baseline_seconds, seconds, seed)


def bench_decode(
    pair,
    gammas: Iterable[int] = defaults.BENCH_DECODE["gammas"],
    temperatures: Iterable[float] = defaults.BENCH_DECODE["temperatures"],
    batches: Iterable[int] = defaults.BENCH_DECODE["batches"],
    max_new_tokens: int = defaults.BENCH_DECODE["max_new_tokens"],
    repeats: int = defaults.BENCH_DECODE["repeats"],
    seed: int = defaults.BENCH_DECODE["seed"],
    *,
    prompts: int = defaults.BENCH_DECODE["prompts"],
    progress: bool = True,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    rules: Iterable[str] = ("token",),
    drafts: Iterable[int] = (1,),
    scheme: str = "with_replacement",
) -> dict:
    """Return a record of plain vs speculative decoding, side by side, for every (batch, T, gamma, rule).

    Runs on the device the pair's weights are on (``pair.target.device``). Every setting is checked
    before the first run, so a bad one fails at once and no record is written.

    For each batch size b and temperature (with ``top_k`` / ``top_p`` if given), the first ``prompts``
    held-out prompts are decoded in groups of b: first a calibration (:func:`calibrate_steps`, the
    loop's steps timed apart from any run), then ``repeats`` rounds in which every group is decoded by
    plain decoding and by speculative decoding at every gamma and verification rule (``rules``: "token",
    "block"), in turn, with the same seed; each rule has its own calibration. ``drafts`` above 1 adds
    multi-draft decoding (:func:`decode.multi_draft_decode`: that many chains per block, the root drawn
    by ``scheme``, token-wise along the chosen chain) at batch 1, calibrated with that many rows; those
    rows have rule ``"chains"``, and run for every k in ``drafts``, 1 included (the same loop with one
    chain), so that chains are compared with chains.

    Reported per point: the pooled speedup (all plain decode seconds / all speculative ones, the same
    tokens), the speedup of each group (per prompt at batch 1) with their median, a 95% bootstrap
    interval over groups, and the pooled speedup of each repeat; alpha; tokens per target forward (new
    tokens per row / target calls after the prefill, so a batch that waits for its slowest row is
    charged for it); tokens per active block; the **prediction** tokens_per_target_forward /
    (gamma c + v) with c and v from the calibration, and the **efficiency** speedup / prediction. The
    prediction uses this run's tokens per call but none of its timings (for ``gamma="auto"``, also this
    run's block lengths, counted in ``block_lengths`` and each priced from the calibration's non-decreasing
    fit, ``calibration["v_fitted"]``, the costs the policy chose by). Kept apart, under their own
    names: c and v timed in situ (every forward timed inside the runs on a CPU, in one extra run on
    CUDA), the *decomposition* tokens_per_target_forward / (gamma c + v) from them, and the
    *in-situ share* speedup / decomposition, which on a CPU equals (plain decode seconds / plain forward
    seconds) / (speculative decode seconds / speculative forward seconds): each side's share of time
    outside its forwards, not a test of the cost model. Also: the forwards timed alone, the mean
    prefill of each decoder, and the median share of each speculative output's positions that repeat an
    8-gram seen before (loops inflate greedy acceptance).
    """
    from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

    from .decode import check_room, encode_prompts, multi_draft_decode, plain_decode, speculative_decode
    from .policy import make_policy
    from .stats import measured_acceptance_rate
    from .transforms import SamplingConfig

    gammas, temperatures, batches, rules = list(gammas), list(temperatures), list(batches), list(rules)
    # "auto": the cost-model policy (policy.CostModelPolicy), calibrated at every length up to AUTO_MAX_GAMMA
    auto = "auto" in gammas
    fixed = [g for g in gammas if g != "auto"]
    if any(isinstance(g, bool) or not isinstance(g, int) for g in fixed) or len(set(gammas)) != len(gammas):
        raise ValueError(f"gammas must be distinct integers >= 1 or 'auto', got {gammas}")
    longest_block = max(fixed + ([defaults.AUTO_MAX_GAMMA] if auto else []), default=1)
    calibrated = sorted(set(fixed) | (set(range(1, defaults.AUTO_MAX_GAMMA + 1)) if auto else set()))
    from .sampler import rule_sampler

    for rule in rules:
        rule_sampler(rule)  # an unknown rule fails here, before any run
    if not rules or len(set(rules)) != len(rules):
        raise ValueError(f"rules must name each verification rule once, got {rules}")
    drafts = sorted(set(drafts))
    if not drafts or min(drafts) < 1:
        raise ValueError(f"drafts (chains per block) must be integers >= 1, got {drafts}")
    if max(drafts) > 1 and not isinstance(pair.target, GPT):
        raise ValueError("multi-draft decoding runs the library's GPT only, not wrapped transformers models")
    if max(drafts) > 1 and max(batches) > 1:
        raise ValueError("multi-draft decoding runs one prompt at a time (its chains are the batch): use batch 1")
    from .sampler import _check_scheme

    _check_scheme(scheme)
    # multi-draft runs are labelled rule "chains" and run for every k in ``drafts``, k = 1 included, so that
    # chains are compared with chains (the same loop) as well as with the single-chain loop
    variants = [(g, rule, 1) for g in gammas for rule in rules]
    if max(drafts) > 1:
        variants += [(g, "chains", k) for g in fixed for k in drafts]
    device = pair.target.device
    configs = [SamplingConfig(temperature=t, top_k=top_k, top_p=top_p) for t in temperatures]
    if not gammas or not temperatures or not batches:
        raise ValueError("gammas, temperatures and batches must each name at least one value")
    for name, value in (("repeats", repeats), ("prompts", prompts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if min(batches) < 1 or min(fixed, default=1) < 1:
        raise ValueError("batch sizes and gammas must be >= 1")
    if prompts > len(pair.prompts):
        raise ValueError(f"{prompts} prompts asked for, but the pair ships {len(pair.prompts)}")
    if max(batches) > prompts:
        raise ValueError(f"batch {max(batches)} needs more prompts than the {prompts} decoded per point "
                         f"(--prompts; the pair ships {len(pair.prompts)})")
    if any(prompts % b for b in batches):
        raise ValueError(f"the number of prompts ({prompts}) must be a multiple of every batch size {batches}")
    vocab = pair.target.config.vocab_size
    rows_all = encode_prompts(pair.prompts[:prompts], vocab)
    for model in (pair.target, pair.draft):  # the longest run first: fail now, not after an hour
        check_room(model, rows_all, max_new_tokens, lookahead=longest_block + 2)
    out_rows = []
    # timing each forward costs a CPU run nothing, so the timed runs themselves give c and v in situ; on
    # CUDA it costs a synchronisation per forward, so separate runs do
    in_run = device.type != "cuda"
    total = sum(prompts // b for b in batches) * len(configs) * repeats * (1 + len(variants))
    bar = tqdm(total=total, desc="decode bench", disable=not progress, file=sys.stderr)

    def run(group, variant, config, run_seed, time_forwards):
        clock = Clock(device, forwards=time_forwards)
        generator = torch.Generator(device=device).manual_seed(run_seed)
        if variant is None:
            return plain_decode(pair.target, group, max_new_tokens, config, generator, clock=clock)
        gamma, rule, chains = variant
        if gamma == "auto":
            gamma = make_policy("auto", calibration=calibrations[(rule, chains)], max_gamma=defaults.AUTO_MAX_GAMMA)
        if rule == "chains":
            return multi_draft_decode(pair.target, pair.draft, group[0], max_new_tokens, gamma, chains, config,
                                      generator, scheme=scheme, clock=clock)
        return speculative_decode(pair.target, pair.draft, group, max_new_tokens, gamma, config, generator,
                                  clock=clock, rule=rule)

    def per_call(runs, name):  # mean seconds of one timed forward of model ``name``
        return sum(getattr(r, f"{name}_seconds") for r in runs) / sum(r.timed_calls[name] for r in runs)

    for batch in batches:
        groups = [pair.prompts[i:i + batch] for i in range(0, prompts, batch)]
        costs = _forward_costs(pair, encode_prompts(groups[0], vocab), fixed)
        for config in configs:
            calibrations = {(rule, k): calibrate_steps(pair, encode_prompts(groups[0] * k, vocab), calibrated, config,
                                                       max_new_tokens, seed=seed,
                                                       rule="token" if rule == "chains" else rule)
                            for rule, k in sorted({(v[1], v[2]) for v in variants})}
            plain_step = calibrations[(rules[0], 1)]["seconds"]["plain"]  # the plain step at batch 1
            for key in calibrations:
                if key[0] == "chains":  # k chains are k rows: their steps count against plain decoding's step
                    calibrations[key] = per_plain_step(calibrations[key], plain_step)
            warm = torch.Generator(device=device).manual_seed(seed)
            plain_decode(pair.target, groups[0], 8, config, warm)  # warm-up, not timed
            speculative_decode(pair.target, pair.draft, groups[0], 8, fixed[0] if fixed else 4, config, warm)
            # results[(gamma, rule)][repeat][group]; None is plain decoding
            results = {v: [[None] * len(groups) for _ in range(repeats)] for v in [None, *variants]}
            for repeat in range(repeats):
                for index, group in enumerate(groups):
                    for variant in [None, *variants]:
                        results[variant][repeat][index] = run(group, variant, config, seed + repeat, in_run)
                        bar.update()
            plain_all = [r for rep in results[None] for r in rep]
            timed_plain = plain_all if in_run else [run(groups[0], None, config, seed, True)]
            target_call = per_call(timed_plain, "target")

            def decode_seconds(r):  # the decode phase only: the prefill (time to first token) is apart
                return r.seconds - r.prefill_seconds

            plain_group = [sum(decode_seconds(results[None][k][i]) for k in range(repeats))
                           for i in range(len(groups))]
            for variant in variants:
                gamma, rule, chains = variant  # (k below always counts repeats)
                calibration = calibrations[(rule, chains)]
                spec_all = [r for rep in results[variant] for r in rep]
                timed_spec = spec_all if in_run else [run(groups[0], variant, config, seed, True)]
                spec_group = [sum(decode_seconds(results[variant][k][i]) for k in range(repeats))
                              for i in range(len(groups))]
                group_speedups = [p / s for p, s in zip(plain_group, spec_group)]
                speedup = sum(plain_group) / sum(spec_group)
                per_repeat = [sum(map(decode_seconds, results[None][k]))
                              / sum(map(decode_seconds, results[variant][k])) for k in range(repeats)]
                accepted = torch.cat([torch.stack(r.accepted).reshape(-1) for r in spec_all])
                active = accepted[accepted >= 0].double()
                tokens_per_forward = max_new_tokens * len(spec_all) / sum(len(r.accepted) for r in spec_all)
                c_cal = calibration["c"]
                c, v = per_call(timed_spec, "draft") / target_call, per_call(timed_spec, "target") / target_call
                if gamma == "auto":  # each block drafts one length, shared by its rows: cost it block by block
                    blocks = [int(size.max()) for r in spec_all for size in r.lengths if int(size.max()) > 0]
                    block_gamma = statistics.mean(blocks)
                    # with the costs the policy chose by: the calibration's non-decreasing fit
                    fitted = make_policy("auto", calibration=calibration, max_gamma=defaults.AUTO_MAX_GAMMA).v_fitted
                    v_cal = statistics.mean(_interpolated(fitted, k) for k in blocks)
                    alpha = measured_acceptance_rate([torch.stack(r.accepted) for r in spec_all],
                                                     [torch.stack(r.lengths) for r in spec_all])
                else:
                    block_gamma, v_cal, blocks, fitted = gamma, calibration["v"][gamma], [], None
                    alpha = measured_acceptance_rate([accepted], gamma)
                predicted = tokens_per_forward / (block_gamma * c_cal + v_cal)
                decomposed = tokens_per_forward / (block_gamma * c + v)
                leviathan = (((1 - alpha ** (block_gamma + 1)) / (1 - alpha) if alpha < 1 else block_gamma + 1)
                             / (block_gamma * c_cal + 1))
                tokens = batch * max_new_tokens * repeats * len(groups)
                first = results[variant][0]
                # tokens per target call of each group (per prompt at batch 1): its spread over prompts
                group_tokens = [max_new_tokens * repeats / sum(len(results[variant][k][i].accepted)
                                                              for k in range(repeats)) for i in range(len(groups))]
                out_rows.append({
                    "batch": batch, "temperature": config.temperature, "gamma": gamma, "rule": rule, "drafts": chains,
                    "prompts": prompts, "groups": len(groups), "repeats": repeats,
                    "speedup": speedup, "speedup_ci95": _interval(plain_group, spec_group, seed),
                    "speedup_median": statistics.median(group_speedups), "speedup_per_group": group_speedups,
                    "speedup_per_repeat": per_repeat,
                    "predicted": predicted, "efficiency": speedup / predicted,
                    "calibration": {"c": c_cal, "v": v_cal, "v_alone": calibration["v_alone"].get(gamma),
                                    "v_from_alone": calibration["v_from_alone"],
                                    **({"v_fitted": fitted} if fitted else {})},
                    "mean_gamma": block_gamma,
                    # auto: how many blocks drafted each length (shared by the block's rows), over all repeats
                    **({"block_lengths": dict(sorted(collections.Counter(blocks).items()))} if blocks else {}),
                    "alpha": alpha, "tokens_per_target_forward": tokens_per_forward,
                    "tokens_per_active_block": float((active + 1).mean()),
                    "tokens_per_target_forward_per_group": group_tokens,
                    "speculative_seconds_per_group": spec_group,
                    "target_calls_per_group": [sum(len(results[variant][k][i].accepted) for k in range(repeats))
                                               for i in range(len(groups))],
                    "plain_tokens_per_s": tokens / sum(plain_group),
                    "speculative_tokens_per_s": tokens / sum(spec_group),
                    "predicted_leviathan": leviathan,
                    # in situ: the same run's own forward timings; a decomposition, not a prediction
                    "c": c, "v": v, "decomposed_speedup": decomposed, "in_situ_share": speedup / decomposed,
                    "plain_seconds": sum(plain_group), "speculative_seconds": sum(spec_group),
                    "plain_forward_seconds": sum(r.target_seconds for r in timed_plain),
                    "speculative_forward_seconds": sum(r.target_seconds + r.draft_seconds for r in timed_spec),
                    "plain_prefill_seconds": statistics.mean(r.prefill_seconds for r in plain_all),
                    "speculative_prefill_seconds": statistics.mean(r.prefill_seconds for r in spec_all),
                    # the forwards timed alone, back to back (warm caches): for comparison
                    "c_isolated": costs["draft_1"] / costs["target_1"],
                    "v_isolated": (costs[f"target_{gamma + 1}"] / costs["target_1"]) if gamma != "auto" else None,
                    "forward_costs_s": costs, "calibration_s": calibration["seconds"],
                    "repeat_share_median": statistics.median(
                        repeat_share(row, prompt) for result, group in zip(first, groups)
                        for row, prompt in zip(result.tokens, group)),
                    # per prompt of the first repeat: accepted drafts in each block, -1 once the row is done
                    "accepted_per_block": [seq for result in first for seq in torch.stack(result.accepted).T.tolist()],
                })
    bar.close()
    return {
        "benchmark": "decode",
        "what": "plain vs speculative decoding, side by side, same prompts and seeds; decode phase (after the "
                "prefill), totals over repeats; prediction from a separate calibration of the loop's steps",
        "environment": environment(device),
        "pair_sha256": pair.sha256,
        "pair": {k: pair.info[k] for k in ("target_validation_bpb", "draft_validation_bpb", "target_parameters",
                                          "draft_parameters") if k in pair.info},
        "prompts_sha256": _prompts_hash(pair.prompts),
        "config": {"gammas": gammas, "temperatures": temperatures, "batches": batches, "rules": rules,
                   "drafts": drafts, "scheme": scheme,
                   "prompts": prompts,
                   "max_new_tokens": max_new_tokens, "repeats": repeats, "seed": seed,
                   "forward_times_from": "the timed runs" if in_run else "one extra run per decoder (its speed unused)",
                   "top_p": top_p, "top_k": top_k, "dtype": str(pair.target.dtype)},
        "results": out_rows,
    }


def _interpolated(values: dict, k: int) -> float:
    """v at draft length k from a calibration's {length: v} (keys may be ints or, from JSON, strings)."""
    from .policy import _interpolate

    return _interpolate(sorted((int(g), float(x)) for g, x in values.items()), k)


def length_prices(record: dict, temperature: float, batch: int = 1, rule: str = "token") -> dict:
    """Return the cost model's prices of draft-length rules from a decode record's fixed-gamma rows at
    (``batch``, ``temperature``): speedups over plain decoding with no overhead beyond the calibrated steps
    (efficiency 1). Prices, not bounds: a run can fall short of them (overheads) or beat them (noise in
    the calibration).

    ``fixed``: each fixed gamma's prediction (its run's tokens per target call over the calibrated block
    cost gamma c + v(gamma)), and ``best_fixed``, the gamma with the highest. ``clairvoyant``: a rule that
    knew, before each block, how many drafts would pass (impossible when sampling, where that depends on
    draws not made yet), read from the blocks of the longest gamma's run: a block that accepted a >= 1
    drafts would have drafted exactly a, emitting a + 1 tokens at cost a c + v(a); one that accepted none
    would have skipped drafting for a plain step (one token, cost 1); one that accepted all would have
    drafted all (its limit is the longest gamma; ``clairvoyant_capped`` is the share of blocks that hit
    it). v between calibrated gammas is interpolated linearly. An estimate, not a bound in law: blocks of
    other lengths would meet other contexts. Also returned, per fixed gamma, what the run measured:
    ``speedup`` (with ``speedup_ci95``) and ``efficiency`` (speedup / price); and ``c`` and ``v``, the
    calibration the prices use.
    """
    rows = {r["gamma"]: r for r in record["results"]
            if r["batch"] == batch and r["temperature"] == temperature and r.get("rule", "token") == rule
            and r.get("drafts", 1) == 1 and r["gamma"] != "auto"}
    if not rows:
        raise ValueError(f"the record has no fixed-gamma rows at batch {batch}, temperature {temperature}")
    c = next(iter(rows.values()))["calibration"]["c"]
    v = {g: r["calibration"]["v"] for g, r in rows.items()}
    longest = max(rows)
    runs = [a for seq in rows[longest]["accepted_per_block"] for a in seq if a >= 0]
    tokens = sum(a + 1 for a in runs)
    cost = sum(1.0 if a == 0 else a * c + _interpolated(v, a) for a in runs)
    fixed = {g: r["predicted"] for g, r in sorted(rows.items())}
    return {"fixed": fixed, "best_fixed": max(fixed, key=fixed.get), "clairvoyant": tokens / cost,
            "clairvoyant_blocks": len(runs), "clairvoyant_skipped": sum(a == 0 for a in runs) / len(runs),
            "clairvoyant_capped": sum(a == longest for a in runs) / len(runs), "longest_gamma": longest,
            "speedup": {g: r["speedup"] for g, r in sorted(rows.items())},
            "speedup_ci95": {g: r["speedup_ci95"] for g, r in sorted(rows.items())},
            "efficiency": {g: r["efficiency"] for g, r in sorted(rows.items())}, "c": c, "v": v}


def _variant(row: dict) -> tuple:
    return row["batch"], row["temperature"], row["gamma"], row.get("rule", "token"), row.get("drafts", 1)


def compare_variants(record: dict, baseline: tuple = ("token", 1), other: tuple = ("block", 1)) -> list[dict]:
    """Return, per (batch, T, gamma) that a decode record measured under both variants (rule, drafts),
    ``other`` against ``baseline`` on the same prompts and seeds: each one's tokens per target call
    (pooled, with a 95% bootstrap interval over groups of prompts), their ratio other / baseline (paired
    over groups: the same tokens, so it is baseline calls / other calls) and the ratio of speedups
    other / baseline (paired: baseline speculative seconds / other speculative seconds; the plain runs
    are shared)."""
    seed = record["config"]["seed"]
    rows = {_variant(r): r for r in record["results"]}
    out = []
    for (batch, temperature, gamma, rule, k), base in rows.items():
        if (rule, k) != tuple(baseline) or (batch, temperature, gamma, *other) not in rows:
            continue
        alt = rows[(batch, temperature, gamma, *other)]
        new = record["config"]["max_new_tokens"] * record["config"]["repeats"] * batch
        base_calls, alt_calls = base["target_calls_per_group"], alt["target_calls_per_group"]
        out.append({
            "batch": batch, "temperature": temperature, "gamma": gamma, "groups": len(base_calls),
            "baseline": list(baseline), "other": list(other),
            "baseline_tokens_per_call": base["tokens_per_target_forward"],
            "baseline_tokens_per_call_ci95": _interval([new] * len(base_calls), base_calls, seed),
            "other_tokens_per_call": alt["tokens_per_target_forward"],
            "other_tokens_per_call_ci95": _interval([new] * len(alt_calls), alt_calls, seed),
            "tokens_per_call_ratio": sum(base_calls) / sum(alt_calls),
            "tokens_per_call_ratio_ci95": _interval(base_calls, alt_calls, seed),
            "baseline_speedup": base["speedup"], "other_speedup": alt["speedup"],
            "baseline_speedup_ci95": base["speedup_ci95"], "other_speedup_ci95": alt["speedup_ci95"],
            "speedup_ratio": sum(base["speculative_seconds_per_group"]) / sum(alt["speculative_seconds_per_group"]),
            "speedup_ratio_ci95": _interval(base["speculative_seconds_per_group"],
                                            alt["speculative_seconds_per_group"], seed),
        })
    return out


def _prompts_hash(prompts) -> str:
    import hashlib

    digest = hashlib.sha256()
    for prompt in prompts:
        if not isinstance(prompt, bytes):  # token ids (a transformers tokenizer's): 4 bytes each
            prompt = b"".join(int(t).to_bytes(4, "big") for t in prompt)
        digest.update(len(prompt).to_bytes(4, "big") + prompt)
    return digest.hexdigest()


DECODE_LEGEND = (
    "alpha: accepted / tested drafts; tok/fwd: new tokens per row per target call; speedup: plain / speculative "
    "decode-phase seconds, pooled over prompts and repeats, with its 95% bootstrap interval over groups of "
    "prompts and the median over groups; c, v: a draft step and a verification step over gamma+1 positions, "
    "relative to a plain step, calibrated apart from the runs; pred.: tok/fwd / (gamma c + v); effic.: "
    "speedup / pred. A v below 1 (a step over gamma+1 positions cheaper than over one) is timing noise.")


def format_decode_table(record: dict, batch: Optional[int] = None, gamma: Optional[int] = None,
                        markdown: bool = False, rule: Optional[str] = None) -> str:
    """Return the decode record (optionally one batch size, one gamma or one verification rule) as a table,
    plain text or Markdown (``markdown=True``), with what it was measured on and a legend. A record of
    several rules gets a rule column."""
    rows = []
    several = len(record["config"].get("rules", ["token"])) > 1 or max(record["config"].get("drafts", [1])) > 1
    for row in record["results"]:
        if (batch is not None and row["batch"] != batch) or (gamma is not None and row["gamma"] != gamma):
            continue
        if rule is not None and row.get("rule", "token") != rule:
            continue
        low, high = row["speedup_ci95"]
        times, dash = ("×", "–") if markdown else ("x", "-")
        interval = f"{low:.2f}{dash}{high:.2f}" if low == low else "(one group)"
        rows.append([str(row["batch"]), f"{row['temperature']:g}", str(row["gamma"]), f"{row['alpha']:.3f}",
                     f"{row['tokens_per_target_forward']:.2f}", f"{row['speedup']:.2f}{times}", interval,
                     f"{row['speedup_median']:.2f}{times}", f"{row['calibration']['c']:.3f}",
                     f"{row['calibration']['v']:.2f}", f"{row['predicted']:.2f}{times}", f"{row['efficiency']:.2f}"])
        if several:
            k = row.get("drafts", 1)
            rows[-1].insert(3, row.get("rule", "token") + (f" {times}{k}" if row.get("rule") == "chains" else ""))
    env = record["environment"]
    config = record["config"]
    notes = [f"measured on {env['device']} ({env.get('accelerator', env['cpu'])}), torch {env['torch']}, "
             f"{env['threads']} threads; pair {record['pair_sha256'][:12]}; {config['prompts']} prompts, "
             f"{config['repeats']} repeat{'s' if config['repeats'] != 1 else ''}, {config['max_new_tokens']} new "
             "tokens each", DECODE_LEGEND]
    headers = ["batch", "T", "gamma", "alpha", "tok/fwd", "speedup", "95% interval", "median", "c", "v", "pred.",
               "effic."]
    if several:
        headers.insert(3, "rule")
    return _table(headers, rows, notes, markdown)


#: The decoders the race runs on every prompt, in turn: this engine (speculative and plain, on the library's
#: models, and speculative on the exported models wrapped by ``hf.wrap``) and transformers' ``generate``
#: (plain, and assisted under each schedule raced).
PEER_LEGEND = (
    "tok/s: new tokens per second of the whole call (prefill included), pooled over prompts and repeats, "
    "with a 95% bootstrap interval over prompts; ours/HF: the ratio of the two, paired by prompt; alpha: "
    "accepted / drafted tokens; tok/call: new tokens per target call that emits tokens.")


def _peer_rate(tally: dict, name: str) -> dict:
    """Tokens per second of decoder ``name``, pooled over prompts, with its interval."""
    seconds, made = tally["seconds"][name], tally["made"]
    return {f"{name}_tokens_per_s": made * len(seconds) / sum(seconds),
            f"{name}_tokens_per_s_ci95": _ci([seconds], lambda s: made * len(s) / sum(s), tally["seed"])}


def _peer_calls(tally: dict, name: str, label: str) -> dict:
    """Acceptance, tokens per target call and drafts per call of decoder ``name``, with intervals."""
    accepted, drafted, blocks = (tally[k][name] for k in ("accepted", "drafted", "blocks"))
    made, seed = tally["made"], tally["seed"]
    return {f"{label}_acceptance": sum(accepted) / sum(drafted),
            f"{label}_acceptance_ci95": _ci([accepted, drafted], lambda a, d: sum(a) / sum(d), seed),
            f"{label}_tokens_per_call": made * len(blocks) / sum(blocks),
            f"{label}_tokens_per_call_ci95": _ci([blocks], lambda b: made * len(b) / sum(b), seed),
            f"{label}_drafts_per_call": sum(drafted) / sum(blocks)}


def _peer_ratio(tally: dict, a: str, b: str) -> tuple:
    """Tokens per second of ``a`` over those of ``b`` (the same tokens), paired by prompt, with its interval."""
    return speed_ratio(tally["seconds"][a], tally["seconds"][b], tally["seed"])


def bench_peer(pair, temperatures: Iterable[float] = (0.0, 1.0), gamma: int = 4,
               schedules: Iterable[str] = ("default", "fixed"), prompts: int = 32, max_new_tokens: int = 128,
               repeats: int = 2, seed: int = 0, progress: bool = True,
               policies: Iterable[str] = ("fixed",)) -> dict:
    """Return a record of this engine against transformers' assisted generation on the same models, side by side.

    The shipped pair is exported to transformers' GPT-2 (:func:`hf.export`: equal logits), so both sides
    decode the same models, prompts and number of new tokens at batch 1 (the batch transformers'
    assisted generation supports), on one machine, in one run. For each temperature, every prompt is
    decoded in turn by: this engine at a fixed ``gamma`` (``ours``), its plain decoding
    (``ours_plain``), this engine on the exported models through :func:`hf.wrap` (``ours_on_hf_models``:
    the same loop with transformers' forwards, at the fixed ``gamma``; its rows give its speed over the
    row's transformers schedule and over ``ours`` at the fixed ``gamma``, paired by prompt, with
    intervals), ``generate`` without an assistant (``hf_plain``) and
    ``generate(assistant_model=...)`` under each schedule in ``schedules`` (:data:`hf.HF_SCHEDULES`;
    "fixed" drafts ``gamma``). Each call is timed whole (prefill included); the round repeats
    ``repeats`` times after a warm-up. At temperature 0 every decoder must emit the target's greedy
    tokens, and the record says whether they did. One row per (temperature, schedule, policy).

    ``policies`` (:data:`policy.POLICIES`) are this engine's draft-length policies raced, each a decoder of
    its own: ``fixed`` at ``gamma`` (the decoder ``ours``), ``heuristic`` (transformers' schedule,
    starting at ``gamma``) and ``confidence`` (transformers' default threshold), both allowed up to
    :data:`defaults.PEER_MAX_GAMMA` drafts as transformers' default allows, and ``auto`` (the cost model,
    calibrated at this temperature before the runs, up to :data:`defaults.AUTO_MAX_GAMMA`; its rows keep
    that ``calibration``: c, v, the non-decreasing fit it chose by, and the rule). A name with ``+block``
    (``auto+block``) runs the policy under block verification, calibrated with that rule. In each row
    the ``ours_*`` fields are those of the row's policy, and ``rule`` its verification rule.

    ``pair`` may also be a wrapped transformers pair (:func:`hf.pair`, :func:`hf.load_pair`): then
    ``ours`` runs this engine on the wrapped models, transformers runs the models themselves, and there
    is no ``ours_on_hf_models``. transformers stops at an end-of-sequence token unless told otherwise;
    every call here asks for exactly ``max_new_tokens`` (``min_new_tokens``), which masks that token on
    transformers' side only, so greedy outputs can differ where a model would end its text.
    """
    import transformers
    from tqdm import tqdm

    from .decode import encode_prompts, plain_decode, speculative_decode
    from .hf import HF_SCHEDULES, export, plain_generate, wrap
    from .policy import POLICIES, make_policy
    from .transforms import SamplingConfig

    temperatures, schedules, policies = list(temperatures), list(schedules), list(policies)
    if not policies or len({split_policy(p) for p in policies}) != len(policies) or any(
            split_policy(p)[0] not in POLICIES for p in policies):
        raise ValueError(f"policies must be distinct names among {', '.join(POLICIES)}, each optionally with "
                         f"+block, got {policies}")
    for name, value in (("gamma", gamma), ("prompts", prompts), ("max_new_tokens", max_new_tokens),
                        ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not temperatures or any(t < 0 for t in temperatures):
        raise ValueError(f"temperatures must be >= 0, got {temperatures}")
    if not schedules or any(s not in HF_SCHEDULES for s in schedules):
        raise ValueError(f"schedules must be among {', '.join(HF_SCHEDULES)}, got {schedules}")
    if prompts > len(pair.prompts):
        raise ValueError(f"{prompts} prompts asked for, but the pair ships {len(pair.prompts)}")
    rows = encode_prompts(pair.prompts[:prompts], pair.target.config.vocab_size)
    from .decode import check_room

    for model in (pair.target, pair.draft):  # transformers' default schedule drafts up to 20 tokens
        check_room(model, rows, max_new_tokens, lookahead=max(gamma, 20, defaults.PEER_MAX_GAMMA) + 2)
    device = pair.target.device
    shipped = isinstance(pair.target, GPT)  # the library's models, or a wrapped transformers pair (hf.pair)
    if shipped:
        hf_target, hf_draft = export(pair.target), export(pair.draft)
        wrapped = (wrap(hf_target), wrap(hf_draft))
    else:  # ours already runs transformers' forwards: no third variant
        hf_target, hf_draft = pair.target.model, pair.draft.model
    keys = {p: "ours" if p == "fixed" else f"ours_{p.replace('+', '_')}" for p in policies}  # each one's decoder
    with_wrapped = shipped and "fixed" in policies
    ours_names = [*keys.values(), "ours_plain", *(["ours_on_hf_models"] if with_wrapped else [])]
    names = [*ours_names, "hf_plain", *[f"hf_{s}" for s in schedules]]

    def decoders(config, run_seed, lengths):
        generator = lambda: torch.Generator(device=device).manual_seed(run_seed)  # noqa: E731
        t = config.temperature
        out = {keys[p]: functools.partial(_ours, pair, lengths[p], config, generator, split_policy(p)[1])
               for p in policies}
        out.update({"ours_plain": lambda r, n: plain_decode(pair.target, [r], n, config, generator()),
                    "hf_plain": lambda r, n: plain_generate(hf_target, r, n, t, run_seed)})
        if with_wrapped:
            out["ours_on_hf_models"] = lambda r, n: speculative_decode(*wrapped, [r], n, gamma, config, generator())
        for s in schedules:
            out[f"hf_{s}"] = functools.partial(_assisted, hf_target, hf_draft, t, s, gamma, run_seed)
        return out

    def tokens_of(result):
        return result if isinstance(result, list) else result.tokens

    total = len(temperatures) * repeats * prompts * len(names)
    bar = tqdm(total=total, desc="peer race", disable=not progress, file=sys.stderr)
    out_rows = []
    greedy_equal = {}
    for temperature in temperatures:
        config = SamplingConfig(temperature=temperature)
        lengths, calibrations = {}, {}  # the cost model's calibration, recorded in its rows
        for p in policies:
            base, rule = split_policy(p)
            if base == "fixed":
                lengths[p] = gamma
            elif base == "auto":  # calibrated at this temperature and rule, before any timed run
                calibration = calibrate_steps(pair, rows[:1], list(range(1, defaults.AUTO_MAX_GAMMA + 1)), config,
                                              max_new_tokens, seed=seed, rule=rule)
                lengths[p] = make_policy("auto", calibration=calibration, max_gamma=defaults.AUTO_MAX_GAMMA)
                calibrations[p] = {"rule": rule, "c": calibration["c"], "v": calibration["v"],
                                   "v_fitted": lengths[p].v_fitted, "v_from_alone": calibration.get("v_from_alone", [])}
            else:
                lengths[p] = make_policy(base, gamma, max_gamma=defaults.PEER_MAX_GAMMA)
        for run in decoders(config, seed, lengths).values():  # warm-up, not timed
            run(rows[0], 16)
        seconds = {n: [0.0] * prompts for n in names}
        blocks = {n: [0] * prompts for n in names}  # target calls that emitted tokens
        drafted = {n: [0] * prompts for n in names}
        accepted = {n: [0] * prompts for n in names}
        reference = {}
        for repeat in range(repeats):
            runs = decoders(config, seed + repeat, lengths)
            for i, row in enumerate(rows):
                for name in names:
                    synchronize(device)
                    began = time.perf_counter()
                    result = runs[name](row, max_new_tokens)
                    synchronize(device)
                    seconds[name][i] += time.perf_counter() - began
                    bar.update()
                    tokens = tokens_of(result)
                    tokens = tokens[0] if tokens and isinstance(tokens[0], list) else tokens
                    if temperature == 0:
                        reference.setdefault(i, tokens)
                        greedy_equal[name] = greedy_equal.get(name, True) and tokens == reference[i]
                    if name.startswith("ours") and name != "ours_plain":
                        counts = torch.stack(result.accepted).reshape(-1)
                        counts = counts[counts >= 0]
                        blocks[name][i] += len(counts)
                        if result.lengths:  # a policy: each block's own length
                            sizes = torch.stack(result.lengths).reshape(-1)
                            drafted[name][i] += int(sizes[sizes >= 0].sum())
                        else:
                            drafted[name][i] += gamma * len(counts)
                        accepted[name][i] += int(counts.sum())
                    elif name.startswith("hf_") and name != "hf_plain":
                        blocks[name][i] += len(result.drafted)
                        drafted[name][i] += sum(result.drafted)
                        accepted[name][i] += sum(result.accepted)
        made = max_new_tokens * repeats  # new tokens per prompt over the repeats
        tally = {"seconds": seconds, "blocks": blocks, "drafted": drafted, "accepted": accepted, "made": made,
                 "seed": seed}
        for schedule, policy_name in itertools.product(schedules, policies):
            hf, ours = f"hf_{schedule}", keys[policy_name]
            over_hf, over_hf_ci = _peer_ratio(tally, ours, hf)
            speedup, speedup_ci = _peer_ratio(tally, ours, "ours_plain")
            hf_speedup, hf_speedup_ci = _peer_ratio(tally, hf, "hf_plain")
            base, rule = split_policy(policy_name)
            described = lengths[policy_name].describe() if base != "fixed" else f"fixed {gamma}"
            row = {"temperature": temperature, "batch": 1, "policy": policy_name, "rule": rule, "gamma": gamma,
                   "policy_described": described + (", block verification" if rule == "block" else ""),
                   **({"calibration": calibrations[policy_name]} if policy_name in calibrations else {}),
                   "hf_schedule": schedule, "prompts": prompts, "repeats": repeats, "max_new_tokens": max_new_tokens,
                   **_as_ours(_peer_rate(tally, ours), ours),
                   **{k: v for name in ("ours_plain", "hf_plain", *(["ours_on_hf_models"] if with_wrapped else []))
                      for k, v in _peer_rate(tally, name).items()}}
            assisted = _peer_rate(tally, hf)
            row.update({"hf_assisted_tokens_per_s": assisted[f"{hf}_tokens_per_s"],
                        "hf_assisted_tokens_per_s_ci95": assisted[f"{hf}_tokens_per_s_ci95"],
                        "ours_over_hf_assisted": over_hf, "ours_over_hf_assisted_ci95": over_hf_ci,
                        "ours_speedup": speedup, "ours_speedup_ci95": speedup_ci,
                        "hf_assisted_speedup": hf_speedup, "hf_assisted_speedup_ci95": hf_speedup_ci,
                        **_peer_calls(tally, ours, "ours"), **_peer_calls(tally, hf, "hf"),
                        **(_peer_calls(tally, "ours_on_hf_models", "ours_on_hf_models") if with_wrapped else {}),
                        "seconds_per_prompt": {"ours": seconds[ours],
                                               **{n: seconds[n] for n in ("ours_plain", "hf_plain", hf)}}})
            if with_wrapped:  # the decomposition at the fixed gamma: same loop, transformers' forwards
                row["seconds_per_prompt"].update({"ours_fixed": seconds["ours"],
                                                  "ours_on_hf_models": seconds["ours_on_hf_models"]})
                for label, other in (("over_hf_assisted", hf), ("over_ours_fixed", "ours")):
                    ratio, ratio_ci = _peer_ratio(tally, "ours_on_hf_models", other)
                    row[f"ours_on_hf_models_{label}"], row[f"ours_on_hf_models_{label}_ci95"] = ratio, ratio_ci
            if temperature == 0:
                row["greedy_outputs_equal"] = {n: greedy_equal[n]
                                               for n in (*ours_names, "hf_plain", hf) if n != "ours_plain"}
            out_rows.append(row)
    bar.close()
    sklearn = importlib.util.find_spec("sklearn") is not None
    return {
        "benchmark": "peer",
        "what": "this engine vs transformers' assisted generation on the same exported models, batch 1, side by "
                "side, every prompt decoded by every decoder in turn; whole calls timed (prefill included)",
        "environment": {**environment(device), "transformers": transformers.__version__,
                        "scikit_learn_installed": sklearn},
        "pair_sha256": pair.sha256,
        "prompts_sha256": _prompts_hash(pair.prompts[:prompts]),
        "config": {"temperatures": temperatures, "gamma": gamma, "schedules": schedules, "prompts": prompts,
                   "max_new_tokens": max_new_tokens, "repeats": repeats, "seed": seed,
                   "dtype": str(pair.target.dtype), "hf_default": "transformers' GenerationConfig defaults: "
                   "num_assistant_tokens 20, schedule constant, assistant_confidence_threshold 0.4"
                   + ("" if sklearn else " (not adapted: scikit-learn is not installed)")},
        "results": out_rows,
    }


def _as_ours(fields: dict, key: str) -> dict:
    """Rename a decoder's fields (``ours_auto_tokens_per_s``, ...) to the row's ``ours_*``."""
    return {"ours" + k[len(key):]: v for k, v in fields.items()}


def _ours(pair, length, config, generator, rule, prompt, n):
    from .decode import speculative_decode

    return speculative_decode(pair.target, pair.draft, [prompt], n, length, config, generator(), rule=rule)


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


def _assisted(target, draft, temperature, schedule, gamma, seed, prompt, n):
    from .hf import assisted_generate

    return assisted_generate(target, draft, prompt, n, temperature, schedule, gamma, seed)


def format_peer_table(record: dict, markdown: bool = False, policy: Optional[str] = None) -> str:
    """Return the race as a table: one line per (temperature, transformers schedule, this engine's policy),
    or only the rows of ``policy``. A record of several policies gets a policy column."""
    def interval(row, key, digits=0):
        low, high = row[f"{key}_ci95"]
        return f"{row[key]:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"

    several = len({r.get("policy", "fixed") for r in record["results"]}) > 1 and policy is None
    headers = ["T", "HF schedule", "ours tok/s", "HF assisted tok/s", "ours/HF", "HF plain tok/s",
               "alpha ours", "alpha HF", "tok/call ours", "tok/call HF"]
    rows = []
    for r in record["results"]:
        if policy is not None and r.get("policy", "fixed") != policy:
            continue
        rows.append([f"{r['temperature']:g}",
                     r["hf_schedule"] + (f" ({r['gamma']})" if r["hf_schedule"] == "fixed" else ""),
                     interval(r, "ours_tokens_per_s"), interval(r, "hf_assisted_tokens_per_s"),
                     interval(r, "ours_over_hf_assisted", 2), interval(r, "hf_plain_tokens_per_s"),
                     interval(r, "ours_acceptance", 2), interval(r, "hf_acceptance", 2),
                     interval(r, "ours_tokens_per_call", 2), interval(r, "hf_tokens_per_call", 2)])
        if several:
            rows[-1].insert(2, r.get("policy_described", r.get("policy", "fixed")))
    if several:
        headers.insert(2, "ours: policy")
    env = record["environment"]
    notes = [PEER_LEGEND, f"ours: token-wise unless block verification is named, fixed gamma "
             f"{record['config']['gamma']} unless a policy is named; "
             "batch 1; "
             f"{record['config']['prompts']} prompts x {record['config']['repeats']} repeats, "
             f"{record['config']['max_new_tokens']} new tokens; transformers {env['transformers']}, "
             f"torch {env['torch']}, {env['device']}, {env.get('accelerator') or env['cpu']}."]
    return _table(headers, rows, notes, markdown)
