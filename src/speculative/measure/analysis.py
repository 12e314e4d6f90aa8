"""Analysis: pure functions from a benchmark record's raw observations to every figure shown.

Explained in: notebooks/07_cost_model (predictions, prices) and notebooks/08_decoding_demo (speedups).

The benchmarks in :mod:`speculative.measure.bench` measure and keep raw observations (:mod:`speculative.measure.records`
says what a record holds); :func:`analyse` turns a record into its summary rows, and the other functions
here turn records or rows into comparisons. Nothing here times, draws or touches a model, so any record
can be re-analysed, and every figure the CLI, the chapters and the tests show has this one source.
Intervals are 95% percentile bootstraps with 2,000 resamples, paired over prompts (or groups of prompts),
seeded by the record's seed, so re-analysis gives the same numbers.
"""

from __future__ import annotations

import collections
import hashlib
import statistics
from typing import Callable, Optional, Sequence

import numpy as np

from speculative.engine.policy import _interpolate as interpolate
from speculative.engine.policy import expected_tokens, make_policy
from speculative.sampling.stats import measured_acceptance_rate

__all__ = ["analyse", "bootstrap_interval", "ratio_interval", "speed_ratio", "step_costs", "calibration_costs",
           "repeat_share", "interpolated", "decoded_costs", "decode_variants", "price_cliffs", "draft_ranking",
           "predicted_speedup", "compare_drafts", "mean_interval", "block_profile",
           "length_prices", "compare_variants", "prompts_hash",
           "tokens_hash", "interval_side", "block_sequences", "lag1_autocorrelation", "rows_where",
           "row_where", "across_records", "compare_rows", "split_runs", "head_to_head", "race_efficiency",
           "draft_names", "rename_drafts"]


# ---------------------------------------------------------------- intervals and ratios

def bootstrap_interval(columns: Sequence[Sequence[float]], statistic: Callable, seed: int, *,
                       vectorized: bool = False) -> list[float]:
    """Return a 95% percentile bootstrap interval (2,000 resamples, paired over the columns' entries) of
    ``statistic`` of the ``columns``; [nan, nan] with fewer than two entries. A ``vectorized`` statistic
    takes an ``axis`` argument and reduces every resample at once (scipy draws the same resamples)."""
    from scipy.stats import bootstrap

    if len(columns[0]) < 2:
        return [float("nan"), float("nan")]
    result = bootstrap(tuple(columns), statistic, paired=True, vectorized=vectorized, n_resamples=2000,
                       confidence_level=0.95, method="percentile", random_state=seed)
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]


def _total(values, axis: int = -1):
    """The sum along ``axis``, added left to right as Python's ``sum`` adds numpy floats, so that a
    vectorized statistic gives the same floats as the one-resample-at-a-time ``sum(a) / sum(b)``."""
    return np.cumsum(values, axis=axis).take(-1, axis=axis)


def _ratio_of_totals(numerators, denominators, axis: int = -1):
    return _total(numerators, axis) / _total(denominators, axis)


def _per_total(made: float) -> Callable:
    """The statistic made * n / sum(x) over the n entries of x, vectorized (see :func:`_total`)."""
    return lambda values, axis=-1: made * values.shape[axis] / _total(values, axis)


def ratio_interval(numerators: Sequence[float], denominators: Sequence[float], seed: int) -> list[float]:
    """Return a 95% bootstrap interval, paired over entries, of sum(numerators) / sum(denominators)."""
    return bootstrap_interval([list(numerators), list(denominators)], _ratio_of_totals, seed, vectorized=True)


def speed_ratio(seconds: Sequence[float], baseline_seconds: Sequence[float], seed: int = 0) -> tuple[float, list]:
    """Return how many times as fast a decoder ran as a baseline on the same prompts and tokens (pooled:
    baseline seconds / its seconds) with a 95% bootstrap interval paired over prompts."""
    return sum(baseline_seconds) / sum(seconds), ratio_interval(baseline_seconds, seconds, seed)


def interval_side(interval: Sequence[float], level: float = 1.0) -> str:
    """Return ``"above"`` or ``"below"`` when a whole interval lies on one side of ``level``, else
    ``"across"`` (an interval of NaNs, from a single prompt, is ``"across"``)."""
    low, high = interval
    if low > level:
        return "above"
    if high < level:
        return "below"
    return "across"


# ---------------------------------------------------------------- calibrations

