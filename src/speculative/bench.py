"""Benchmarks: measured side by side in one run, reported as ratios, recorded with what they ran on.

Explained in: notebooks/04_transforms (the sampler benchmark).

A benchmark here is never a timed test: it measures, prints and writes a JSON record. Every record
carries :func:`environment` (device, torch version, thread count, CPU, Python), so a reader can tell what
a number was measured on.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from .sampler import draw_randomness, reference_rejection_sample, rejection_sample

__all__ = ["environment", "time_side_by_side", "bench_sampler", "write_record"]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str = "cpu") -> dict:
    """Return what a measurement ran on: device, accelerator name, torch, threads, CPU, Python, OS."""
    info = {
        "device": device,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["accelerator"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    return info


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_side_by_side(runs: dict[str, Callable[[], object]], repeats: int, device: str = "cpu") -> dict[str, dict]:
    """Return per-run timing statistics, running the candidates alternately so drift hits them alike.

    Each candidate runs once as a warm-up, then ``repeats`` times, interleaved with the others.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for run in runs.values():
        run()
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {
        name: {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "repeats": len(ts)}
        for name, ts in times.items()
    }


def bench_sampler(
    batches: Iterable[int] = (1, 64),
    vocabs: Iterable[int] = (256, 32000),
    k: int = 4,
    repeats: int = 5,
    seed: int = 0,
    device: str = "cpu",
    progress: bool = True,
) -> dict:
    """Return a record comparing the batched sampler with the plain per-row reference, per (batch, vocab).

    Both get the same inputs (random p and q, drafts from q) and fresh randomness drawn from one generator
    each call; the reference always runs on the CPU. Reported: verified positions per second (batch * k
    per call) for each, and the ratio batched / reference.
    """
    from tqdm.auto import tqdm

    points = [(b, v) for b in batches for v in vocabs]
    rows = []
    generator = torch.Generator(device=device).manual_seed(seed)
    cpu_generator = torch.Generator().manual_seed(seed)
    for batch, vocab in tqdm(points, desc="sampler bench", disable=not progress, file=sys.stderr):
        target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=cpu_generator) * 3, dim=-1)
        draft = torch.softmax(torch.randn(batch, k, vocab, generator=cpu_generator) * 3, dim=-1)
        drafts = torch.multinomial(draft.reshape(-1, vocab), 1, generator=cpu_generator).reshape(batch, k)
        on_device = [t.to(device) for t in (drafts, draft, target)]
        timings = time_side_by_side(
            {
                "batched": lambda: rejection_sample(*on_device, generator),
                "reference": lambda: reference_rejection_sample(drafts, draft, target,
                                                                draw_randomness(batch, k, cpu_generator)),
            },
            repeats=repeats,
            device=device,
        )
        positions = batch * k
        batched_rate = positions / timings["batched"]["median_s"]
        reference_rate = positions / timings["reference"]["median_s"]
        rows.append({
            "batch": batch, "k": k, "vocab": vocab,
            "batched_positions_per_s": batched_rate,
            "reference_positions_per_s": reference_rate,
            "speedup": batched_rate / reference_rate,
            "timings": timings,
        })
    return {
        "benchmark": "sampler",
        "what": "rejection_sample (vectorised over batch and positions) vs reference_rejection_sample "
                "(plain Python, row by row), same inputs, medians of interleaved runs",
        "environment": environment(device),
        "config": {"k": k, "repeats": repeats, "seed": seed},
        "results": rows,
    }


def format_sampler_table(record: dict) -> str:
    """Return the sampler record as a plain-text table."""
    lines = [f"{'batch':>5} {'V':>6} {'batched pos/s':>14} {'reference pos/s':>16} {'ratio':>7}"]
    for row in record["results"]:
        lines.append(f"{row['batch']:>5} {row['vocab']:>6} {row['batched_positions_per_s']:>14,.0f} "
                     f"{row['reference_positions_per_s']:>16,.0f} {row['speedup']:>6.1f}x")
    env = record["environment"]
    lines.append(f"measured on {env['device']} ({env.get('accelerator', env['cpu'])}), torch {env['torch']}, "
                 f"{env['threads']} threads")
    return "\n".join(lines)


def write_record(record: dict, path: Optional[str]) -> Optional[Path]:
    """Write ``record`` as indented JSON to ``path`` (folders created); return the path, or None."""
    if not path:
        return None
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return out
