"""Clocks that know the device: synchronisation, wall-clock marks, forward timers, the environment record.

Explained in: notebooks/08_decoding_demo (what the benchmark times) and notebooks/07_cost_model.

Decoding never times itself. ``plain_decode`` and ``speculative_decode`` take a ``clock`` argument (None
by default) and only tell it where they are: :meth:`Clock.start`, :meth:`Clock.mark` after the prefill
and at the end, and :meth:`Clock.wrap` around each model so that a clock built with
``forwards=True`` adds up the seconds spent inside each model's forward calls. On CUDA every mark and
every timed forward synchronises the device first, so the numbers are the GPU's, not the launch queue's;
a run that times its forwards therefore loses some overlap, and the benchmark measures speed in runs
that do not.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

__all__ = ["synchronize", "Clock", "NO_CLOCK", "environment", "host_probe", "median_call_seconds", "HOST_READS",
           "count_host_reads"]

#: The Tensor methods that bring a value back to the host; on CUDA each waits for the device's queued work.
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")


@contextmanager
def count_host_reads() -> Iterator[dict]:
    """Yield a dict whose ``"reads"`` entry counts calls of :data:`HOST_READS` made inside the block.

    It patches those ``torch.Tensor`` methods for the duration (one thread at a time, please). It counts
    calls from Python, on any device; a read made inside a C++ kernel (indexing with a boolean mask, say)
    is not seen, so code that wants few reads avoids those by construction.
    """
    counter = {"reads": 0}
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counted(method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            counter["reads"] += 1
            return method(*args, **kwargs)
        return call

    for name, method in saved.items():
        setattr(torch.Tensor, name, counted(method))
    try:
        yield counter
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def synchronize(device) -> None:
    """Wait until ``device`` has finished its queued work (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Seconds of one run: marks since :meth:`start`, and (``forwards=True``) seconds inside each model's calls."""

    def __init__(self, device="cpu", forwards: bool = False):
        self.device = torch.device(device)
        self.forwards = forwards
        self.marks: dict[str, float] = {}
        self.seconds: dict[str, float] = {}  # per wrapped model name: seconds inside its calls
        self.calls: dict[str, int] = {}
        self._began = None

    def start(self) -> None:
        synchronize(self.device)
        self.marks, self.seconds, self.calls = {}, {}, {}
        self._began = time.perf_counter()

    def mark(self, name: str) -> None:
        """Record the seconds since :meth:`start` under ``name``, after the device has caught up."""
        if self._began is None:
            raise RuntimeError("Clock.mark before Clock.start")
        synchronize(self.device)
        self.marks[name] = time.perf_counter() - self._began

    def wrap(self, model: Callable, name: str) -> Callable:
        """Return ``model`` itself, or with ``forwards=True`` a callable that times each of its calls."""
        if not self.forwards:
            return model
        self.seconds.setdefault(name, 0.0)
        self.calls.setdefault(name, 0)

        def call(*args, **kwargs):
            synchronize(self.device)
            began = time.perf_counter()
            out = model(*args, **kwargs)
            synchronize(self.device)
            self.seconds[name] += time.perf_counter() - began
            self.calls[name] += 1
            return out

        return call


class _NoClock(Clock):
    """The clock decoding uses when given none: it records nothing and never synchronises."""

    def start(self) -> None:
        pass

    def mark(self, name: str) -> None:
        pass


#: Passed by default: decoding calls it unconditionally, and it costs nothing.
NO_CLOCK = _NoClock()


def median_call_seconds(call: Callable[[], object], min_run_time: float = 0.2) -> float:
    """Return the median seconds of one ``call()``, measured by ``torch.utils.benchmark.Timer``.

    The timer warms up, synchronises CUDA around its blocks of calls, and runs at the process's thread
    count (its own default is one thread, which would time another machine).
    """
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_probe(repeats: int = 3) -> dict:
    """Return two quick measurements of the host as it is now, for a record's ``environment``: the median
    milliseconds of a float32 softmax over 64 x 5 x 32,000 values (what ``bench sampler``'s largest point
    computes) and the rate, in GiB/s, at which fresh memory is written for the first time (page faults).

    The same virtual machine can run many times slower from one day to the next (on the 2-core machine
    this book is built on, ``bench sampler``'s largest point verified 41,124 positions/s on 2026-11-29 and
    1,772 on 2026-12-01, with the same code); the probe lets a reader tell such a run from a change in the
    code. It takes about 0.2 s.
    """
    x = torch.randn(64, 5, 32_000, generator=torch.Generator().manual_seed(0))
    softmax = []
    for _ in range(repeats):
        began = time.perf_counter()
        torch.softmax(x, dim=-1)
        softmax.append(time.perf_counter() - began)
    size = 64 * 2**20
    began = time.perf_counter()
    torch.ones(size // 4, dtype=torch.float32)  # fresh pages: the allocator asks the OS for them
    touched = time.perf_counter() - began
    return {"softmax_ms": 1000 * sorted(softmax)[len(softmax) // 2],
            "first_touch_gib_per_s": size / 2**30 / touched}


def code_commit() -> Optional[str]:
    """Return the git commit the library's source runs from ("<sha>", with "+changes" when tracked files
    differ from it), or None when this file is not tracked by a git checkout (an installed wheel, a copied
    tree) or git is missing."""
    import subprocess

    here = Path(__file__).resolve()

    def git(*args):
        return subprocess.run(["git", "-C", str(here.parent), *args], capture_output=True, text=True, timeout=10)

    try:
        if git("ls-files", "--error-unmatch", here.name).returncode != 0:
            return None
        sha = git("rev-parse", "HEAD")
        changes = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    if sha.returncode != 0:
        return None
    return sha.stdout.strip() + ("+changes" if changes.stdout.strip() else "")


def environment(device="cpu", probe: bool = False) -> dict:
    """Return what a measurement ran on: device, accelerator name, library and torch versions, threads, CPU,
    Python, OS, the code's git commit (:func:`code_commit`); with ``probe``, also :func:`host_probe` (the
    benchmarks' records carry it)."""
    device = str(device)
    from speculative import __version__

    info = {
        "device": device,
        "speculative": __version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code_commit": code_commit(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["accelerator"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    if probe:
        info["host_probe"] = host_probe()
    return info