def step_costs(seconds: dict, gammas, plain_seconds: float) -> dict:
    """Return c, v and v_alone from a calibration's median seconds, relative to a plain step of
    ``plain_seconds``.

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


def decoded_costs(seconds: dict, gammas) -> dict:
    """Return c and v(gamma) from a calibration's whole decoding calls, relative to plain decoding's
    seconds per step (``plain_decoded``, one token per row): v(gamma) is a decoded block's seconds
    (``block_decoded_<gamma>``) beyond gamma draft steps timed alone, so that gamma c + v(gamma) is the
    block as the loop ran it and the prediction tokens per call / (gamma c + v) is tokens per call x
    plain's seconds per step / a block's."""
    plain, draft = seconds["plain_decoded"], seconds["draft"]
    return {"c": draft / plain, "v": {g: (seconds[f"block_decoded_{g}"] - g * draft) / plain for g in gammas}}


def calibration_costs(calibration: dict, plain_seconds: float = None) -> dict:
    """Return a raw calibration (``seconds`` of each step, from :func:`bench.calibrate_steps`) with c, v,
    v_alone and v_from_alone added, relative to its own plain step or to ``plain_seconds``: multi-draft
    decoding runs k rows per step but is compared with plain decoding of one row, so its steps are
    counted in that row's plain steps."""
    seconds = calibration["seconds"]
    gammas = sorted(int(name.split("_")[1]) for name in seconds if name.startswith("verify_"))
    relative = seconds["plain"] if plain_seconds is None else plain_seconds
    out = {**calibration, **step_costs(seconds, gammas, relative)}
    if "plain_decoded" in seconds:  # whole decoding calls on held-out prompts (bench.calibrate_steps)
        out["decoded"] = decoded_costs(seconds, gammas)
    if plain_seconds is not None:
        out["relative_to_plain_seconds"] = plain_seconds
    return out


def interpolated(values: dict, k: int) -> float:
    """v at draft length k from a calibration's {length: v} (keys may be ints or, from JSON, strings)."""
    return interpolate(sorted((int(g), float(x)) for g, x in values.items()), k)


# ---------------------------------------------------------------- outputs

def repeat_share(tokens: Sequence[int], context: Sequence[int], n: int = 8) -> float:
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


def prompts_hash(prompts) -> str:
    """Return the sha256 of a prompt set (bytes, or token ids as 4 bytes each), lengths included."""
    digest = hashlib.sha256()
    for prompt in prompts:
        if not isinstance(prompt, bytes):  # token ids (a transformers tokenizer's): 4 bytes each
            prompt = b"".join(int(t).to_bytes(4, "big") for t in prompt)
        digest.update(len(prompt).to_bytes(4, "big") + prompt)
    return digest.hexdigest()


def tokens_hash(tokens: Sequence[int]) -> str:
    """Return a short checksum of emitted tokens: equal outputs, equal checksums."""
    return prompts_hash([list(tokens)])[:16]


# ---------------------------------------------------------------- the summaries

def analyse(record: dict) -> list[dict]:
    """Return the summary rows (a record's ``results``) recomputed from its observations."""
    by_benchmark = {"sampler": _sampler_results, "decode": _decode_results, "peer": _peer_results,
                    "syncs": _syncs_results, "drafts": _drafts_results, "prices": _prices_results,
                    "agreement": _agreement_results}
    if record.get("benchmark") not in by_benchmark:
        raise ValueError(f"unknown benchmark {record.get('benchmark')!r}: expected one of {', '.join(by_benchmark)}")
    if "runs" in record:  # several independent runs: each analysed alone, then set side by side
        return _across_runs([analyse(run) for run in _each_run(record)])
    if "observations" not in record:
        raise ValueError("the record keeps no observations (schema 1): it cannot be re-analysed")
    return by_benchmark[record["benchmark"]](record)


#: the fields that name a configuration in a summary row (the rest are its figures)
CONFIGURATION = ("draft", "batch", "temperature", "gamma", "rule", "drafts", "k", "vocab", "policy", "hf_schedule")


def _each_run(record: dict) -> list[dict]:
    """A record of several runs as one record per run: the shared fields with that run's own."""
    shared = {k: v for k, v in record.items() if k not in ("runs", "results")}
    return [{**shared, **run} for run in record["runs"]]


#: the headline figures whose spread over independent runs a record of several runs summarises: a decode
#: row's speedup; a race's (bench peer) speed over transformers' assisted generation and over plain decoding
RUN_FIGURES = ("speedup", "ours_over_hf_assisted", "ours_speedup")


def _across_runs(per_run: list[list[dict]]) -> list[dict]:
    """One row per configuration: each run's row under ``runs``, and for each of :data:`RUN_FIGURES` the
    rows hold, its value in each run (``<figure>_runs``), their range and median (the drift between runs,
    which no within-run interval covers)."""
    rows = []
    for same in zip(*per_run, strict=True):
        row = {**{k: same[0][k] for k in CONFIGURATION if k in same[0]}, "runs": list(same)}
        for figure in RUN_FIGURES:
            if figure in same[0]:
                values = [r[figure] for r in same]
                row.update({f"{figure}_runs": values, f"{figure}_range": [min(values), max(values)],
                            f"{figure}_median_run": statistics.median(values)})
        rows.append(row)
    return rows


def split_runs(record: dict) -> list[dict]:
    """Return a record of several runs (a top-level ``runs`` list) as one record per run, each read as a
    record of one run reads: its own environment, observations and summary rows, and ``file`` named
    "<file> run <i>". A record of one run comes back alone, as it is."""
    if "runs" not in record:
        return [record]
    out = []
    for i, run in enumerate(_each_run(record)):
        run["results"] = [row["runs"][i] for row in record["results"]]
        if "file" in record:
            run["file"] = f"{record['file']} run {i + 1}"
        out.append(run)
    return out


