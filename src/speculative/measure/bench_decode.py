"""The decode benchmark (``bench decode``): plain against speculative decoding on a model pair, side by
side in one run, with the cost model's prediction from a calibration made apart from the timed runs.

Explained in: notebooks/08_decoding_demo.

:func:`bench_decode` returns a record (:mod:`speculative.measure.records`) of raw observations, one per
timed decoding call, with the calibrations' raw seconds (:func:`calibration.calibrate_steps`), the settings
(:class:`settings.DecodeSettings`) and :func:`timing.environment`; its summary, ``results``, is
:func:`analysis.analyse` of those. :func:`bench_decode_runs` keeps several independent runs in one record.
:class:`_DecodeRunner` runs one decoder and turns its result into an observation; the race of drafts
(:mod:`speculative.measure.bench_drafts`) runs its decoders with it too.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Optional

import torch
from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

from speculative import defaults
from speculative.engine.decode import encode_prompts, plain_decode, speculative_decode
from speculative.engine.multi_draft import multi_draft_decode
from speculative.engine.policy import make_policy
from speculative.engine.timing import Clock, environment
from speculative.measure.analysis import analyse
from speculative.measure.calibration import _forward_costs, calibrate_steps
from speculative.measure.records import SCHEMA_VERSION
from speculative.measure.settings import DecodeSettings, _positive_int, _settings
from speculative.measure.shared import prompts_hash, repeat_share
from speculative.sampling.transforms import SamplingConfig

__all__ = ["bench_decode", "bench_decode_runs"]


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


def _held_out(pair, raced: int, batch: int) -> Optional[list[list[int]]]:
    """Return the ``batch`` prompts that follow the ``raced`` ones in the pair's set, encoded, for the
    calibration's whole decoding calls; None when the set has too few left."""
    rest = pair.prompts[raced:raced + batch]
    return encode_prompts(rest, pair.target.config.vocab_size) if len(rest) == batch else None


def _calibration_schedule(rounds: int, slots: int) -> tuple[int, dict[int, int]]:
    """Split a point's ``rounds`` calibration rounds over its ``slots`` timed slots (a group of one repeat):
    the first half (rounded up) before the first slot, since the cost-model policy decides by them, and
    each later round before an evenly spaced slot; returned as (rounds first, {slot: rounds before it})."""
    first = (rounds + 1) // 2
    later: dict[int, int] = {}
    for i in range(rounds - first):
        slot = min(slots - 1, max(1, round((i + 1) * slots / (rounds - first + 1))))
        later[slot] = later.get(slot, 0) + 1
    return first, later


def _calibrate(pair, s: DecodeSettings, variants, calibrated, config, group, held_out, rounds: int,
               at: int) -> tuple[dict, list[dict]]:
    """Calibrate every (rule, chains) of ``variants`` with ``rounds`` rounds (:func:`calibrate_steps`, with
    whole decoding calls on ``held_out``) before timed slot ``at``; return ({(rule, chains): calibration},
    what the record keeps of each)."""
    vocab, costs, entries = pair.target.config.vocab_size, {}, []
    for rule, k in sorted({(v[1], v[2]) for v in variants}):
        chains = k if rule == "chains" else None
        rows = held_out if held_out is None or chains is None else held_out[:1]
        raw = calibrate_steps(pair, encode_prompts(group * k, vocab), calibrated, config, s.max_new_tokens,
                              repeats=rounds, seed=s.seed + at, rule="token" if rule == "chains" else rule,
                              decode_rows=rows, chains=chains, scheme=s.scheme)
        entries.append({"rule": rule, "drafts": k, "before_slot": at,
                        **{key: raw[key] for key in ("seconds", "rounds", "repeats")}})
        costs[(rule, k)] = raw
    return costs, entries


