"""Analysis of a decode record (``bench decode``): each speculative decoder against plain decoding at each
point, with the cost model's prediction; and what the rows' accepted counts say about blocks (their
sequences, and how they cluster in time). A race of drafts is decode rows per draft (``analysis_drafts``).

Explained in: notebooks/07_cost_model (predictions) and notebooks/08_decoding_demo (speedups). Pure: it reads
the timed runs the record keeps, and times nothing.
"""

from __future__ import annotations

import collections
import statistics
from typing import Sequence

from speculative.engine.policy import expected_tokens, make_policy
from speculative.measure.costs import calibration_costs, interpolated
from speculative.measure.rows import ABSENT, DecodeRow
from speculative.measure.shared import ratio_interval
from speculative.sampling.stats import measured_acceptance_rate

__all__ = ["decode_variants", "decode_rows", "pooled_calibration", "lag1_permutation_test", "block_sequences",
           "lag1_autocorrelation"]


def decode_variants(config: dict) -> list[tuple]:
    """Return the speculative decoders a decode record ran, in order: (gamma, rule, drafts) per gamma and
    rule, then multi-draft decoding ("chains") at every fixed gamma and every k in ``drafts``."""
    variants = [(g, rule, 1) for g in config["gammas"] for rule in config["rules"]]
    if max(config["drafts"]) > 1:
        variants += [(g, "chains", k) for g in config["gammas"] if g != "auto" for k in config["drafts"]]
    return variants


def pooled_calibration(parts: list[dict]) -> dict:
    """One raw calibration from the rounds of several made at one point (spread through its timed runs):
    each step's rounds joined, its seconds their median; a single calibration is returned as it is."""
    if len(parts) == 1:
        return parts[0]
    rounds = {name: [t for part in parts for t in part["rounds"][name]] for name in parts[0]["rounds"]}
    return {**{k: v for k, v in parts[0].items() if k not in ("before_slot", "rounds", "seconds", "repeats")},
            "rounds": rounds, "seconds": {name: statistics.median(times) for name, times in rounds.items()},
            "repeats": sum(part["repeats"] for part in parts)}


def _decode_calibrations(record: dict, batch: int, temperature: float) -> dict:
    """{(rule, drafts): calibration with its costs} at one point, its rounds pooled
    (:func:`pooled_calibration`); k chains counted in plain steps of one row."""
    parts = collections.defaultdict(list)
    for c in record["calibrations"]:
        if c["batch"] == batch and c["temperature"] == temperature:
            parts[(c["rule"], c["drafts"])].append(c)
    raw = {key: pooled_calibration(group) for key, group in parts.items()}
    plain_step = raw[(record["config"]["rules"][0], 1)]["seconds"]["plain"]  # the plain step at batch 1
    return {key: calibration_costs(c, plain_step if key[0] == "chains" else None) for key, c in raw.items()}


def decode_rows(record: dict) -> list[DecodeRow]:
    """Per batch, temperature and speculative decoder (:func:`decode_variants`): its row against plain decoding."""
    config = record["config"]
    costs = {c["batch"]: c["seconds"] for c in record["forward_costs"]}
    rows = []
    for batch in config["batches"]:
        for temperature in config["temperatures"]:
            here = [o for o in record["observations"] if o["batch"] == batch and o["temperature"] == temperature]
            calibrations = _decode_calibrations(record, batch, temperature)
            for variant in decode_variants(config):
                rows.append(_decode_row(config, here, variant, calibrations[(variant[1], variant[2])], costs[batch],
                                        batch, temperature))
    return rows


def _runs(observations: list[dict], decoder, config: dict) -> list[list[dict]]:
    """The timed runs of one decoder: runs[repeat][group]."""
    runs = [[] for _ in range(config["repeats"])]
    for o in observations:
        if o["decoder"] == decoder and not o.get("timing_run"):
            runs[o["repeat"]].append(o)
    for repeat in runs:
        repeat.sort(key=lambda o: o["group"])
    return runs


def _per_call(runs: list[dict], name: str) -> float:
    """Mean seconds of one timed forward of model ``name``."""
    return sum(r[f"{name}_seconds"] for r in runs) / sum(r["timed_calls"][name] for r in runs)


def _decode_seconds(run: dict) -> float:
    return run["seconds"] - run["prefill_seconds"]  # the decode phase: the prefill is apart


