"""Doors to serving engines, in the engine audit's ``"models"`` convention (:mod:`engine_cases`).

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
    # the shell may be gone while a child it started is still dying: return once the group is empty
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _group_alive(process.pid):
        time.sleep(0.05)


def _group_alive(group: int) -> bool:
    """Whether a process of ``group`` is still running (zombies, which hold no resources, do not count)."""
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = open(f"/proc/{entry.name}/stat").read().rsplit(")", 1)[1].split()
                if int(fields[2]) == group and fields[0] != "Z":
                    return True
    return False


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
