"""The race of drafts (``bench drafts``): plain decoding and speculative decoding with each of several
drafts of one target, side by side in one run, each draft with its own calibration and prediction.

Explained in: notebooks/14_which_draft.

The drafts themselves (saved, loaded, swapped into a pair, priced and scored before any decoding) are
:mod:`speculative.measure.drafts`; this module only times decoding with them. :func:`bench_drafts` returns
a record (:mod:`speculative.measure.records`) whose observations each name their draft, optionally ending
each run with :func:`calibration.profile_block` of the first draft.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Optional

from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

from speculative import defaults
from speculative.engine.decode import check_room, encode_prompts
from speculative.engine.timing import environment
from speculative.measure.analysis import analyse
from speculative.measure.bench_decode import _DecodeRunner, _held_out
from speculative.measure.calibration import _forward_costs, calibrate_steps, profile_block
from speculative.measure.drafts import draft_training
from speculative.measure.records import SCHEMA_VERSION
from speculative.measure.settings import DecodeSettings, _positive_int, _settings
from speculative.measure.shared import prompts_hash
from speculative.sampling.transforms import SamplingConfig

__all__ = ["bench_drafts"]


def _profiles(pair, s: DecodeSettings) -> list[dict]:
    """:func:`profile_block` of ``pair``'s draft at gamma 4 on its first prompt, at every temperature of
    ``s``, and greedily also on the path the loop took before the greedy fast path."""
    rows, out = encode_prompts(pair.prompts[:1], pair.target.config.vocab_size), []
    for temperature in s.temperatures:
        config = SamplingConfig(temperature=temperature, top_k=s.top_k, top_p=s.top_p)
        for fast in ((True, False) if config.greedy else (True,)):
            out.append(profile_block(pair, rows, 4, config, s.max_new_tokens, repeats=s.calibration_repeats,
                                     seed=s.seed, fast_greedy=fast))
    return out


def _check_drafts(pair, drafts: dict, s: DecodeSettings, profile: bool) -> None:
    """Raise a ValueError, before any run, if a draft of ``drafts`` cannot race beside ``pair``'s target."""
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
    point, and :func:`analysis_drafts.compare_drafts` the paired ratio of two drafts' speedups. With ``profile``
    each run ends with :func:`profile_block` of the first draft at gamma 4 and every temperature (greedily
    also on the path it took before the greedy fast path), kept under ``profiles``
    (:func:`analysis_drafts.block_profile` reads one).
    """
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
