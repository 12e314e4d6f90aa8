"""Benchmarks: measured side by side in one run, reported as ratios, recorded with what they ran on.

Explained in: notebooks/04_transforms (the sampler benchmark).

A benchmark here is never a timed test: it measures, prints and writes a JSON record. Every record
carries :func:`environment` (device, torch version, thread count, CPU, Python), so a reader can tell what
a number was measured on.
"""

from __future__ import annotations

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
from .sampler import draw_randomness, reference_rejection_sample, rejection_sample
from .timing import Clock, environment, median_call_seconds, synchronize

__all__ = ["environment", "time_side_by_side", "bench_sampler", "bench_decode", "write_record",
           "format_sampler_table", "format_decode_table", "SAMPLER_LEGEND", "DECODE_LEGEND"]


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


def format_sampler_table(record: dict) -> str:
    """Return the sampler record as a plain-text table, with a legend under it."""
    lines = [f"{'batch':>5} {'V':>6} {'batched pos/s':>14} {'reference pos/s':>16} {'ratio':>7}"]
    for row in record["results"]:
        lines.append(f"{row['batch']:>5} {row['vocab']:>6} {row['batched_positions_per_s']:>14,.0f} "
                     f"{row['reference_positions_per_s']:>16,.0f} {row['speedup']:>6.1f}x")
    env = record["environment"]
    lines.append(f"measured on {env['device']} ({env.get('accelerator', env['cpu'])}), torch {env['torch']}, "
                 f"{env['threads']} threads")
    lines.append(SAMPLER_LEGEND)
    return "\n".join(lines)


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


def _forward_costs(pair, batch: int, gammas) -> dict:
    """Return median seconds of: one draft token, one target token, and target over gamma+1 tokens,
    each call timed alone, back to back, by ``torch.utils.benchmark.Timer``."""
    from .decode import encode_prompts, prefill

    rows = encode_prompts(pair.prompts[:batch])
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