def _syncs_results(record: dict) -> list[dict]:
    """Per batch and temperature: the CUDA syncs and the host reads per block (target call)."""
    rows = []
    for o in record["observations"]:
        syncs = o["cuda_syncs"]
        rows.append({"batch": o["batch"], "temperature": o["temperature"], "gamma": o["gamma"], "blocks": o["blocks"],
                     "cuda_syncs_per_block": None if syncs is None else syncs / o["blocks"],
                     "host_reads_per_block": o["host_reads"] / o["blocks"]})
    return rows


def _sampler_results(record: dict) -> list[dict]:
    rows = []
    for o in record["observations"]:
        timings = {name: {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "repeats": len(ts)}
                   for name, ts in o["seconds"].items()}
        positions = o["batch"] * o["k"]
        batched, reference = (positions / timings[n]["median_s"] for n in ("batched", "reference"))
        rows.append({"batch": o["batch"], "k": o["k"], "vocab": o["vocab"], "batched_positions_per_s": batched,
                     "reference_positions_per_s": reference, "speedup": batched / reference, "timings": timings})
    return rows


def decode_variants(config: dict) -> list[tuple]:
    """Return the speculative decoders a decode record ran, in order: (gamma, rule, drafts) per gamma and
    rule, then multi-draft decoding ("chains") at every fixed gamma and every k in ``drafts``."""
    variants = [(g, rule, 1) for g in config["gammas"] for rule in config["rules"]]
    if max(config["drafts"]) > 1:
        variants += [(g, "chains", k) for g in config["gammas"] if g != "auto" for k in config["drafts"]]
    return variants


def _decode_calibrations(record: dict, batch: int, temperature: float) -> dict:
    """{(rule, drafts): calibration with its costs} at one point; k chains counted in plain steps of one row."""
    raw = {(c["rule"], c["drafts"]): c for c in record["calibrations"]
           if c["batch"] == batch and c["temperature"] == temperature}
    plain_step = raw[(record["config"]["rules"][0], 1)]["seconds"]["plain"]  # the plain step at batch 1
    return {key: calibration_costs(c, plain_step if key[0] == "chains" else None) for key, c in raw.items()}


def _decode_results(record: dict) -> list[dict]:
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


def _decode_row(config, observations, variant, calibration, costs, batch, temperature) -> dict:
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
        fitted = make_policy("auto", calibration=calibration, max_gamma=config["auto_max_gamma"]).v_fitted
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
    return {
        "batch": batch, "temperature": temperature, "gamma": gamma, "rule": rule, "drafts": chains,
        "prompts": config["prompts"], "groups": groups, "repeats": repeats,
        "speedup": speedup, "speedup_ci95": ratio_interval(plain_group, spec_group, seed),
        "speedup_median": statistics.median(p / s for p, s in zip(plain_group, spec_group)),
        "speedup_per_group": [p / s for p, s in zip(plain_group, spec_group)],
        "speedup_per_repeat": [sum(map(_decode_seconds, plain[k])) / sum(map(_decode_seconds, spec[k]))
                               for k in range(repeats)],
        "predicted": predicted, "efficiency": speedup / predicted,
        **({"predicted_decoded": predicted_decoded, "efficiency_decoded": speedup / predicted_decoded}
           if decoded else {}),
        "calibration": {"c": c_cal, "v": v_cal, "v_alone": calibration["v_alone"].get(gamma),
                        "v_from_alone": calibration["v_from_alone"], **({"v_fitted": fitted} if fitted else {})},
        "mean_gamma": block_gamma,
        # auto: how many blocks drafted each length (shared by the block's rows), over all repeats
        **({"block_lengths": dict(sorted(collections.Counter(blocks).items()))} if blocks else {}),
        "alpha": alpha, "tokens_per_target_forward": tokens_per_forward,
        "tokens_per_active_block": sum(a + 1 for a in active) / len(active),
        "tokens_per_target_forward_per_group": [new * repeats / sum(n) for n in calls],
        "speculative_seconds_per_group": spec_group,
        "target_calls_per_group": [sum(n) for n in calls],
        "plain_tokens_per_s": tokens / sum(plain_group), "speculative_tokens_per_s": tokens / sum(spec_group),
        # the cost model with an i.i.d. acceptance (Leviathan et al.), verification priced as one plain step
        "predicted_leviathan": expected_tokens(alpha, block_gamma) / (block_gamma * c_cal + 1),
        # in situ: the same run's own forward timings; a decomposition, not a prediction
        "c": c, "v": v, "decomposed_speedup": decomposed, "in_situ_share": speedup / decomposed,
        "plain_seconds": sum(plain_group), "speculative_seconds": sum(spec_group),
        "plain_forward_seconds": sum(r["target_seconds"] for r in timed_plain),
        "speculative_forward_seconds": sum(r["target_seconds"] + r["draft_seconds"] for r in timed_spec),
        "plain_prefill_seconds": statistics.mean(r["prefill_seconds"] for rep in plain for r in rep),
        "speculative_prefill_seconds": statistics.mean(r["prefill_seconds"] for r in spec_all),
        # the forwards timed alone, back to back (warm caches): for comparison
        "c_isolated": costs["draft_1"] / costs["target_1"],
        "v_isolated": (costs[f"target_{gamma + 1}"] / costs["target_1"]) if gamma != "auto" else None,
        "forward_costs_s": costs, "calibration_s": calibration["seconds"],
        "repeat_share_median": statistics.median(s for r in spec[0] for s in r["repeat_share"]),
        # per prompt of the first repeat: accepted drafts in each block, -1 once the row is done
        "accepted_per_block": [list(row) for r in spec[0] for row in zip(*r["accepted"])],
    }