def bench_decode(pair, settings: Optional[DecodeSettings] = None, *, progress: bool = True, **overrides) -> dict:
    """Return a record of plain vs speculative decoding, side by side, for every (batch, T, gamma, rule).

    ``settings`` (a :class:`DecodeSettings`; any of its fields may be given as keywords instead) are
    checked before the first run, so a bad one fails at once and no record is written. Runs on the
    device the pair's weights are on (``pair.target.device``).

    For each batch size b and temperature (with ``top_k`` / ``top_p`` if given), the first ``prompts``
    held-out prompts are decoded in groups of b, in ``repeats`` rounds in which every group is decoded by
    plain decoding and by speculative decoding at every gamma and verification rule, in turn, with the
    same seed. Each rule has its own calibration (:func:`calibrate_steps`: the loop's steps timed apart
    from any run, and whole decoding calls on the prompts after the ``prompts`` raced), made in
    ``calibration_repeats`` rounds spread through the timed runs (:func:`_calibration_schedule`): half
    before them, since the cost-model policy decides by those, the rest before evenly spaced groups, so
    that the calibration prices the machine as it was over the whole point, not only at its start.
    ``drafts`` above 1 adds multi-draft decoding (:func:`multi_draft.multi_draft_decode`) at batch 1,
    calibrated with that many rows; those rows have rule
    ``"chains"`` and run for every k in ``drafts``, 1 included (the same loop with one chain), so that
    chains are compared with chains. Every call is kept as an observation; on a CPU the forwards are
    timed inside the timed runs (it costs nothing there), on CUDA in one extra run per decoder.

    The summary (:func:`analysis.analyse`) gives per point: the pooled speedup of the decode phase with a
    95% bootstrap interval over groups and the speedup of each repeat; alpha (accepted / tested drafts);
    tokens per target call; the **prediction** tokens per call / (gamma c + v) with c and v from the
    calibration (none of this run's timings) and the **efficiency** speedup / prediction, from the steps
    timed alone and (``_decoded``) from the whole decoded blocks; the in-situ
    *decomposition* from this run's own forward timings, kept apart under its own name; the forwards
    timed alone; and the share of each output's positions that repeat an 8-gram seen before.
    """
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
        held_out = _held_out(pair, s.prompts, batch)
        forward_costs.append({"batch": batch, "seconds": _forward_costs(pair, encode_prompts(groups[0], vocab),
                                                                        s.fixed)})
        slots = [(repeat, index) for repeat in range(s.repeats) for index in range(len(groups))]
        first, later = _calibration_schedule(s.calibration_repeats, len(slots))
        for temperature in s.temperatures:
            config = SamplingConfig(temperature=temperature, top_k=s.top_k, top_p=s.top_p)
            point = {"batch": batch, "temperature": config.temperature}

            costs, entries = _calibrate(pair, s, variants, calibrated, config, groups[0], held_out, first, 0)
            calibrations.extend({**point, **entry} for entry in entries)
            runner = _DecodeRunner(pair, s, config, costs)
            runner.warm_up(groups[0])
            for slot, (repeat, index) in enumerate(slots):
                if slot in later:
                    _, entries = _calibrate(pair, s, variants, calibrated, config, groups[0], held_out, later[slot],
                                            slot)
                    calibrations.extend({**point, **entry} for entry in entries)
                group = groups[index]
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
                   "auto_v_floor": defaults.AUTO_V_FLOOR,
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
        pair, warm = self.pair, torch.Generator(device=self.pair.target.device).manual_seed(self.settings.seed)
        plain_decode(pair.target, group, 8, self.config, warm)  # not timed
        speculative_decode(pair.target, pair.draft, group, 8, (self.settings.fixed or [4])[0], self.config, warm)

    def run(self, group, variant, seed: int, time_forwards: bool):
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
        out = _decode_observation(result, **labels, decoder=None if variant is None else list(variant))
        if variant is not None and first_repeat and not labels.get("timing_run"):
            rows = encode_prompts(prompts, self.pair.target.config.vocab_size)
            out["repeat_share"] = [repeat_share(row, prompt) for row, prompt in zip(result.tokens, rows)]
        return out