def _decode_row(config, observations, variant, calibration, costs, batch, temperature) -> DecodeRow:
    """One summary row of a decode record: a speculative decoder against plain decoding at one point."""
    gamma, rule, chains = variant
    seed, repeats, new = config["seed"], config["repeats"], config["max_new_tokens"]
    plain, spec = _runs(observations, None, config), _runs(observations, list(variant), config)
    groups = len(plain[0])
    timing = [o for o in observations if o.get("timing_run")]
    timed_plain = [r for rep in plain for r in rep] if not timing else [o for o in timing if o["decoder"] is None]
    spec_all = [r for rep in spec for r in rep]
    timed_spec = spec_all if not timing else [o for o in timing if o["decoder"] == list(variant)]
    plain_group = [sum(_decode_seconds(plain[k][i]) for k in range(repeats)) for i in range(groups)]
    spec_group = [sum(_decode_seconds(spec[k][i]) for k in range(repeats)) for i in range(groups)]
    speedup = sum(plain_group) / sum(spec_group)
    accepted = [a for r in spec_all for block in r["accepted"] for a in block]
    active = [a for a in accepted if a >= 0]
    calls = [[len(spec[k][i]["accepted"]) for k in range(repeats)] for i in range(groups)]
    tokens_per_forward = new * len(spec_all) / sum(len(r["accepted"]) for r in spec_all)
    target_call = _per_call(timed_plain, "target")
    c, v = _per_call(timed_spec, "draft") / target_call, _per_call(timed_spec, "target") / target_call
    blocks, fitted = [], None
    if gamma == "auto":  # each block drafts one length, shared by its rows: cost it block by block
        blocks = [max(sizes) for r in spec_all for sizes in r["lengths"] if max(sizes) > 0]
        block_gamma = statistics.mean(blocks)
        # with the costs the policy chose by: the calibration's non-decreasing fit
        fitted = make_policy("auto", calibration=calibration, max_gamma=config["auto_max_gamma"],
                             v_floor=config.get("auto_v_floor", 0.0)).v_fitted  # no floor before it was recorded
        v_cal = statistics.mean(interpolated(fitted, k) for k in blocks)
        alpha = measured_acceptance_rate([r["accepted"] for r in spec_all], [r["lengths"] for r in spec_all])
    else:
        block_gamma, v_cal = gamma, calibration["v"][gamma]
        alpha = measured_acceptance_rate([accepted], gamma)
    c_cal = calibration["c"]
    predicted = tokens_per_forward / (block_gamma * c_cal + v_cal)
    decoded = calibration.get("decoded") if gamma != "auto" else None
    predicted_decoded = tokens_per_forward / (gamma * decoded["c"] + decoded["v"][gamma]) if decoded else None
    decomposed = tokens_per_forward / (block_gamma * c + v)
    tokens = batch * new * repeats * groups
    return DecodeRow(
        batch=batch, temperature=temperature, gamma=gamma, rule=rule, drafts=chains,
        prompts=config["prompts"], groups=groups, repeats=repeats,
        speedup=speedup, speedup_ci95=ratio_interval(plain_group, spec_group, seed),
        speedup_median=statistics.median(p / s for p, s in zip(plain_group, spec_group)),
        speedup_per_group=[p / s for p, s in zip(plain_group, spec_group)],
        speedup_per_repeat=[sum(map(_decode_seconds, plain[k])) / sum(map(_decode_seconds, spec[k]))
                            for k in range(repeats)],
        predicted=predicted, efficiency=speedup / predicted,
        predicted_decoded=predicted_decoded if decoded else ABSENT,
        efficiency_decoded=speedup / predicted_decoded if decoded else ABSENT,
        calibration={"c": c_cal, "v": v_cal, "v_alone": calibration["v_alone"].get(gamma),
                     "v_from_alone": calibration["v_from_alone"], **({"v_fitted": fitted} if fitted else {})},
        mean_gamma=block_gamma,
        # auto: how many blocks drafted each length (shared by the block's rows), over all repeats
        block_lengths=dict(sorted(collections.Counter(blocks).items())) if blocks else ABSENT,
        alpha=alpha, tokens_per_target_forward=tokens_per_forward,
        tokens_per_active_block=sum(a + 1 for a in active) / len(active),
        tokens_per_target_forward_per_group=[new * repeats / sum(n) for n in calls],
        speculative_seconds_per_group=spec_group,
        target_calls_per_group=[sum(n) for n in calls],
        plain_tokens_per_s=tokens / sum(plain_group), speculative_tokens_per_s=tokens / sum(spec_group),
        # the cost model with an i.i.d. acceptance (Leviathan et al.), verification priced as one plain step
        predicted_leviathan=expected_tokens(alpha, block_gamma) / (block_gamma * c_cal + 1),
        # in situ: the same run's own forward timings; a decomposition, not a prediction
        c=c, v=v, decomposed_speedup=decomposed, in_situ_share=speedup / decomposed,
        plain_seconds=sum(plain_group), speculative_seconds=sum(spec_group),
        plain_forward_seconds=sum(r["target_seconds"] for r in timed_plain),
        speculative_forward_seconds=sum(r["target_seconds"] + r["draft_seconds"] for r in timed_spec),
        plain_prefill_seconds=statistics.mean(r["prefill_seconds"] for rep in plain for r in rep),
        speculative_prefill_seconds=statistics.mean(r["prefill_seconds"] for r in spec_all),
        # the forwards timed alone, back to back (warm caches): for comparison
        c_isolated=costs["draft_1"] / costs["target_1"],
        v_isolated=(costs[f"target_{gamma + 1}"] / costs["target_1"]) if gamma != "auto" else None,
        forward_costs_s=costs, calibration_s=calibration["seconds"],
        repeat_share_median=statistics.median(s for r in spec[0] for s in r["repeat_share"]),
        # per prompt of the first repeat: accepted drafts in each block, -1 once the row is done
        accepted_per_block=[list(row) for r in spec[0] for row in zip(*r["accepted"])],
    )


