"""What the audit commands do, as library functions: load a sampler or an engine named on a command line,
choose the engine battery's cases from sampling flags, audit transformers' assisted generation in each of
its configurations, and the exact report of ``python -m speculative verify``.

The CLI (:mod:`speculative.cli`) only parses arguments and calls these. Each raises ``ValueError`` with one
line naming the problem when a name or a value cannot be used.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from speculative.defaults import setting

__all__ = ["import_callable", "load_sampler", "check_signature", "engine_cases", "load_engine",
           "audit_transformers", "EngineAuditOptions", "run_engine_audit", "verify_report"]


def import_callable(spec: str, expected: str) -> Callable:
    """Return the callable ``MODULE:FUNCTION`` names (``expected`` names the forms a caller takes, for the
    error)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"expected {expected}, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import failure is reported in one line
        raise ValueError(f"cannot import {module_name!r}: {type(error).__name__}: {error}") from None
    function = module
    for part in attribute.split("."):
        if not hasattr(function, part):
            raise ValueError(f"{module_name!r} has no attribute {attribute!r}")
        function = getattr(function, part)
    if not callable(function):
        raise ValueError(f"{spec} is a {type(function).__name__}, not a function")
    return function


def load_sampler(spec: str) -> tuple[Callable, str, str]:
    """Return (function, convention, name) for ``MODULE:FUNCTION``, ``pitfall:KEY`` (an entry of the gallery,
    with the demo options it has in chapter 05) or ``hf`` (the installed transformers'
    ``_speculative_sampling``)."""
    if spec == "hf":
        try:
            import transformers
            from transformers.generation.utils import _speculative_sampling
        except ImportError as error:
            raise ValueError(f"cannot import transformers' _speculative_sampling ({error}); "
                             "pip install transformers") from None
        return _speculative_sampling, "hf", f"transformers {transformers.__version__} _speculative_sampling"
    if spec.startswith("pitfall:"):
        from speculative.audit.core import pitfall_sampler
        from speculative.audit.pitfalls import find

        return pitfall_sampler(find(spec.partition(":")[2])), "pitfall", spec
    return import_callable(spec, "MODULE:FUNCTION, pitfall:KEY or hf"), "probs", spec


def check_signature(function: Callable, convention: str) -> None:
    """Refuse, before an audit starts, a function that cannot take the convention's four positional
    arguments (functions without a signature, such as builtins, are left to the audit)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(4))
    except TypeError:
        raise ValueError(f"{getattr(function, '__qualname__', function)}{signature} cannot take the 4 "
                         f"positional arguments of the {convention!r} convention") from None


def engine_cases(temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
                 repetition_penalty: Optional[float] = None, names: Optional[Sequence[str]] = None) -> list:
    """The engine battery's cases for an audit: with any of temperature, top-k and top-p, every case under
    those processors (and that penalty); with a penalty alone, the battery's penalty cases; ``names`` keeps the
    cases whose name contains one of them. A processor that leaves a case's support too large fails here."""
    from speculative.audit.engine_cases import engine_battery
    from speculative.sampling.transforms import PenalizedConfig

    config = None
    if any(v is not None for v in (temperature, top_k, top_p)):
        config = PenalizedConfig(1.0 if temperature is None else temperature, top_k, top_p,
                                 repetition_penalty=repetition_penalty or 1.0)
    penalty_only = repetition_penalty is not None and config is None
    cases = engine_battery(penalty=penalty_only, config=config)
    if penalty_only:
        cases = [c for c in cases if "penalty" in c.name]
    if names:
        cases = [c for c in cases if any(text in c.name for text in names)]
        if not cases:
            raise ValueError(f"no engine case matches {list(names)}")
    for case in cases:
        case.law()
    return cases


def load_engine(spec: str, gamma: int = 2, rule: str = "token", per_row: bool = False, mixed: bool = False,
                policy: Optional[str] = None) -> Callable:
    """The engine ``spec`` names: ``ours`` (this library's decoding, with those options), ``gallery:KEY`` or
    ``MODULE:FUNCTION`` (an engine in the models convention)."""
    from speculative.audit.engine_gallery import GALLERY
    from speculative.audit.engines import library_engine

    if spec == "ours":
        return library_engine(gamma, rule=rule, per_row=per_row, mixed=mixed, policy=policy)
    if spec.startswith("gallery:"):
        key = spec.partition(":")[2]
        for entry in GALLERY:
            if entry.key == key:
                return entry.engine()
        raise ValueError(f"no gallery engine {key!r}; known: {', '.join(e.key for e in GALLERY)}")
    return import_callable(spec, "ours, hf, gallery:KEY or MODULE:FUNCTION")


