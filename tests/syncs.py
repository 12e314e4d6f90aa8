"""Count host reads: every call of a Tensor method that brings a value back to the host."""

import functools
from contextlib import contextmanager

import torch

#: The Tensor methods that read a value back (on CUDA each one waits for the device's queued work).
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")


@contextmanager
def counting_host_reads():
    """Yield a dict whose "reads" entry counts calls of :data:`HOST_READS` inside the block."""
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