def block_sequences(rows: list[dict]) -> list[list[int]]:
    """Return one sequence of accepted counts per prompt from decode rows of several batch sizes: prompt i's
    blocks from the smallest batch that decoded it, -1 entries dropped. A row's ``accepted_per_block`` holds
    its first repeat; where every batch size decoded every prompt, as ``bench decode`` does, this is the
    batch-1 row's."""
    seen, sequences = set(), []
    for row in sorted(rows, key=lambda r: r["batch"]):
        for prompt, seq in enumerate(row["accepted_per_block"]):
            if prompt not in seen:
                seen.add(prompt)
                sequences.append([a for a in seq if a >= 0])
    return sequences


def lag1_autocorrelation(sequences: list[Sequence[float]], within_row: bool = False) -> tuple[float, int]:
    """Return the lag-1 autocorrelation of values along each sequence (a row's accepted counts, block by
    block) and the number of pairs it was computed from.

    Centred on the pooled mean, it also picks up rows (prompts) that are easier than others; centred on
    each row's own mean (``within_row``), it keeps only the clustering in time, with a small negative bias
    for short rows. Under independence it is about normal with variance 1 / pairs; NaN when the values do
    not vary.
    """
    import numpy as np

    arrays = [np.asarray(s, dtype=float) for s in sequences]
    pooled = np.concatenate(arrays)
    centred = [a - (a.mean() if within_row else pooled.mean()) for a in arrays if len(a) > 1]
    variance = np.concatenate(centred).var() if within_row else pooled.var()
    products = np.concatenate([c[1:] * c[:-1] for c in centred])
    with np.errstate(invalid="ignore", divide="ignore"):  # constant values: NaN, as the docstring says
        return float(products.mean() / variance), int(products.size)


def lag1_permutation_test(sequences: list[Sequence[float]], permutations: int = 2000, seed: int = 0) -> dict:
    """Test clustering in time within rows: the within-row lag-1 autocorrelation
    (:func:`lag1_autocorrelation` with ``within_row=True``) against its law when each row's values are
    shuffled, which keeps every row's values (so its mean, and the short-row bias) and breaks their order.

    Returns ``r`` (observed), ``null_mean`` and ``null_sd`` (over ``permutations`` shuffles), ``z``
    ((r - null_mean) / null_sd, the bias removed) and ``p``, the two-sided permutation p-value
    ((1 + shuffles at least as far from null_mean) / (1 + permutations)); exact in law for any row
    lengths, with a floor of 1 / (1 + permutations). Fixed ``seed``: the same figures on every build.
    """
    import numpy as np

    rows = [np.asarray(s, dtype=float) for s in sequences if len(s) > 1]
    observed, _ = lag1_autocorrelation(rows, within_row=True)
    rng = np.random.default_rng(seed)
    null = np.array([lag1_autocorrelation([rng.permutation(row) for row in rows], within_row=True)[0]
                     for _ in range(permutations)])
    centre, spread = float(null.mean()), float(null.std())
    extreme = int((np.abs(null - centre) >= abs(observed - centre) - 1e-12).sum())
    return {"r": observed, "null_mean": centre, "null_sd": spread, "z": (observed - centre) / spread,
            "p": (1 + extreme) / (1 + permutations), "permutations": permutations}