def audit_transformers(labels: Optional[Sequence[str]] = None, seed: int = 0, max_rows: Optional[int] = None,
                       progress: bool = False) -> tuple[list, dict]:
    """Audit the installed transformers' assisted generation in each configuration of
    ``engines.HF_CONFIGURATIONS`` whose label contains one of ``labels`` (all without); return the reports and
    a record of them with the versions that ran."""
    import torch

    from speculative.audit.engine_audit import audit_engine
    from speculative.audit.engine_cases import cases_named, engine_battery
    from speculative.audit.engines import HF_CONFIGURATIONS
    from speculative.engine.timing import environment

    try:
        import transformers
    except ImportError as error:
        raise ValueError(f"cannot import transformers ({error}); pip install transformers") from None
    chosen = {label: value for label, value in HF_CONFIGURATIONS.items()
              if not labels or any(text in label for text in labels)}
    if not chosen:
        raise ValueError(f"no transformers configuration matches {list(labels)}; "
                         f"known: {', '.join(HF_CONFIGURATIONS)}")
    battery = engine_battery(penalty=True)
    # without scikit-learn, transformers keeps assistant_confidence_threshold fixed (no adaptation)
    record = {"engine": "hf", "transformers": transformers.__version__, "torch": torch.__version__,
              "scikit_learn": importlib.util.find_spec("sklearn") is not None, "configurations": []}
    reports = []
    for label, (settings, names) in chosen.items():
        report = audit_engine(settings, convention="hf", cases=cases_named(battery, names), seed=seed,
                              max_rows=max_rows, name=f"transformers {transformers.__version__}: {label}",
                              progress=progress)
        reports.append(report)
        record["configurations"].append({"label": label, "settings": settings, **json.loads(report.to_json())})
    record["environment"] = environment()
    return reports, record


@dataclass(frozen=True)
class EngineAuditOptions:
    """How ``audit-engine`` runs an engine: the battery's processors, this library's engine options, the
    transformers configurations, and the serving doors' options (each field is one command-line option)."""

    temperature: Optional[float] = setting(None, "replace every case's processors: temperature")
    top_k: Optional[int] = setting(None, "... top-k")
    top_p: Optional[float] = setting(None, "... top-p")
    repetition_penalty: Optional[float] = setting(None, "... transformers' repetition penalty; alone, the "
                                                        "battery's penalty cases")
    gamma: int = setting(2, "ours: drafts per block (a policy's start)")
    rule: str = setting("token", "ours: the verification rule", choices=("token", "block"))
    policy: Optional[str] = setting(None, "ours: a draft-length policy instead of a fixed gamma (at most 3 "
                                          "drafts)", choices=("heuristic", "confidence", "auto"))
    per_row: bool = setting(False, "ours: each row keeps its own draft length")
    mixed: bool = setting(False, "ours: rows of two prompt lengths in every batch")
    hf_config: tuple = setting((), "hf: only the configurations whose label contains LABEL", repeat=True,
                               metavar="LABEL")
    method: tuple = setting((), "vllm: a method of doors.VLLM_METHODS (default draft_model)", repeat=True,
                            metavar="NAME")
    speculative_config: Optional[str] = setting(None, "vllm: vLLM's speculative_config as JSON ({draft} is the "
                                                      "case's draft folder, {eagle} its EAGLE head)", metavar="JSON")
    axis: tuple = setting((), "serving axes of serving_runs.AXES: plain, mixed, paired, seeded (none given: plain)",
                          repeat=True, metavar="NAME")
    as_shipped: bool = setting(False, "vllm: without this package's vLLM plugin")
    base_url: Optional[str] = setting(None, "openai: a server already running", metavar="URL")
    serve: Optional[str] = setting(None, "openai: a shell command with {target}, {draft} and {port}, started per "
                                         "case on 127.0.0.1 and stopped after it", metavar="TEMPLATE")
    battery: Optional[str] = setting(None, "vllm, openai: the serving battery's folders (written when missing; "
                                           "default: a temporary folder)", metavar="DIR")
    record: Optional[str] = setting(None, "add this run to a serving record, under --run", metavar="FILE")
    surface: bool = setting(False, "vllm: also record what greedy-match and logprob checks see")
    run_name: Optional[str] = setting(None, "the run's name in --record", flag="--run", metavar="NAME")


def run_engine_audit(spec: str, options: EngineAuditOptions, cases: Optional[Sequence[str]] = None, seed: int = 0,
                     max_rows: Optional[int] = None, progress: bool = False) -> tuple[str, str, bool]:
    """Audit the engine ``spec`` names (``ours``, ``hf``, ``vllm``, ``openai``, ``gallery:KEY`` or
    ``MODULE:FUNCTION``) on the cases whose names contain one of ``cases``; return (the tables to print, the
    report as JSON, whether every case passed)."""
    from speculative.audit.engine_audit import audit_engine

    if spec == "hf":
        reports, record = audit_transformers(options.hf_config, seed, max_rows, progress)
        return ("\n\n".join(r.table() for r in reports), json.dumps(record, indent=2),
                all(r.passed for r in reports))
    if spec in ("vllm", "openai"):
        return _serving_audit(spec, options, cases, seed, max_rows, progress)
    o = options
    engine = load_engine(spec, o.gamma, o.rule, o.per_row, o.mixed, o.policy)
    chosen = engine_cases(o.temperature, o.top_k, o.top_p, o.repetition_penalty, cases)
    if spec == "ours" and any(getattr(c.config, "repetition_penalty", 1) != 1 for c in chosen):
        raise ValueError("this library's engine does not apply a repetition penalty: audit it without one")
    report = audit_engine(engine, cases=chosen, seed=seed, max_rows=max_rows, progress=progress)
    return report.table(), json.dumps(json.loads(report.to_json()), indent=2), report.passed


