"""Costs: the cost model's inputs and prices, from records: a calibration's raw seconds as c and v (a draft step
and a verification, in plain steps), the predicted speedup at a draft length, and a decode record's prices of
draft-length rules.

Explained in: notebooks/07_cost_model. Pure: nothing here times, draws or touches a model.
"""

from __future__ import annotations

from speculative.engine.policy import _interpolate as interpolate
from speculative.engine.policy import expected_tokens

__all__ = ["step_costs", "decoded_costs", "calibration_costs", "interpolated", "predicted_speedup", "length_prices"]


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
    """Return a raw calibration (``seconds`` of each step, from
    :func:`speculative.measure.calibration.calibrate_steps`) with c, v, v_alone and v_from_alone added, relative
    to its own plain step or to ``plain_seconds``: multi-draft decoding runs k rows per step but is compared
    with plain decoding of one row, so its steps are counted in that row's plain steps."""
    seconds = calibration["seconds"]
    gammas = sorted(int(name.split("_")[1]) for name in seconds if name.startswith("verify_"))
    relative = seconds["plain"] if plain_seconds is None else plain_seconds
    out = {**calibration, **step_costs(seconds, gammas, relative)}
    if "plain_decoded" in seconds:  # whole decoding calls on held-out prompts (calibration.calibrate_steps)
        out["decoded"] = decoded_costs(seconds, gammas)
    if plain_seconds is not None:
        out["relative_to_plain_seconds"] = plain_seconds
    return out


def interpolated(values: dict, k: int) -> float:
    """v at draft length k from a calibration's {length: v} (keys may be ints or, from JSON, strings)."""
    return interpolate(sorted((int(g), float(x)) for g, x in values.items()), k)


def predicted_speedup(alpha: float, c: float, v: dict, gamma: int) -> float:
    """The cost model's speedup at draft length ``gamma``: expected tokens per block over the block's cost,
    expected_tokens(alpha, gamma) / (gamma c + v(gamma)), with c and v in plain steps (v keyed by gamma)."""
    return expected_tokens(alpha, gamma) / (gamma * c + interpolated(v, gamma))


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
