"""``gpu-report`` tested as far as a CPU allows.

What this proves: every step of the report runs on the shipped pair and writes a record of the current
schema that re-analyses to its own summary; the public pair's step skips in one line when its checkpoints
are not on disk (they never are here: nothing is downloaded); the budget guard skips steps once the
time is spent; the command refuses CUDA on a machine without it (exit 2, one line); the sync counter
counts what torch's debug mode reports. What it does not prove: anything about a GPU. The CUDA sync count
and the public pair's race have not run here; ``count_cuda_syncs`` is tested through a stand-in for
torch's warning, and the race through ``test_hf.py``'s tiny checkpoints.
"""

import json
import warnings

import pytest
import torch

from speculative.cli import main
from speculative.measure import analysis, gpu_report
from speculative.measure.records import SCHEMA_VERSION


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_report")
    lines = []
    names = {"target": str(out / "no-such-target"), "draft": str(out / "no-such-draft")}
    outcome = gpu_report.gpu_report(device="cpu", out_dir=out, names=names, say=lines.append)
    return out, outcome, lines


def test_every_cpu_step_writes_a_record_that_reanalyses_to_its_summary(report):
    out, outcome, lines = report
    assert sorted(p.name for p in out.glob("*.json")) == ["decode_cpu_smoke.json", "prices_cpu_smoke.json",
                                                          "sampler_cpu_smoke.json", "syncs_cpu_smoke.json"]
    for path in out.glob("*.json"):
        record = json.loads(path.read_text())
        assert record["schema"] == SCHEMA_VERSION and record["observations"], path.name
        again = json.loads(json.dumps(analysis.analyse(record)))  # as it reads back from JSON (NaN included)
        assert json.dumps(again, sort_keys=True) == json.dumps(record["results"], sort_keys=True), path.name
        assert record["environment"]["host_probe"]["softmax_ms"] > 0
    assert [line.split(":")[0] for line in lines] == ["sampler", "decode", "syncs", "prices", "public",
                                                        "gpu-report"]


def test_the_public_pair_is_skipped_in_one_line_when_it_is_not_on_disk(report):
    _, outcome, lines = report
    assert outcome["public"].startswith("skipped: the target ") and "is not on this disk" in outcome["public"]
    assert sum("public" in line for line in lines) == 1


def test_the_syncs_record_counts_the_loops_reads_per_block(report):
    out, _, _ = report
    record = json.loads((out / "syncs_cpu_smoke.json").read_text())
    assert [(r["batch"], r["temperature"]) for r in record["results"]] == [(1, 1.0), (2, 1.0)]
    for row in record["results"]:
        assert row["cuda_syncs_per_block"] is None  # no CUDA here: not counted, and not reported as 0
        # the engine's promise (tests/test_host_reads.py): at most two reads per block
        assert 0 < row["host_reads_per_block"] <= 2 and row["blocks"] >= 16 // 5


def test_a_spent_budget_skips_the_steps_not_yet_started(tmp_path, monkeypatch):
    # a fake clock that moves 50 s at every reading: with a budget of 250 s the first two steps start (at
    # 50 s and 200 s) and the third, due at 350 s, is skipped
    clock = iter(range(0, 10_000, 50))  # every reading of the clock is 50 s after the one before
    monkeypatch.setattr(gpu_report, "_clock", lambda: next(clock))
    monkeypatch.setattr(gpu_report, "_steps", lambda pair, sizes, device, names: [
        (name, lambda name=name: {"benchmark": name}) for name in ("sampler", "decode", "syncs")])
    monkeypatch.setattr("speculative.measure.records.write_record", lambda record, path: path)
    outcome = gpu_report.gpu_report(device="cpu", out_dir=tmp_path, budget_s=250, say=lambda line: None,
                                    names={"target": "x", "draft": "y"})
    assert [outcome[s].split()[0] for s in ("sampler", "decode", "syncs")] == ["written", "written", "skipped:"]
    assert outcome["syncs"].startswith("skipped: the budget of 250 s was spent (350 s)")


def test_the_command_refuses_cuda_without_a_gpu_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")  # never on the machines the suite runs on (no GPU there)
    assert main(["gpu-report"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device here" in err
    assert main(["gpu-report", "--device", "tpu"]) == 2
    assert "unknown device 'tpu'" in capsys.readouterr().err


def test_the_sync_counter_counts_torchs_warnings_and_restores_the_mode(monkeypatch):
    # a stand-in for a CUDA build: the debug mode's warning, raised by the code being counted
    mode = {"now": 0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode["now"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: mode.update(now=m))

    def run():
        assert mode["now"] == "warn"
        for _ in range(3):
            warnings.warn(gpu_report.SYNC_WARNING + " (Triggered internally at CUDAFunctions.cpp)", UserWarning,
                          stacklevel=2)
        warnings.warn("Synchronization debug mode is a prototype feature", UserWarning, stacklevel=2)  # no sync
        return "done"

    assert gpu_report.count_cuda_syncs(run) == ("done", 3)
    assert mode["now"] == 0


def test_the_public_pair_runs_in_a_dtype_the_device_has(monkeypatch):
    assert gpu_report.public_dtype("cpu") is torch.float32
    for supported, dtype in ((True, torch.bfloat16), (False, torch.float16)):  # an A100 or H100; a T4
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda s=supported: s)
        assert gpu_report.public_dtype("cuda") is dtype
