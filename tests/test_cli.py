"""The command line and the benchmark: they run, print and record. They are not timed tests."""

import json

import pytest

from speculative.__main__ import main


def test_verify_prints_the_seed_example_and_every_pitfall(capsys):
    assert main(["verify"]) == 0
    out = capsys.readouterr().out
    assert "-> output (1/2, 3/10, 1/5)" in out
    assert "resample_from_target" in out and "(7/20, 39/100, 13/50, 0)" in out


def test_bench_sampler_records_what_it_ran_on(tmp_path, capsys):
    path = tmp_path / "sampler.json"
    assert main(["bench", "sampler", "--batch", "2", "--vocab", "16,32", "--repeats", "1", "--no-progress",
                 "--out", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["environment"]["device"] == "cpu"
    assert {"torch", "threads", "cpu", "python", "date_utc"} <= set(record["environment"])
    assert [(r["batch"], r["vocab"]) for r in record["results"]] == [(2, 16), (2, 32)]
    for row in record["results"]:
        assert row["speedup"] == pytest.approx(row["batched_positions_per_s"] / row["reference_positions_per_s"])
    assert "ratio" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "sampler", "--batch", "0"], "integers >= 1"),
        (["bench", "sampler", "--vocab", "x"], "comma-separated integers"),
        (["bench", "sampler", "--device", "tpu"], "unknown device"),
        (["bench", "nothing"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