def _peer_results(record: dict) -> list[dict]:
    config = record["config"]
    rows = []
    for temperature in config["temperatures"]:
        tally = _peer_tally(record, temperature)
        for schedule in config["schedules"]:
            for policy in config["policies"]:
                rows.append(_peer_row(record, tally, temperature, schedule, policy))
    return rows


def peer_decoder(policy: str) -> str:
    """The decoder name of a raced policy: ``ours`` for the fixed length, ``ours_auto_block`` for auto+block."""
    return "ours" if policy == "fixed" else f"ours_{policy.replace('+', '_')}"


def _peer_tally(record: dict, temperature: float) -> dict:
    """Per decoder name: per-prompt totals over repeats of seconds, blocks, drafted and accepted tokens."""
    config = record["config"]
    here = [o for o in record["observations"] if o["temperature"] == temperature]
    names = list(dict.fromkeys(o["decoder"] for o in here))
    tally = {field: {n: [0.0 if field == "seconds" else 0] * config["prompts"] for n in names}
             for field in ("seconds", "blocks", "drafted", "accepted")}
    greedy_equal, reference = {n: True for n in names}, {}
    for o in sorted(here, key=lambda o: (o["repeat"], o["prompt"], names.index(o["decoder"]))):
        for field in tally:
            tally[field][o["decoder"]][o["prompt"]] += o[field]
        reference.setdefault(o["prompt"], o["tokens_sha256"])
        greedy_equal[o["decoder"]] &= o["tokens_sha256"] == reference[o["prompt"]]
    return {**tally, "made": config["max_new_tokens"] * config["repeats"], "seed": config["seed"],
            "greedy_equal": greedy_equal, "names": names}


def _peer_rate(tally: dict, name: str) -> dict:
    """Tokens per second of decoder ``name``, pooled over prompts, with its interval."""
    seconds, made = tally["seconds"][name], tally["made"]
    return {f"{name}_tokens_per_s": made * len(seconds) / sum(seconds),
            f"{name}_tokens_per_s_ci95": bootstrap_interval([seconds], _per_total(made), tally["seed"],
                                                            vectorized=True)}


def _peer_calls(tally: dict, name: str, label: str) -> dict:
    """Acceptance, tokens per target call and drafts per call of decoder ``name``, with intervals."""
    accepted, drafted, blocks = (tally[k][name] for k in ("accepted", "drafted", "blocks"))
    made, seed = tally["made"], tally["seed"]
    return {f"{label}_acceptance": sum(accepted) / sum(drafted),
            f"{label}_acceptance_ci95": ratio_interval(accepted, drafted, seed),
            f"{label}_tokens_per_call": made * len(blocks) / sum(blocks),
            f"{label}_tokens_per_call_ci95": bootstrap_interval([blocks], _per_total(made), seed, vectorized=True),
            f"{label}_drafts_per_call": sum(drafted) / sum(blocks)}


def _peer_ratio(tally: dict, a: str, b: str) -> tuple:
    """Tokens per second of ``a`` over those of ``b`` (the same tokens), paired by prompt, with its interval."""
    return speed_ratio(tally["seconds"][a], tally["seconds"][b], tally["seed"])


def _peer_policy(record: dict, temperature: float, policy: str):
    """The raced policy object (rebuilt from the record) and its calibration entry, or (None, None) for fixed."""
    config = record["config"]
    base, _, rule = policy.partition("+")
    if base == "fixed":
        return None, None
    if base != "auto":
        return make_policy(base, config["gamma"], max_gamma=config["peer_max_gamma"]), None
    raw = next(c for c in record["calibrations"] if c["temperature"] == temperature and c["policy"] == policy)
    calibration = calibration_costs(raw)
    return make_policy("auto", calibration=calibration, max_gamma=config["auto_max_gamma"]), calibration


