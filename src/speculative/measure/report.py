"""Report: the tables and the one-line machine description that the CLI and the chapters show.

Explained in: notebooks/08_decoding_demo (the recorded runs).

Every function here formats what :mod:`speculative.measure.analysis` computed (a record's ``results``); none
computes a figure of its own.
"""

from __future__ import annotations

import statistics
from fractions import Fraction
from numbers import Rational
from typing import Optional

from tabulate import tabulate

from speculative import defaults
from speculative.measure.analysis_sampler import ratio_extremes


class Shown:
    """A value whose plain-text form is ``text``: ``{glue:text}`` prints it as is, without quotes."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other) -> bool:
        return isinstance(other, Shown) and other.text == self.text


def as_text(value) -> str:
    """Return ``value`` as a reader would write it: 3/10 for a Fraction, (1/5, 3/10) for a sequence of them."""
    if isinstance(value, Rational) and not isinstance(value, bool):
        value = Fraction(value)
        return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(as_text(v) for v in value) + ")"
    return str(value)


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def scientific(value: float, digits: int = 2) -> Shown:
    """Return ``value`` as a reader writes it: ``7.6 × 10⁻⁵⁶``, ``10⁻⁶``, ``0.031`` or ``0``.

    Values from 0.001 to 9999 keep ``digits`` significant figures in plain notation; others get a
    mantissa and a power of ten (no ``1e-06`` or ``0.0e+00`` on a page).
    """
    import math

    value = float(value)
    if value == 0 or not math.isfinite(value):
        return Shown("0" if value == 0 else str(value))
    exponent = math.floor(math.log10(abs(value)))
    if -3 <= exponent < 4:
        return Shown(f"{value:.{max(digits - 1 - exponent, 0)}f}")
    mantissa = round(value / 10 ** exponent, digits - 1)
    if abs(mantissa) >= 10:
        mantissa, exponent = mantissa / 10, exponent + 1
    power = "10" + str(exponent).translate(_SUPERSCRIPT)
    return Shown(power if mantissa == 1 else f"{mantissa:.{digits - 1}f} × {power}")



__all__ = ["describe_machine", "ratio_bound", "markdown_table", "format_sampler_table", "format_decode_table",
           "format_peer_table", "format_runs_table", "format_peer_runs_table", "format_prices_table",
           "format_agreement_table", "format_drafts_table", "SAMPLER_LEGEND", "DECODE_LEGEND", "PEER_LEGEND"]


def describe_machine(environment: dict) -> str:
    """Return one line saying what a record was measured on: device (accelerator or CPU, and the host's
    logical CPUs, ``os.cpu_count()``), torch, threads, and the host probe's softmax time where the record
    has one (:func:`speculative.engine.timing.host_probe`)."""
    env = environment
    cpus = f", {env['cpu_count']} CPUs" if env.get("cpu_count") else ""
    line = (f"{env['device']} ({env.get('accelerator') or env['cpu']}{cpus}), torch {env['torch']}, "
            f"{env['threads']} threads")
    if "host_probe" in env:
        line += f" (host probe: softmax {env['host_probe']['softmax_ms']:.1f} ms)"
    return line


SAMPLER_LEGEND = ("batch: rows per call; V: vocabulary; pos/s: drafted positions verified per second (batch x k per "
                  "call, median of interleaved runs); ratio: batched / reference; extremes: the slowest batched "
                  "run against the fastest reference run, and the reverse")


def ratio_bound(value: float, digits: int = 2) -> str:
    """Return one end of a ratio's interval with ``digits`` decimals, or more where that would print a bound
    that is not 1 as 1 (0.9969 is "0.997", not "1.00"), so that a table shows which side of 1 it lies on."""
    text = f"{value:.{digits}f}"
    while value == value and value != 1 and float(text) == 1 and digits < 6:
        digits += 1
        text = f"{value:.{digits}f}"
    return text


def interval_text(interval, groups: int, dash: str = "–") -> str:
    """Return a ratio's interval as "low–high" (:func:`ratio_bound` ends), or "no interval (n groups)" when it
    rests on fewer than ``defaults.MIN_INTERVAL_GROUPS`` groups of prompts or is NaN (a single group)."""
    low, high = interval
    if groups < defaults.MIN_INTERVAL_GROUPS or low != low or high != high:
        return f"no interval ({groups} group{'' if groups == 1 else 's'})"
    return f"{ratio_bound(low)}{dash}{ratio_bound(high)}"


def markdown_table(rows, headers, align: str = "") -> str:
    """Return a Markdown pipe table of ``rows`` under ``headers`` by :func:`tabulate.tabulate`. Cells are shown
    as given (format numbers before); ``align`` holds one letter per column, ``l``, ``r`` or ``c`` (default:
    the first column left, the others right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    if len(align) != len(headers) or set(align) - set("lrc"):
        raise ValueError(f"align needs one of l, r, c per column ({len(headers)}), got {align!r}")
    names = {"l": "left", "r": "right", "c": "center"}
    return tabulate([[str(cell) for cell in row] for row in rows], headers=list(headers), tablefmt="pipe",
                    colalign=[names[a] for a in align], disable_numparse=True)


def _table(headers: list[str], rows: list[list[str]], notes: list[str], markdown: bool) -> str:
    """Return a table of cells already formatted, every column right-aligned, by :func:`tabulate.tabulate`: plain
    text (for a terminal) or a Markdown pipe table (for a page), then the notes under it."""
    table = markdown_table(rows, headers, "r" * len(headers)) if markdown else \
        tabulate(rows, headers, tablefmt="plain", colalign=("right",) * len(headers), disable_numparse=True)
    if markdown:
        return "\n".join([table, ""] + [f"{note}\n" for note in notes]).rstrip() + "\n"
    return "\n".join([table] + notes)


def format_sampler_table(record: dict, markdown: bool = False) -> str:
    """Return the sampler record as a table (plain text, or Markdown with ``markdown=True``) with a legend."""
    def extremes(timings: dict) -> str:
        low, high = ratio_extremes(timings)
        return f"{low:.1f}-{high:.1f}x"

    rows = [[str(row["batch"]), str(row["vocab"]), f"{row['batched_positions_per_s']:,.0f}",
             f"{row['reference_positions_per_s']:,.0f}", f"{row['speedup']:.2f}x", extremes(row["timings"])]
            for row in record["results"]]
    config = record["config"]
    notes = [f"measured on {describe_machine(record['environment'])}; k = {config['k']} drafts per row, "
             f"{config['repeats']} interleaved runs of each side", SAMPLER_LEGEND]
    return _table(["batch", "V", "batched pos/s", "reference pos/s", "ratio", "extremes"], rows, notes, markdown)


DECODE_LEGEND = (
    "alpha: accepted / tested drafts; tok/fwd: new tokens per row (one output sequence) per target call, "
    "however many draft chains that call verifies; speedup: plain / speculative "
    "decode-phase seconds, pooled over prompts and repeats, with its 95% bootstrap interval over groups of "
    "prompts and the median over groups; c, v: a draft step and a verification step over gamma+1 positions, "
    "relative to a plain step, calibrated apart from the runs; pred.: tok/fwd / (gamma c + v); "
    "effic.: speedup / pred.")
#: Legend clauses a decode table adds only when what they explain is in it.
V_BELOW_ONE_NOTE = ("A v below 1, marked *, is a step over gamma+1 positions timed cheaper than one over one: "
                    "timing noise.")
FORWARD_TIMES_NOTE = ("The config's forward_times_from names where the per-forward cost breakdown was timed, not c "
                      "and v.")
#: The legend of a decode table's two columns from whole decoding calls, and its clause for the policy's rows.
DECODED_NOTE = ("pred. dec., effic. dec.: the prediction from whole decoding calls on held-out prompts, made by the "
                "calibration (c from the draft step, v from a decoded block beyond its draft steps), and the speedup "
                "over it")
DECODED_POLICY_CLAUSE = "; none for the cost-model policy, whose blocks vary in length"


def _rule_label(row: dict, times: str) -> str:
    """A row's verification rule as the tables print it; rows of several draft chains name their count."""
    rule = row.get("rule", "token")
    return rule + (f" {times}{row.get('drafts', 1)}" if rule == "chains" else "")


def format_decode_table(record: dict, batch: Optional[int] = None, gamma: Optional[int] = None,
                        markdown: bool = False, rule: Optional[str] = None) -> str:
    """Return the decode record (optionally one batch size, one gamma or one verification rule) as a table,
    plain text or Markdown (``markdown=True``), with what it was measured on and a legend. A record of
    several rules gets a rule column."""
    rows = []
    several = len(record["config"].get("rules", ["token"])) > 1 or max(record["config"].get("drafts", [1])) > 1
    decoded = any("predicted_decoded" in row for row in record["results"])
    shown = [row for row in record["results"] if (batch is None or row["batch"] == batch)
             and (gamma is None or row["gamma"] == gamma) and (rule is None or row.get("rule", "token") == rule)]
    for row in shown:
        times, dash = ("×", "–") if markdown else ("x", "-")
        interval = interval_text(row["speedup_ci95"], row["groups"], dash)
        rows.append([str(row["batch"]), f"{row['temperature']:g}", str(row["gamma"]), f"{row['alpha']:.3f}",
                     f"{row['tokens_per_target_forward']:.2f}", f"{row['speedup']:.2f}{times}", interval,
                     f"{row['speedup_median']:.2f}{times}", f"{row['calibration']['c']:.3f}",
                     f"{row['calibration']['v']:.2f}" + ("*" if row["calibration"]["v"] < 1 else ""),
                     f"{row['predicted']:.2f}{times}", f"{row['efficiency']:.2f}"])
        if decoded:
            rows[-1] += [f"{row['predicted_decoded']:.2f}{times}", f"{row['efficiency_decoded']:.2f}"] \
                if "predicted_decoded" in row else ["-", "-"]
        if several:
            rows[-1].insert(3, _rule_label(row, times))
    config = record["config"]
    notes = [f"measured on {describe_machine(record['environment'])}; pair {record['pair_sha256'][:12]}; "
             f"{config['prompts']} prompts, "
             f"{config['repeats']} repeat{'s' if config['repeats'] != 1 else ''}, {config['max_new_tokens']} new "
             "tokens each", DECODE_LEGEND]
    if any(row["calibration"]["v"] < 1 for row in shown):
        notes[-1] += " " + V_BELOW_ONE_NOTE
    if "forward_times_from" in config:
        notes[-1] += " " + FORWARD_TIMES_NOTE
    headers = ["batch", "T", "gamma", "alpha", "tok/fwd", "speedup", "95% interval", "median", "c", "v", "pred.",
               "effic."]
    if decoded:
        headers += ["pred. dec.", "effic. dec."]
        notes.append(DECODED_NOTE + (DECODED_POLICY_CLAUSE if any(row["gamma"] == "auto" for row in shown) else ""))
    if several:
        headers.insert(3, "rule")
    return _table(headers, rows, notes, markdown)


def format_runs_table(record: dict, markdown: bool = False) -> str:
    """Return a record of several runs as a table: one line per configuration, each run's speedup with its
    95% interval within the run, and the range over the runs; then what each run was measured on. Rows of
    several draft chains name their count (``chains ×2``)."""
    times, dash = ("×", "–") if markdown else ("x", "-")
    rows = []
    for row in record["results"]:
        cells = [str(row["batch"]), f"{row['temperature']:g}", str(row["gamma"]), _rule_label(row, times)]
        for run in row["runs"]:
            low, high = run["speedup_ci95"]
            cells.append(f"{run['speedup']:.2f}{times} ({ratio_bound(low)}{dash}{ratio_bound(high)}; "
                         f"c {run['calibration']['c']:.3f})")
        low, high = row["speedup_range"]
        rows.append(cells + [f"{low:.2f}{dash}{high:.2f}{times}"])
    headers = ["batch", "T", "gamma", "rule", *(f"run {i + 1} (95% interval)" for i in range(len(record["runs"]))),
               "range over runs"]
    config = record["config"]
    notes = [f"run {i + 1}: {run['environment']['date_utc']}, {describe_machine(run['environment'])}"
             for i, run in enumerate(record["runs"])]
    notes += [f"pair {record['pair_sha256'][:12]}; {config['prompts']} prompts, {config['repeats']} repeats, "
              f"{config['max_new_tokens']} new tokens each, per run; speedup as in the decode table; c: the "
              "draft step's price that run's calibration measured, relative to a plain step"]
    return _table(headers, rows, notes, markdown)


#: The decoders the race runs on every prompt, in turn: this engine (speculative and plain, on the library's
#: models, and speculative on the exported models wrapped by ``hf.wrap``) and transformers' ``generate``
#: (plain, and assisted under each schedule raced).
PEER_LEGEND = (
    "tok/s: new tokens per second of the whole call (prefill included), pooled over prompts and repeats, "
    "with a 95% bootstrap interval over prompts; ours/HF: the ratio of the two, paired by prompt; acc/draft: "
    "accepted / drafted tokens (not alpha, which the decode table gives as accepted / tested: a draft after a "
    "rejection is drafted but never tested); tok/call: new tokens per target call that emits tokens.")


def format_peer_table(record: dict, markdown: bool = False, policy: Optional[str] = None) -> str:
    """Return the race as a table: one line per (temperature, transformers schedule, this engine's policy),
    or only the rows of ``policy``. A record of several policies gets a policy column."""
    def interval(row, key, digits=0):
        low, high = row[f"{key}_ci95"]
        return f"{row[key]:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"

    def ratio(row, key):  # a ratio's bounds show which side of 1 they lie on
        low, high = row[f"{key}_ci95"]
        return f"{row[key]:.2f} [{ratio_bound(low)}-{ratio_bound(high)}]"

    several = len({r.get("policy", "fixed") for r in record["results"]}) > 1 and policy is None
    headers = ["T", "HF schedule", "ours tok/s", "HF assisted tok/s", "ours/HF", "ours plain tok/s",
               "HF plain tok/s", "acc/draft ours", "acc/draft HF", "tok/call ours", "tok/call HF"]
    rows = []
    for r in record["results"]:
        if policy is not None and r.get("policy", "fixed") != policy:
            continue
        rows.append([f"{r['temperature']:g}",
                     r["hf_schedule"] + (f" ({r['gamma']})" if r["hf_schedule"] == "fixed" else ""),
                     interval(r, "ours_tokens_per_s"), interval(r, "hf_assisted_tokens_per_s"),
                     ratio(r, "ours_over_hf_assisted"), interval(r, "ours_plain_tokens_per_s"),
                     interval(r, "hf_plain_tokens_per_s"),
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
             f"{describe_machine(env)}."]
    return _table(headers, rows, notes, markdown)


def format_peer_runs_table(record: dict, markdown: bool = False) -> str:
    """Return a race of several runs (``bench peer --runs N``) as a table: one line per (temperature,
    transformers schedule, this engine's policy), this engine's speed over transformers' assisted generation
    in each run with its 95% interval over prompts, and the range over the runs; then what each run was
    measured on."""
    times, dash = ("×", "–") if markdown else ("x", "-")
    rows = []
    for row in record["results"]:
        cells = [f"{row['temperature']:g}", row["hf_schedule"], row.get("policy", "fixed")]
        for run in row["runs"]:
            low, high = run["ours_over_hf_assisted_ci95"]
            cells.append(f"{run['ours_over_hf_assisted']:.2f}{times} ({ratio_bound(low)}{dash}{ratio_bound(high)})")
        low, high = row["ours_over_hf_assisted_range"]
        rows.append(cells + [f"{low:.2f}{dash}{high:.2f}{times}"])
    headers = ["T", "HF schedule", "ours: policy",
               *(f"ours/HF, run {i + 1} (95% interval)" for i in range(len(record["runs"]))), "range over runs"]
    config = record["config"]
    notes = [f"run {i + 1}: {run['environment']['date_utc']}, {describe_machine(run['environment'])}, transformers "
             f"{run['environment']['transformers']}" for i, run in enumerate(record["runs"])]
    notes += [f"pair {record['pair_sha256'][:12]}; {config['prompts']} prompts x {config['repeats']} repeats, "
              f"{config['max_new_tokens']} new tokens, batch 1, per run; fixed gamma {config['gamma']}; "
              "ours/HF as in the race's table"]
    return _table(headers, rows, notes, markdown)


def format_prices_table(record: dict, markdown: bool = False) -> str:
    """Return a prices record as a table: each forward's median milliseconds and its cost relative to the
    target's one-token forward, with that ratio's range over the rounds."""
    rows = []
    for row in record["results"]:
        what = f"target, {row['width']} positions" if row["kind"] == "verification" else \
            f"draft {row['shape']} ({row['parameters'] / 1e6:.2f} M)"
        low, high = row["relative_range"]
        rows.append([what, f"{row['seconds'] * 1e3:.3f}", f"{row['relative']:.3f}", f"{low:.3f}-{high:.3f}"])
    notes = [f"measured on {describe_machine(record['environment'])}; {record['config']['repeats']} interleaved "
             f"rounds; cache filled to position {record['config']['position']}",
             "relative: median over rounds / the target's one-position forward (v for a width, c for a draft)"]
    return _table(["forward", "ms", "relative", "range over rounds"], rows, notes, markdown)


def format_agreement_table(record: dict, markdown: bool = False) -> str:
    """Return an agreement record as a table: each draft's exact acceptance rate per temperature."""
    rows = [[row["draft"], f"{row['temperature']:g}", str(row["contexts"]), f"{row['alpha']:.3f}",
             f"{row['alpha_ci95'][0]:.3f}-{row['alpha_ci95'][1]:.3f}"] for row in record["results"]]
    notes = [f"computed on {describe_machine(record['environment'])}; pair {record['pair_sha256'][:12]}",
             "alpha: sum min(p, q) from full forwards, mean over the generated positions of each context, then over "
             "contexts; 95% bootstrap interval over contexts"]
    return _table(["draft", "T", "contexts", "alpha", "95% interval"], rows, notes, markdown)


def format_drafts_table(record: dict, markdown: bool = False) -> str:
    """Return a drafts race as a table: one line per draft and point, each run's speedup; a race whose
    calibration also decoded held-out prompts gets that prediction and its efficiency too."""
    rows = []
    decoded = all("predicted_decoded" in r for row in record["results"] for r in row.get("runs", [row]))
    for row in record["results"]:
        runs = row.get("runs", [row])
        speedups = " ".join(f"{r['speedup']:.2f}" for r in runs)
        prices = " ".join(f"{r['calibration']['c']:.3f}" for r in runs)
        rows.append([row["draft"], f"{row['temperature']:g}", str(row["gamma"]),
                     f"{statistics.median(r['alpha'] for r in runs):.3f}", speedups, prices,
                     f"{statistics.median(r['predicted'] for r in runs):.2f}",
                     f"{statistics.median(r['efficiency'] for r in runs):.2f}"])
        if decoded:
            rows[-1] += [f"{statistics.median(r['predicted_decoded'] for r in runs):.2f}",
                         f"{statistics.median(r['efficiency_decoded'] for r in runs):.2f}"]
    several = any(len(row.get("runs", [row])) > 1 for row in record["results"])
    notes = [f"pair {record['pair_sha256'][:12]}; {record['config']['prompts']} prompts, "
             f"{record['config']['max_new_tokens']} new tokens; "
             + ("speedup of each run over plain decoding; alpha, prediction and efficiency: the median over runs"
                if several else "one run: speedup over plain decoding, alpha, prediction and efficiency")
             + ("; pred./effic. from the steps and blocks timed apart from any run, decoded: from whole "
                "decoding calls on held-out prompts" if decoded else "")]
    headers = ["draft", "T", "gamma", "alpha", "speedup per run", "c per run", "pred.", "effic."]
    return _table(headers + (["pred. decoded", "effic. decoded"] if decoded else []), rows, notes, markdown)
