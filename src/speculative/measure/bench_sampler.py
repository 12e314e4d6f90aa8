"""The sampler benchmark (``bench sampler``): the batched rejection sampler against the plain per-row
reference, timed side by side on the same inputs.

Explained in: notebooks/04_transforms.

:func:`bench_sampler` returns a record (:mod:`speculative.measure.records`) of raw observations: each
candidate's seconds per (batch, vocabulary), timed alternately by :func:`time_side_by_side` so that drift
hits both alike; its summary, ``results``, is :func:`analysis.analyse` of them.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional

import torch
from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

from speculative.engine.timing import environment, synchronize
from speculative.measure.analysis import analyse
from speculative.measure.records import SCHEMA_VERSION
from speculative.measure.settings import SamplerSettings, _positive_int, _settings
from speculative.sampling.sampler import draw_randomness, reference_rejection_sample, rejection_sample

__all__ = ["time_side_by_side", "bench_sampler"]


def time_side_by_side(runs: dict[str, Callable[[], object]], repeats: int, device: str = "cpu") -> dict[str, list]:
    """Return each candidate's timed seconds, running the candidates alternately so drift hits them alike.

    Each candidate runs once as a warm-up, then ``repeats`` times, interleaved with the others.
    """
    _positive_int("repeats", repeats)
    for run in runs.values():
        run()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


def bench_sampler(settings: Optional[SamplerSettings] = None, *, progress: bool = True, **overrides) -> dict:
    """Return a record comparing the batched sampler with the plain per-row reference, per (batch, vocab).

    Both get the same inputs (random p and q, drafts from q) and fresh randomness drawn from one generator
    each call; the reference always runs on the CPU. Its summary: verified positions per second (batch *
    k per call, median of the interleaved repeats) for each, and the ratio batched / reference.
    """
    s = _settings(SamplerSettings, settings, overrides)
    k, device = s.k, s.device
    observations = []
    generator = torch.Generator(device=device).manual_seed(s.seed)
    cpu_generator = torch.Generator().manual_seed(s.seed)
    points = [(b, v) for b in s.batches for v in s.vocabs]
    for batch, vocab in tqdm(points, desc="sampler bench", disable=not progress, file=sys.stderr):
        target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=cpu_generator) * 3, dim=-1)
        draft = torch.softmax(torch.randn(batch, k, vocab, generator=cpu_generator) * 3, dim=-1)
        drafts = torch.multinomial(draft.reshape(-1, vocab), 1, generator=cpu_generator).reshape(batch, k)
        on_device = [t.to(device) for t in (drafts, draft, target)]
        inputs = (drafts, draft, target)
        seconds = time_side_by_side({
            "batched": lambda on_device=on_device: rejection_sample(*on_device, generator),
            "reference": lambda inputs=inputs, batch=batch: reference_rejection_sample(
                *inputs, draw_randomness(batch, k, cpu_generator)),
        }, repeats=s.repeats, device=device)
        observations.append({"batch": batch, "vocab": vocab, "k": k, "seconds": seconds})
    record = {"schema": SCHEMA_VERSION, "benchmark": "sampler",
              "what": "rejection_sample (vectorised over batch and positions) vs reference_rejection_sample "
                      "(plain Python, row by row), same inputs, medians of interleaved runs",
              "environment": environment(device, probe=True), "config": {"k": k, "repeats": s.repeats, "seed": s.seed},
              "observations": observations}
    record["results"] = analyse(record)
    return record