def _peer_row(record: dict, tally: dict, temperature: float, schedule: str, policy: str) -> dict:
    """One summary row of a race: this engine under ``policy`` against transformers under ``schedule``."""
    config = record["config"]
    hf, ours = f"hf_{schedule}", peer_decoder(policy)
    wrapped = "ours_on_hf_models" in tally["names"]
    rule = policy.partition("+")[2] or "token"
    made, calibration = _peer_policy(record, temperature, policy)
    described = made.describe() if made is not None else f"fixed {config['gamma']}"
    over_hf, over_hf_ci = _peer_ratio(tally, ours, hf)
    speedup, speedup_ci = _peer_ratio(tally, ours, "ours_plain")
    hf_speedup, hf_speedup_ci = _peer_ratio(tally, hf, "hf_plain")
    assisted = _peer_rate(tally, hf)
    row = {"temperature": temperature, "batch": 1, "policy": policy, "rule": rule, "gamma": config["gamma"],
           "policy_described": described + (", block verification" if rule == "block" else ""),
           **({"calibration": {"rule": rule, "c": calibration["c"], "v": calibration["v"],
                               "v_fitted": made.v_fitted, "v_from_alone": calibration["v_from_alone"]}}
              if calibration else {}),
           "hf_schedule": schedule, "prompts": config["prompts"], "repeats": config["repeats"],
           "max_new_tokens": config["max_new_tokens"],
           **{"ours" + k[len(ours):]: v for k, v in _peer_rate(tally, ours).items()},
           **{k: v for name in ("ours_plain", "hf_plain", *(["ours_on_hf_models"] if wrapped else []))
              for k, v in _peer_rate(tally, name).items()},
           "hf_assisted_tokens_per_s": assisted[f"{hf}_tokens_per_s"],
           "hf_assisted_tokens_per_s_ci95": assisted[f"{hf}_tokens_per_s_ci95"],
           "ours_over_hf_assisted": over_hf, "ours_over_hf_assisted_ci95": over_hf_ci,
           "ours_speedup": speedup, "ours_speedup_ci95": speedup_ci,
           "hf_assisted_speedup": hf_speedup, "hf_assisted_speedup_ci95": hf_speedup_ci,
           **_peer_calls(tally, ours, "ours"), **_peer_calls(tally, hf, "hf"),
           **(_peer_calls(tally, "ours_on_hf_models", "ours_on_hf_models") if wrapped else {}),
           "seconds_per_prompt": {"ours": tally["seconds"][ours],
                                  **{n: tally["seconds"][n] for n in ("ours_plain", "hf_plain", hf)}}}
    if wrapped:  # the decomposition at the fixed gamma: same loop, transformers' forwards
        row["seconds_per_prompt"].update({"ours_fixed": tally["seconds"]["ours"],
                                          "ours_on_hf_models": tally["seconds"]["ours_on_hf_models"]})
        for label, other in (("over_hf_assisted", hf), ("over_ours_fixed", "ours")):
            ratio, ratio_ci = _peer_ratio(tally, "ours_on_hf_models", other)
            row[f"ours_on_hf_models_{label}"], row[f"ours_on_hf_models_{label}_ci95"] = ratio, ratio_ci
    if temperature == 0:
        shown = [n for n in tally["names"] if n.startswith("ours") or n in ("hf_plain", hf)]
        row["greedy_outputs_equal"] = {n: tally["greedy_equal"][n] for n in shown if n != "ours_plain"}
    return row


# ---------------------------------------------------------------- looking rows up, and comparing them

def rows_where(record: dict, **fields) -> list[dict]:
    """Return a record's summary rows whose ``fields`` all have the given values (a missing ``rule`` reads
    as "token" and a missing ``drafts`` as 1, as in records written before they were kept)."""
    implied = {"rule": "token", "drafts": 1}
    return [r for r in record["results"] if all(r.get(k, implied.get(k)) == v for k, v in fields.items())]


def best_length(record: dict, draft: str, temperature: float) -> dict:
    """Return, from a race of drafts (``bench drafts``), ``draft``'s row at ``temperature`` whose speedup
    over plain decoding has the largest median over the runs (``speedup_median_run``): its best fixed
    length among those raced. A ValueError names a draft or temperature the record did not race."""
    rows = rows_where(record, draft=draft, temperature=temperature)
    if not rows:
        raise ValueError(f"the record raced no draft {draft!r} at temperature {temperature:g}")
    return max(rows, key=lambda r: r["speedup_median_run"])


