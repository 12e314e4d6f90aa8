"""Analysis of a race against transformers (``bench peer``): this engine under each policy against
transformers' assisted generation under each schedule, prompt by prompt; and, over a race's runs, each side's
fastest head to head.

Explained in: notebooks/08_decoding_demo and notebooks/11_draft_length. Pure: it reads the race's timed calls,
and times nothing.
"""

from __future__ import annotations

import statistics

from speculative.engine.policy import make_policy
from speculative.measure.costs import calibration_costs
from speculative.measure.lookup import row_where, rows_where, split_runs
from speculative.measure.rows import PeerRow
from speculative.measure.shared import bootstrap_interval, per_total, ratio_interval, speed_ratio

__all__ = ["peer_rows", "peer_decoder", "head_to_head"]


def peer_rows(record: dict) -> list[PeerRow]:
    """Per temperature, transformers' schedule and this engine's policy: one row of the race (:func:`_peer_row`)."""
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
            f"{name}_tokens_per_s_ci95": bootstrap_interval([seconds], per_total(made), tally["seed"],
                                                            vectorized=True)}


def _peer_calls(tally: dict, name: str, label: str) -> dict:
    """Acceptance, tokens per target call and drafts per call of decoder ``name``, with intervals."""
    accepted, drafted, blocks = (tally[k][name] for k in ("accepted", "drafted", "blocks"))
    made, seed = tally["made"], tally["seed"]
    return {f"{label}_acceptance": sum(accepted) / sum(drafted),
            f"{label}_acceptance_ci95": ratio_interval(accepted, drafted, seed),
            f"{label}_tokens_per_call": made * len(blocks) / sum(blocks),
            f"{label}_tokens_per_call_ci95": bootstrap_interval([blocks], per_total(made), seed, vectorized=True),
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
    return make_policy("auto", calibration=calibration, max_gamma=config["auto_max_gamma"],
                       v_floor=config.get("auto_v_floor", 0.0)), calibration  # no floor before it was recorded


def _peer_row(record: dict, tally: dict, temperature: float, schedule: str, policy: str) -> PeerRow:
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
    return PeerRow(**row)


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