def bench_decode(
    pair,
    gammas: Iterable[int] = defaults.BENCH_DECODE["gammas"],
    temperatures: Iterable[float] = defaults.BENCH_DECODE["temperatures"],
    batches: Iterable[int] = defaults.BENCH_DECODE["batches"],
    max_new_tokens: int = defaults.BENCH_DECODE["max_new_tokens"],
    repeats: int = defaults.BENCH_DECODE["repeats"],
    seed: int = defaults.BENCH_DECODE["seed"],
    *,
    progress: bool = True,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
) -> dict:
    """Return a record of plain vs speculative decoding, side by side, for every (batch, T, gamma).

    Runs on the device the pair's weights are on (``pair.target.device``). Every setting is checked
    before the first run, so a bad one fails at once and no record is written. For each batch size and
    temperature (with ``top_k`` / ``top_p`` if given), plain decoding and speculative decoding at every
    gamma run in turn, ``repeats`` times, on the same prompts (the first ``batch`` of the pair's
    held-out prompts) with the same seed. Reported per point: alpha; tokens per target forward (new
    tokens per row / target calls after the prefill, so a batch that waits for its slowest row is
    charged for it); tokens per active block (accepted + 1, averaged over the blocks where a row was
    still decoding: what alpha alone predicts); c (seconds per draft forward / seconds per
    single-position target forward) and v (seconds per verification forward over gamma+1 positions /
    the same), both timed in situ, where the forwards really run (in the timed runs on a CPU, in one
    extra run per decoder on CUDA, where timing a forward synchronises the device), with the ratios from
    forwards timed alone kept beside them; tokens per second for both in the decode phase (all repeats'
    tokens / all their seconds after the prefill; the mean prefill of each is recorded apart, the
    speculative one including the draft's); the measured speedup (their ratio); Leviathan et al.'s
    prediction from alpha and c; the refined figure tokens_per_forward / (gamma c + v); and the
    efficiency measured / refined. The refined figure uses the same run's alpha, c and v, so it is a
    decomposition of the measured speedup, not a prediction: pooled this way, the efficiency equals
    (plain decode seconds / plain forward seconds) / (speculative decode seconds / speculative forward
    seconds) on a CPU, the share of time each decoder spends outside its forwards.
    """
    from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

    from .decode import check_room, encode_prompts, plain_decode, speculative_decode
    from .stats import measured_acceptance_rate
    from .transforms import SamplingConfig

    gammas, temperatures, batches = list(gammas), list(temperatures), list(batches)
    device = pair.target.device
    configs = [SamplingConfig(temperature=t, top_k=top_k, top_p=top_p) for t in temperatures]
    if not gammas or not temperatures or not batches:
        raise ValueError("gammas, temperatures and batches must each name at least one value")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if min(batches) < 1 or min(gammas) < 1:
        raise ValueError("batch sizes and gammas must be >= 1")
    if max(batches) > len(pair.prompts):
        raise ValueError(f"batch {max(batches)} needs more prompts than the pair ships ({len(pair.prompts)})")
    rows_all = encode_prompts(pair.prompts[:max(batches)], pair.target.config.vocab_size)
    for model in (pair.target, pair.draft):  # the longest run first: fail now, not after an hour
        check_room(model, rows_all, max_new_tokens, lookahead=max(gammas) + 2)
    rows = []
    # timing each forward costs a CPU run nothing, so the timed runs themselves give c and v; on CUDA it
    # costs a synchronisation per forward, so separate runs do
    in_run = device.type != "cuda"
    total = len(batches) * len(temperatures) * (repeats * (1 + len(gammas)) + 1)
    bar = tqdm(total=total, desc="decode bench", disable=not progress, file=sys.stderr)

    def run_plain(prompts, config, run_seed, time_forwards):
        clock = Clock(device, forwards=time_forwards)
        generator = torch.Generator(device=device).manual_seed(run_seed)
        return plain_decode(pair.target, prompts, max_new_tokens, config, generator, clock=clock)

    def run_spec(prompts, gamma, config, run_seed, time_forwards):
        clock = Clock(device, forwards=time_forwards)
        generator = torch.Generator(device=device).manual_seed(run_seed)
        return speculative_decode(pair.target, pair.draft, prompts, max_new_tokens, gamma, config, generator,
                                  clock=clock)

    for batch in batches:
        prompts = pair.prompts[:batch]
        costs = _forward_costs(pair, batch, gammas)
        for config in configs:
            plain_runs, spec_results = [], {g: [] for g in gammas}
            warm = torch.Generator(device=device).manual_seed(seed)
            plain_decode(pair.target, prompts, 8, config, warm)  # warm-up, not timed
            speculative_decode(pair.target, pair.draft, prompts, 8, gammas[0], config, warm)
            for repeat in range(repeats):
                plain_runs.append(run_plain(prompts, config, seed + repeat, in_run))
                bar.update()
                for gamma in gammas:
                    spec_results[gamma].append(run_spec(prompts, gamma, config, seed + repeat, in_run))
                    bar.update()
            # the decode phase only: the prompt's prefill (time to first token) is reported apart, since
            # speculative decoding changes the time per output token, and adds only the draft's prefill
            plain_seconds = sum(r.seconds - r.prefill_seconds for r in plain_runs)
            plain_tps = batch * max_new_tokens * repeats / plain_seconds
            # c and v in situ: every forward timed where it happens, after the prefill
            timed_plain, timed_spec = plain_runs, spec_results
            if not in_run:  # one more run of each decoder, same seed, only for the forward times
                timed_plain = [run_plain(prompts, config, seed, True)]
                timed_spec = {gamma: [run_spec(prompts, gamma, config, seed, True)] for gamma in gammas}
            def per_call(runs, name):  # mean seconds of one timed forward of model ``name``
                return (sum(getattr(r, f"{name}_seconds") for r in runs)
                        / sum(r.timed_calls[name] for r in runs))

            target_call = per_call(timed_plain, "target")
            in_situ = {gamma: {"c": per_call(timed_spec[gamma], "draft") / target_call,
                               "v": per_call(timed_spec[gamma], "target") / target_call} for gamma in gammas}
            bar.update()
            for gamma in gammas:
                results = spec_results[gamma]
                accepted = torch.cat([torch.stack(r.accepted).reshape(-1) for r in results])
                active = accepted[accepted >= 0].double()
                alpha = measured_acceptance_rate([accepted], gamma)
                # what a row gets per target call: the batch waits for its slowest row, so with batch > 1
                # this is below the mean over active row-blocks (rows that finished early sit idle)
                blocks = statistics.mean(len(r.accepted) for r in results)
                tokens_per_forward = max_new_tokens / blocks
                tokens_per_active_block = float((active + 1).mean())
                c, v = in_situ[gamma]["c"], in_situ[gamma]["v"]
                # totals over the repeats, pooled like c and v: the efficiency is then exactly (plain
                # seconds / its forward seconds) / (speculative seconds / its forward seconds), each side's
                # own overhead, and a slow spell of a shared machine that stretches a run's forwards
                # stretches its total alike
                spec_seconds = sum(r.seconds - r.prefill_seconds for r in results)
                spec_tps = batch * max_new_tokens * repeats / spec_seconds
                measured = spec_tps / plain_tps
                leviathan = ((1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else gamma + 1) / (gamma * c + 1)
                refined = tokens_per_forward / (gamma * c + v)
                rows.append({
                    "batch": batch, "temperature": config.temperature, "gamma": gamma,
                    "alpha": alpha, "tokens_per_target_forward": tokens_per_forward,
                    "tokens_per_active_block": tokens_per_active_block, "blocks": blocks, "c": c, "v": v,
                    "plain_tokens_per_s": plain_tps, "speculative_tokens_per_s": spec_tps,
                    "speedup": measured, "predicted_leviathan": leviathan, "predicted_refined": refined,
                    "efficiency": measured / refined,
                    # totals over the repeats (forward seconds from the runs that timed them)
                    "plain_seconds": plain_seconds, "speculative_seconds": spec_seconds,
                    "plain_prefill_seconds": sum(r.prefill_seconds for r in plain_runs) / repeats,
                    "speculative_prefill_seconds": sum(r.prefill_seconds for r in results) / repeats,
                    "plain_forward_seconds": sum(r.target_seconds for r in timed_plain),
                    "speculative_forward_seconds": sum(r.target_seconds + r.draft_seconds for r in timed_spec[gamma]),
                    # the same ratios from forwards timed alone, back to back (warm caches): for comparison
                    "c_isolated": costs["draft_1"] / costs["target_1"],
                    "v_isolated": costs[f"target_{gamma + 1}"] / costs["target_1"],
                    "forward_costs_s": costs,
                    # per row of the first repeat: accepted drafts in each block, -1 once the row is done
                    "accepted_per_block": torch.stack(results[0].accepted).T.tolist(),
                })
    bar.close()
    return {
        "benchmark": "decode",
        "what": "plain vs speculative decoding, side by side, same prompts and seeds; decode phase (after the "
                "prefill), totals over repeats",
        "environment": environment(device),
        "pair_sha256": pair.sha256,
        "pair": {k: pair.info[k] for k in ("target_validation_bpb", "draft_validation_bpb", "target_parameters",
                                          "draft_parameters") if k in pair.info},
        "prompts_sha256": _prompts_hash(pair.prompts),
        "config": {"gammas": gammas, "temperatures": temperatures, "batches": batches,
                   "max_new_tokens": max_new_tokens, "repeats": repeats, "seed": seed,
                   "forward_times_from": "the timed runs" if in_run else "one extra run per decoder (its speed unused)",
                   "top_p": top_p, "top_k": top_k, "dtype": str(pair.target.token_embedding.weight.dtype)},
        "results": rows,
    }


def _prompts_hash(prompts) -> str:
    import hashlib

    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(len(prompt).to_bytes(4, "big") + prompt)
    return digest.hexdigest()


DECODE_LEGEND = (
    "alpha: accepted / tested drafts; tok/fwd: new tokens per row per target call; c: draft forward / target "
    "forward (in situ); v: verification forward over gamma+1 positions / target forward; tok/s: decode-phase "
    "tokens per second (prefill excluded); speedup: spec / plain tok/s, same run; pred.: Leviathan et al. "
    "from alpha and c; refined: tok/fwd / (gamma c + v), from this run's own figures (a decomposition, not a "
    "prediction); effic.: speedup / refined")


def format_decode_table(record: dict, batch: Optional[int] = None, gamma: Optional[int] = None) -> str:
    """Return the decode record (optionally one batch size or one gamma) as a plain-text table, with a legend."""
    lines = [f"{'batch':>5} {'T':>4} {'gamma':>5} {'alpha':>6} {'tok/fwd':>7} {'c':>6} {'v':>5} {'plain tok/s':>11} "
             f"{'spec tok/s':>10} {'speedup':>7} {'pred.':>6} {'refined':>7} {'effic.':>6}"]
    for row in record["results"]:
        if (batch is not None and row["batch"] != batch) or (gamma is not None and row["gamma"] != gamma):
            continue
        lines.append(f"{row['batch']:>5} {row['temperature']:>4g} {row['gamma']:>5} {row['alpha']:>6.3f} "
                     f"{row['tokens_per_target_forward']:>7.2f} {row['c']:>6.3f} {row['v']:>5.2f} "
                     f"{row['plain_tokens_per_s']:>11.0f} {row['speculative_tokens_per_s']:>10.0f} "
                     f"{row['speedup']:>6.2f}x {row['predicted_leviathan']:>5.2f}x "
                     f"{row['predicted_refined']:>6.2f}x {row['efficiency']:>6.2f}")
    env = record["environment"]
    lines.append(f"measured on {env['device']} ({env.get('accelerator', env['cpu'])}), torch {env['torch']}, "
                 f"{env['threads']} threads; pair {record['pair_sha256'][:12]}")
    lines.append(DECODE_LEGEND)
    return "\n".join(lines)