def head_to_head(record: dict, temperature: float) -> dict:
    """Return, from a race against transformers (``bench peer``, one run or several), this engine's fastest
    policy against transformers' fastest schedule at ``temperature``, then in every run the ratio ours / HF
    (``ratios``) with its 95% interval paired by prompt (``intervals``), the run with the median ratio
    (``median``, ``median_ci95``), the range over the runs and the lowest interval bound of any run
    (``lowest_bound``). Each side's fastest is the one with the largest median over the runs of its speed
    over its own library's plain decoding in the same run: within a run that orders them as their speeds
    do, and across runs it is not swayed by a run on which the whole machine was slower. ``ours_margin``
    is this engine's chosen policy's median over the next fastest policy's (None when only one raced)."""
    runs = split_runs(record)
    here = [rows_where(run, temperature=temperature) for run in runs]
    if not here[0]:
        raise ValueError(f"the race has no rows at temperature {temperature}")

    def median_rate(field: str, key: str, value: str) -> float:
        return statistics.median(next(r[key] for r in rows if r[field] == value) for rows in here)

    ours_medians = {p: median_rate("policy", "ours_speedup", p) for p in dict.fromkeys(r["policy"] for r in here[0])}
    ours = max(ours_medians, key=ours_medians.get)
    others = [m for p, m in ours_medians.items() if p != ours]
    theirs = max(dict.fromkeys(r["hf_schedule"] for r in here[0]),
                 key=lambda s: median_rate("hf_schedule", "hf_assisted_speedup", s))
    chosen = [row_where(run, temperature=temperature, policy=ours, hf_schedule=theirs) for run in runs]
    ratios = [r["ours_over_hf_assisted"] for r in chosen]
    middle = sorted(chosen, key=lambda r: r["ours_over_hf_assisted"])[len(chosen) // 2]
    return {"temperature": temperature, "policy": ours, "hf_schedule": theirs, "runs": len(runs), "ratios": ratios,
            "intervals": [r["ours_over_hf_assisted_ci95"] for r in chosen],
            "median": middle["ours_over_hf_assisted"], "median_ci95": middle["ours_over_hf_assisted_ci95"],
            "range": [min(ratios), max(ratios)],
            "lowest_bound": min(r["ours_over_hf_assisted_ci95"][0] for r in chosen),
            "ours_margin": ours_medians[ours] / max(others) if others else None}


def race_efficiency(record: dict, key: str = "efficiency_decoded") -> dict:
    """Return a decoding record's efficiencies (``key``: ``efficiency``, from the steps calibration, or
    ``efficiency_decoded``, from whole decoded blocks) over all its rows and runs: their count, median,
    smallest and largest, and each run's own median (``run_medians``)."""
    points = [r[key] for row in record["results"] for r in row.get("runs", [row])]
    return {"points": len(points), "median": statistics.median(points), "min": min(points), "max": max(points),
            "run_medians": [statistics.median(r[key] for r in run["results"]) for run in split_runs(record)]}


def row_where(record: dict, **fields) -> dict:
    """Return the one summary row with the given ``fields``; a ValueError says when none or several match."""
    found = rows_where(record, **fields)
    if len(found) != 1:
        shown = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        raise ValueError(f"{len(found)} rows of the {record.get('benchmark', '?')} record have {shown}; expected one")
    return found[0]


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
    cost = sum(1.0 if a == 0 else a * c + interpolated(v, a) for a in runs)
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
    rows = {_variant(r): r for r in record["results"]}
    out = []
    for (batch, temperature, gamma, rule, k), base in rows.items():
        if (rule, k) != tuple(baseline) or (batch, temperature, gamma, *other) not in rows:
            continue
        out.append({"baseline": list(baseline), "other": list(other),
                    **compare_rows(record, base, rows[(batch, temperature, gamma, *other)])})
    return out


def compare_rows(record: dict, baseline: dict, other: dict) -> dict:
    """Return ``other`` against ``baseline``, two summary rows of one decode record at the same batch and
    temperature (two rules, two chain counts, or a fixed gamma and a policy), measured on the same prompts
    and seeds: what :func:`compare_variants` returns for each pair, keyed by the baseline's batch,
    temperature and gamma."""
    if (baseline["batch"], baseline["temperature"]) != (other["batch"], other["temperature"]):
        raise ValueError("compare_rows compares rows of one batch size and temperature")
    seed, batch = record["config"]["seed"], baseline["batch"]
    new = record["config"]["max_new_tokens"] * record["config"]["repeats"] * batch
    base_calls, alt_calls = baseline["target_calls_per_group"], other["target_calls_per_group"]
    base_seconds, alt_seconds = baseline["speculative_seconds_per_group"], other["speculative_seconds_per_group"]
    return {
        "batch": batch, "temperature": baseline["temperature"], "gamma": baseline["gamma"],
        "groups": len(base_calls),
        "baseline_tokens_per_call": baseline["tokens_per_target_forward"],
        "baseline_tokens_per_call_ci95": ratio_interval([new] * len(base_calls), base_calls, seed),
        "other_tokens_per_call": other["tokens_per_target_forward"],
        "other_tokens_per_call_ci95": ratio_interval([new] * len(alt_calls), alt_calls, seed),
        "tokens_per_call_ratio": sum(base_calls) / sum(alt_calls),
        "tokens_per_call_ratio_ci95": ratio_interval(base_calls, alt_calls, seed),
        "baseline_speedup": baseline["speedup"], "other_speedup": other["speedup"],
        "baseline_speedup_ci95": baseline["speedup_ci95"], "other_speedup_ci95": other["speedup_ci95"],
        "speedup_ratio": sum(base_seconds) / sum(alt_seconds),
        "speedup_ratio_ci95": ratio_interval(base_seconds, alt_seconds, seed),
    }


# ---------------------------------------------------------------- the same configuration in several records

def across_records(records: Sequence[dict], figure: str = "speedup", **fields) -> dict:
    """Return ``figure`` of the one row with ``fields`` in every record that has such a row: the runs of
    one configuration made by different benchmark runs (on other days, in other orders), so their spread
    is the drift between independent runs that no within-run interval covers.

    Only records of the same pair, the same prompt set and the same decoding settings (prompts, new tokens)
    are compared; the first record sets them, and a record that differs is left out and named under
    ``"left_out"``. Returns ``{"runs": [{"file", "date", figure, figure_ci95}, ...], "low", "high",
    "median", "n"}``; a ValueError when no record has the row. A record of several runs counts each run
    (:func:`split_runs`)."""
    def key(record):
        config = record["config"]
        return record.get("pair_sha256"), record.get("prompts_sha256"), config.get("prompts"), \
            config.get("max_new_tokens"), config.get("dtype")

    runs, left_out, reference = [], [], None
    for record in (run for each in records for run in split_runs(each)):
        found = rows_where(record, **fields) if isinstance(record.get("results"), list) else []
        if len(found) != 1 or figure not in found[0]:
            continue
        reference = reference or key(record)
        if key(record) != reference:
            left_out.append(record.get("file", record.get("benchmark", "?")))
            continue
        row = found[0]
        runs.append({"file": record.get("file", "?"), "date": record["environment"].get("date_utc", "?")[:10],
                     figure: row[figure], f"{figure}_ci95": row.get(f"{figure}_ci95")})
    if not runs:
        shown = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        raise ValueError(f"no record has one row with {shown} and a {figure!r}")
    values = [r[figure] for r in runs]
    return {"runs": runs, "n": len(runs), "low": min(values), "high": max(values),
            "median": statistics.median(values), "left_out": left_out}


# ---------------------------------------------------------------- which draft: prices, agreement, the race

def _prices_results(record: dict) -> list[dict]:
    """Per entry of a prices record: its median seconds, and its cost relative to the target's one-token
    forward (v for a target width, c for a draft shape), as the ratio of medians and its range over the
    rounds (each round's own ratio: the spread between rounds)."""
    rounds = record["observations"]
    plain = rounds["target_1"]
    rows = []
    for name, times in rounds.items():
        kind, label = name.split("_", 1)
        ratios = [t / p for t, p in zip(times, plain)]
        row = {"kind": "verification" if kind == "target" else "draft", "seconds": statistics.median(times),
               "relative": statistics.median(times) / statistics.median(plain),
               "relative_range": [min(ratios), max(ratios)]}
        if kind == "target":
            row["width"] = int(label)
        else:
            row.update(shape=label, parameters=record["shapes"][label]["parameters"])
        rows.append(row)
    return rows


def price_cliffs(record: dict) -> list[dict]:
    """Return the pairs of target widths (narrow, wide) where the narrower forward costs more than the
    wider one in every round: the cliffs a cost model should know (a width-w verification checks w - 1
    drafts)."""
    rounds = record["observations"]
    widths = sorted(int(n.split("_")[1]) for n in rounds if n.startswith("target_"))
    cliffs = []
    for i, narrow in enumerate(widths):
        for wide in widths[i + 1:]:
            a, b = rounds[f"target_{narrow}"], rounds[f"target_{wide}"]
            if all(x > y for x, y in zip(a, b)):
                cliffs.append({"narrow": narrow, "wide": wide,
                               "ratio": statistics.median(a) / statistics.median(b)})
    return cliffs


def mean_interval(values: Sequence[float], seed: int = 0) -> list[float]:
    """Return a 95% percentile bootstrap interval of the mean of ``values`` (entries resampled)."""
    return bootstrap_interval([list(values)], lambda x, axis=-1: np.mean(x, axis=axis), seed, vectorized=True)


def _agreement_results(record: dict) -> list[dict]:
    """Per draft and temperature: the mean exact acceptance rate over contexts, with a 95% bootstrap
    interval over contexts (the context is the unit: positions within one are not independent)."""
    rows = []
    for o in record["observations"]:
        rows.append({"draft": o["draft"], "temperature": o["temperature"], "contexts": len(o["rates"]),
                     "alpha": statistics.fmean(o["rates"]), "alpha_ci95": mean_interval(o["rates"], seed=0)})
    return rows


def predicted_speedup(alpha: float, c: float, v: dict, gamma: int) -> float:
    """The cost model's speedup at draft length ``gamma``: expected tokens per block over the block's cost,
    expected_tokens(alpha, gamma) / (gamma c + v(gamma)), with c and v in plain steps (v keyed by gamma)."""
    return expected_tokens(alpha, gamma) / (gamma * c + interpolated(v, gamma))


def draft_ranking(agreement: dict, prices: dict, gammas: Optional[Sequence[int]] = None) -> list[dict]:
    """Rank each draft of an agreement record, per temperature, by the predicted speedup at its best gamma,
    from its exact alpha (the agreement record) and the forwards' prices (c of its shape and v of width
    gamma + 1, the prices record): a prediction from data no decoding run produced. The prices are the
    forwards alone; a decoding loop adds its own work per step, so a run reaches less than this. Also
    the prediction at the interval's ends of alpha.

    ``gammas`` are the lengths searched; by default every gamma >= 1 whose width gamma + 1 the prices
    record priced. A gamma whose width was not priced is refused, not skipped."""
    price = {(r["kind"], r.get("width", r.get("shape"))): r["relative"] for r in analyse(prices)}
    priced = sorted(w - 1 for kind, w in price if kind == "verification" and w >= 2)
    gammas = priced if gammas is None else list(gammas)
    if not gammas:
        raise ValueError("no gamma to rank at: the prices record priced no verification wider than one position")
    missing = [g for g in gammas if ("verification", g + 1) not in price]
    if missing:
        raise ValueError(f"gamma {missing}: the prices record priced no verification of width gamma + 1 "
                         f"(it priced widths {[g + 1 for g in priced]})")
    v = {g: price[("verification", g + 1)] for g in gammas}
    rows = []
    for row in analyse(agreement):
        shape = "{n_layer}x{d_model}".format(**agreement["drafts"][row["draft"]]["draft_config"])
        if ("draft", shape) not in price:
            raise ValueError(f"the prices record has no draft of shape {shape} (draft {row['draft']!r})")
        c = price[("draft", shape)]
        by_gamma = {g: predicted_speedup(row["alpha"], c, v, g) for g in v}
        best = max(by_gamma, key=by_gamma.get)
        low, high = (predicted_speedup(a, c, v, best) for a in row["alpha_ci95"])
        rows.append({**row, "shape": shape, "c": c, "best_gamma": best, "predicted": by_gamma[best],
                     "predicted_ci95": [low, high], "predicted_by_gamma": by_gamma})
    return sorted(rows, key=lambda r: (r["temperature"], -r["predicted"]))


def _drafts_results(record: dict) -> list[dict]:
    """One decode row (:func:`_decode_results`) per draft and point: each draft's observations with the
    shared plain runs, its own calibration and forward costs; the row carries ``draft``."""
    rows = []
    for name in record["drafts"]:
        own = {**record, "benchmark": "decode",
               "calibrations": [c for c in record["calibrations"] if c["draft"] == name],
               "forward_costs": [c for c in record["forward_costs"] if c["draft"] == name],
               "observations": [o for o in record["observations"] if o["draft"] in (None, name)]}
        rows.extend({"draft": name, **row} for row in _decode_results(own))
    return rows


def draft_names(record: dict, pair_sha256: str, pair_info: dict) -> dict[str, str]:
    """Return {name in ``record``: the draft's own name} for a record of several drafts (``bench drafts``,
    ``bench agreement``), given the shipped pair's sha256 and pair.json. The races call the pair's own draft
    "shipped"; which draft that was depends on the pair the record was made with: the shipped pair's draft
    is named as pair.json's ``shipped_draft`` names it, and a replaced pair's draft by the candidate folder
    it was kept as. Candidates keep their names. A record of any other pair is refused in one line."""
    made_with = record.get("pair_sha256")
    if made_with == pair_sha256:
        own = (pair_info.get("shipped_draft") or {}).get("name") or "shipped"
    else:
        kept = [r.get("kept_as") for r in pair_info.get("replaced", []) if r["pair_sha256"] == made_with]
        if not kept:
            raise ValueError(f"{record.get('file', 'the record')} was made with pair {str(made_with)[:12]}, neither "
                             f"the shipped pair ({pair_sha256[:12]}) nor one it replaced")
        own = kept[0].rstrip("/").rsplit("/", 1)[-1] if kept[0] else "replaced"
    names = {name: name for name in record["drafts"]}
    names["shipped"] = own
    if len(set(names.values())) != len(names):
        raise ValueError(f"{record.get('file', 'the record')} already has a draft named {own!r}")
    return names


def rename_drafts(record: dict, names: dict[str, str]) -> dict:
    """Return a copy of ``record`` with every draft named by ``names`` (:func:`draft_names`): the keys of its
    ``drafts`` and every ``draft`` field, wherever it lies."""
    def walk(value):
        if isinstance(value, list):
            return [walk(v) for v in value]
        if not isinstance(value, dict):
            return value
        return {k: ({names.get(n, n): walk(d) for n, d in v.items()} if k == "drafts" and isinstance(v, dict)
                    else names.get(v, v) if k == "draft" and isinstance(v, str) else walk(v))
                for k, v in value.items()}
    return walk(record)


def compare_drafts(record: dict, baseline: str, other: str, **fields) -> list[dict]:
    """Return, for each run of a drafts record, ``other``'s speedup against ``baseline``'s at the point
    ``fields`` (temperature, gamma; batch 1 unless given): the ratio of the baseline's speculative decode
    seconds to the other's, summed over groups, with a 95% bootstrap interval paired over groups (same
    prompts, same seeds, same plain runs), as :func:`compare_rows` gives it."""
    fields = {"batch": 1, **fields}
    out = []
    for run in split_runs(record):
        base, alt = row_where(run, draft=baseline, **fields), row_where(run, draft=other, **fields)
        out.append(compare_rows(run, base, alt))
    return out


def block_profile(profile: dict) -> dict:
    """Return a block profile's figures (:func:`bench.profile_block`): each part's median seconds and its
    share of the parts' sum, the share of the parts outside the forwards, and, from the whole decoding
    runs, the share of decode time spent outside the forwards (median over runs, with its range)."""
    medians = {name: statistics.median(times) for name, times in profile["rounds"].items()}
    total = sum(medians.values())
    forwards = medians["draft_forwards"] + medians["target_forward"]
    outside_runs = [1 - r["forward_seconds"] / r["decode_seconds"] for r in profile["runs"]]
    return {"seconds": medians, "share": {name: t / total for name, t in medians.items()},
            "parts_outside_forwards": 1 - forwards / total,
            "runs_outside_forwards": statistics.median(outside_runs),
            "runs_outside_forwards_range": [min(outside_runs), max(outside_runs)]}
