"""``python -m speculative gpu-report``: the book's GPU evidence in one command, on one GPU.

Explained in: notebooks/08_decoding_demo (its GPU section).

It measures, step by step, and writes each step's record (:mod:`speculative.measure.records`) into ``out_dir``
(default ``results/``) as soon as the step ends:

1. ``sampler_gpu.json``: :func:`bench_sampler.bench_sampler`, the batched sampler against the per-row reference.
2. ``decode_gpu.json``: :func:`bench_decode.bench_decode` on the shipped pair: plain decoding against each fixed
   draft length, greedy and sampled, at two batch sizes.
3. ``syncs_gpu.json``: the host synchronisations of one speculative decoding call per batch size and
   temperature, per block, counted twice: by ``torch.cuda.set_sync_debug_mode("warn")`` (the waits the
   device reported) and by :func:`timing.count_host_reads` (the reads the Python code asked for). The
   CPU has no such mode; a CPU run records ``cuda_syncs`` as null.
4. ``prices_gpu.json``: :func:`drafts.prices_record`, the forwards' price list: the target over 1-9
   positions and random drafts of several shapes over one (the cost side of "which draft?").
5. ``peer_public_gpu.json`` and ``decode_public_gpu.json``: :func:`bench_peer.race_public_pair` on
   :func:`hf.public_pair_names`, in bfloat16 where the GPU supports it and float16 otherwise (a free T4
   has no bfloat16). Only when both checkpoints are already on disk: it never downloads, and otherwise
   says so in one line and skips.

The sizes (:data:`defaults.GPU_REPORT`) were chosen to fit the whole report in about 8 minutes on one GPU;
that has not been measured yet. ``budget_s`` is a guard, not an estimate: a step that would start after
the budget is spent is skipped with one line, so a report on a slow or shared GPU ends near its budget
(a step already running finishes). On a CPU (``device="cpu"``, for the offline test in
``tests/test_gpu_report.py``) every step runs at the smoke sizes (:data:`defaults.GPU_REPORT_SMOKE`) and
its records are named ``*_cpu_smoke.json``, so that a test never overwrites a committed record.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from speculative import defaults
from speculative.defaults import setting
from speculative.engine.pair import check_device

__all__ = ["gpu_report", "count_cuda_syncs", "measure_syncs", "public_dtype"]

SYNC_WARNING = "called a synchronizing CUDA operation"  # what torch's "warn" mode says at each sync
_clock = time.perf_counter  # the report's clock (a test replaces it)


def public_dtype(device: str) -> torch.dtype:
    """Return the dtype the public pair runs in on ``device``: bfloat16 where the GPU supports it, float16
    on other GPUs (a T4), float32 on a CPU."""
    if not str(device).startswith("cuda"):
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def count_cuda_syncs(run: Callable[[], object]) -> tuple[object, Optional[int]]:
    """Return ``run()`` and the synchronising CUDA operations it made, as counted by torch's sync debug
    mode (``None`` without CUDA). The mode is process-wide; it is restored afterwards."""
    if not torch.cuda.is_available():
        return run(), None
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = run()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return result, sum(SYNC_WARNING in str(w.message) for w in caught)


def measure_syncs(pair, batches, temperatures, gamma: int, max_new_tokens: int, seed: int = 0) -> dict:
    """Return a ``syncs`` record: for each batch size and temperature, one warm-up call and one counted call
    of :func:`decode.speculative_decode` at draft length ``gamma``, with its blocks (target calls), the
    CUDA syncs (:func:`count_cuda_syncs`) and the host reads (:func:`timing.count_host_reads`)."""
    from speculative.engine.decode import speculative_decode
    from speculative.engine.timing import count_host_reads, environment
    from speculative.measure.analysis import analyse
    from speculative.measure.records import SCHEMA_VERSION
    from speculative.sampling.transforms import SamplingConfig

    observations = []
    for batch in batches:
        prompts = pair.prompts[:batch]
        for temperature in temperatures:
            config = SamplingConfig(temperature=temperature)

            def run(prompts=prompts, config=config):
                generator = torch.Generator(device=pair.target.device).manual_seed(seed)
                return speculative_decode(pair.target, pair.draft, prompts, max_new_tokens, gamma, config, generator)

            run()  # warm-up: the first call's allocations and kernel loads are not the loop's
            with count_host_reads() as reads:
                out, syncs = count_cuda_syncs(run)
            observations.append({"batch": batch, "temperature": temperature, "gamma": gamma,
                                 "blocks": len(out.accepted), "cuda_syncs": syncs, "host_reads": reads["reads"]})
    device = str(pair.target.device)
    record = {"schema": SCHEMA_VERSION, "benchmark": "syncs",
              "what": "host synchronisations of one speculative decoding call, per block: as the device "
                      "reported them (torch.cuda.set_sync_debug_mode) and as the Python code asked for them",
              "environment": environment(device, probe=True), "pair_sha256": pair.sha256,
              "config": {"batches": list(batches), "temperatures": list(temperatures), "gamma": gamma,
                         "max_new_tokens": max_new_tokens, "seed": seed},
              "observations": observations}
    record["results"] = analyse(record)
    return record


def _public_pair_on_disk(names: dict) -> Optional[str]:
    """Return None when both checkpoints load from disk alone, else one line saying which does not."""
    from transformers import AutoConfig

    for role, name in names.items():
        try:
            AutoConfig.from_pretrained(name, local_files_only=True)
        except Exception as error:  # noqa: BLE001 - any failure means: not on this disk
            return f"the {role} {name} is not on this disk ({type(error).__name__}); it is never downloaded here"
    return None


def _prices(pair, sizes: dict) -> dict:
    """The price list's record (:func:`drafts.prices_record`) with its summary."""
    from speculative.engine.decode import encode_prompts
    from speculative.measure.analysis import analyse
    from speculative.measure.drafts import prices_record

    record = prices_record(pair.target, sizes["shapes"], sizes["widths"], encode_prompts(pair.prompts[:1]),
                           repeats=sizes["repeats"], progress=False)
    record["results"] = analyse(record)
    return record