def _serving_audit(door: str, options: EngineAuditOptions, cases, seed: int, max_rows, progress: bool):
    """:func:`run_engine_audit` through a serving door; the tables are preceded by the surface checks."""
    from speculative.audit import serving_runs as runs

    o = options
    if o.record and not o.run_name:
        raise ValueError("--record needs --run NAME (the run's name in the record)")
    axes = list(o.axis) or ["plain"]
    runs.check_serving_options(door, axes, o.base_url, o.serve)
    configurations = None
    if door == "vllm":
        runs.use_vllm(o.as_shipped)
        spec = json.loads(o.speculative_config) if o.speculative_config else None
        configurations = runs.vllm_configurations(list(o.method) or None, spec)
    with runs.serving_cases(o.battery, cases) as chosen:
        run = runs.run_serving_audit(door, chosen, configurations=configurations, axes=axes, base_url=o.base_url,
                                     serve=o.serve, as_shipped=o.as_shipped, seed=seed, max_rows=max_rows,
                                     progress=progress, surface=o.surface)
    if o.record:
        runs.add_run(Path(o.record), o.run_name, run)
    lines = []
    for check in (run.get("surface_checks") or {}).get("cases", []):
        gap = "—" if check["logprob_gap"] is None else f"{check['logprob_gap']:.1e}"
        lines.append(f"{check['case']}: greedy matches the target: {check['greedy_matches']}; largest logprob gap "
                     f"{gap}")
    lines += [configuration["table"] + "\n" for configuration in run["configurations"]]
    if o.record:
        lines.append(f"run {o.run_name!r} written to {o.record}")
    return "\n".join(lines), json.dumps(run, indent=2, default=str), all(c["passed"] for c in run["configurations"])


def verify_report() -> tuple[str, bool]:
    """The exact report of ``verify``: the seed example, every pitfall's exact law on its demo pair, block
    verification's gain on Sun et al.'s example and the multi-draft schemes; return (text, whether every
    check held)."""
    from speculative.audit.lossy import LOSSY_RULES
    from speculative.audit.pitfalls import FIX, MULTI_DRAFT_PITFALLS, PITFALLS
    from speculative.exact.exact import sun_example_table
    from speculative.exact.multi_draft import multi_draft_table
    from speculative.exact.pitfall_laws import SEED_P, SEED_Q
    from speculative.exact.rule import output_distribution, total_variation
    from speculative.measure.report import as_text

    out = output_distribution(SEED_P, SEED_Q)
    ok = out == list(SEED_P)
    lines = [f"seed example: p = {as_text(SEED_P)}, q = {as_text(SEED_Q)} -> output {as_text(out)}",
             f"{'pitfall':32s} {'exact law on its demo pair (last entry: invalid id)':52s} TV from p"]
    for pitfall in PITFALLS + [FIX] + MULTI_DRAFT_PITFALLS + LOSSY_RULES:
        law = pitfall.exact_law()
        lines.append(f"{pitfall.key:32s} {as_text(law):52s} {as_text(total_variation(law, pitfall.target_law()))}")
    lines.append("law: the exact output distribution of the wrong rule on its demo pair; TV from p: its total "
                 "variation distance from the target (0 = lossless; for relaxed_acceptance, a greedy rule, from "
                 "the target's arg-max)")
    rows = sun_example_table()
    lines += [f"\nblock verification, Sun et al.'s example p = {as_text(rows[0]['p'])}, "
              f"q = {as_text(rows[0]['q'])}, expected accepted drafts per block:",
              f"{'gamma':>5} {'token-wise':>12} {'block':>12} {'block / token':>14}"]
    for row in rows:
        lines.append(f"{row['gamma']:>5} {str(row['token']):>12} {str(row['block']):>12} "
                     f"{str(row['block'] / row['token']):>14}")
        ok &= row["block"] >= row["token"]
    rows = multi_draft_table()
    lines += [f"\nseveral drafts at one position, p = {as_text(rows[0]['p'])}, q = {as_text(rows[0]['q'])}: "
              "P(a draft is accepted) and TV(output, p)",
              f"{'scheme':32s} {'k = 1':>10} {'k = 2':>10} {'k = 3':>10}   TV at k = 1, 2, 3"]
    for row in rows:
        lines.append(f"{row['scheme']:32s} " + " ".join(f"{str(a):>10}" for a in row["acceptance"])
                     + "   " + ", ".join(str(t) for t in row["tv"]))
        ok &= not (row["lossless"] and any(row["tv"]))
    lines.append("k: candidates per position; the last two schemes are wrong: their pitfall entries above show each "
                 "on a pair where it bites")
    return "\n".join(lines), ok
