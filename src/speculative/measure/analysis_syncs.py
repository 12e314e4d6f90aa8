"""Analysis of a syncs record (the GPU report's :func:`speculative.measure.gpu_report.measure_syncs`): how often
one speculative decoding call waits for the device, per block.

Pure: it reads the counts the record keeps, and counts nothing.
"""

from __future__ import annotations

from speculative.measure.rows import SyncsRow

__all__ = ["syncs_rows"]


def syncs_rows(record: dict) -> list[SyncsRow]:
    """Per batch and temperature: the CUDA syncs and the host reads per block (target call)."""
    rows = []
    for o in record["observations"]:
        syncs = o["cuda_syncs"]
        rows.append(SyncsRow(batch=o["batch"], temperature=o["temperature"], gamma=o["gamma"], blocks=o["blocks"],
                             cuda_syncs_per_block=None if syncs is None else syncs / o["blocks"],
                             host_reads_per_block=o["host_reads"] / o["blocks"]))
    return rows