def _steps(pair, sizes: dict, device: str, names: dict) -> list[tuple[str, Callable[[], dict]]]:
    """Return the report's steps in order: (record file stem, function returning the record)."""
    from speculative.measure.bench_decode import bench_decode
    from speculative.measure.bench_peer import race_public_pair
    from speculative.measure.bench_sampler import bench_sampler

    decode, public = sizes["decode"], sizes["public"]
    steps = [("sampler", lambda: bench_sampler(device=device, progress=False, **sizes["sampler"])),
             ("decode", lambda: bench_decode(pair, progress=False, **decode)),
             ("syncs", lambda: measure_syncs(pair, **sizes["syncs"])),
             ("prices", lambda: _prices(pair, sizes["prices"]))]

    def race():
        out = race_public_pair(names["target"], names["draft"], device=device, dtype=public_dtype(device),
                               prompts=[p.decode("latin-1") for p in pair.prompts[:public["prompts"]]],
                               gammas=public["gammas"], max_new_tokens=public["max_new_tokens"],
                               repeats=public["repeats"], calibration_repeats=public["calibration_repeats"])
        return {"peer_public": out["peer"], "decode_public": out["decode"]}

    steps.append(("public", race))
    return steps


@dataclass(frozen=True)
class GPUReportSettings:
    """Where ``gpu-report`` runs, where it writes, and its time budget."""

    device: str = setting("cuda", "cuda[:N]; cpu runs every step at the smoke sizes, into *_cpu_smoke.json")
    out_dir: str = setting("results", "folder for the records")
    budget: float = setting(defaults.GPU_REPORT["budget_s"], "seconds after which the steps not yet started are "
                            "skipped")

    def __post_init__(self):
        check_device(self.device, available=False)  # no CUDA here is gpu_report's own one-line error
        if not 0 < self.budget < math.inf:
            raise ValueError(f"budget must be a number of seconds > 0, got {self.budget!r}")


def gpu_report(device: str = "cuda", out_dir="results", budget_s: float = defaults.GPU_REPORT["budget_s"],
               names: Optional[dict] = None, say: Callable[[str], None] = print) -> dict:
    """Run the report's steps on ``device`` and write their records into ``out_dir``; return
    ``{step: "written <files>" | "skipped: <why>"}``. A ValueError when ``device`` is CUDA and there is none."""
    from speculative.engine.hf import public_pair_names
    from speculative.engine.pair import load_pair
    from speculative.measure.records import write_record

    on_cuda = str(device).startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        raise ValueError("no CUDA device here (torch.cuda.is_available() is False): gpu-report measures a GPU; "
                         "pass --device cpu to run its steps at the smoke sizes on this CPU")
    sizes, suffix = (defaults.GPU_REPORT, "gpu") if on_cuda else (defaults.GPU_REPORT_SMOKE, "cpu_smoke")
    names = names or public_pair_names()
    pair = load_pair(device=device)
    began, outcome = _clock(), {}
    for stem, step in _steps(pair, sizes, device, names):
        spent = _clock() - began
        missing = _public_pair_on_disk(names) if stem == "public" else None
        if spent > budget_s or missing:
            outcome[stem] = f"skipped: {missing or f'the budget of {budget_s:.0f} s was spent ({spent:.0f} s)'}"
            say(f"{stem}: {outcome[stem]}")
            continue
        step_began = _clock()
        made = step()
        made = made if stem == "public" else {stem: made}
        files = [write_record(record, Path(out_dir) / f"{name}_{suffix}.json") for name, record in made.items()]
        outcome[stem] = "written " + ", ".join(str(f) for f in files)
        say(f"{stem}: {outcome[stem]} ({_clock() - step_began:.0f} s)")
    say(f"gpu-report: {_clock() - began:.0f} s in all on {device}")
    return outcome
