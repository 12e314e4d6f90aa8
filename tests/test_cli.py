"""The command line and the benchmark: they run, print and record. They are not timed tests."""

import json

import pytest

from speculative.__main__ import main
from speculative.pair import load_pair


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


def test_bench_decode_records_the_pair_and_the_prompts(tiny_pair_dir, tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--pair", str(tiny_pair_dir), "--gamma", "1,2", "--temperature", "0,1",
                 "--batch", "1,2", "--max-new-tokens", "4", "--repeats", "1", "--no-progress",
                 "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert len(record["pair_sha256"]) == 64 and len(record["prompts_sha256"]) == 64
    assert record["config"]["max_new_tokens"] == 4
    assert len(record["results"]) == 2 * 2 * 2
    for row in record["results"]:
        assert 0 <= row["alpha"] <= 1 and row["c"] > 0 and row["v"] > 0
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["predicted_refined"])
        assert row["tokens_per_target_forward"] == pytest.approx(4 / row["blocks"])
        assert row["c_isolated"] > 0 and row["v_isolated"] > 0
        assert row["plain_prefill_seconds"] > 0 and row["speculative_prefill_seconds"] > 0
        # speeds are of the decode phase: every repeat's new tokens over its seconds after the prefill
        assert row["plain_tokens_per_s"] == pytest.approx(row["batch"] * 4 * 1 / row["plain_seconds"])
        # on a CPU the forwards are timed in the timed runs, and the efficiency is each side's share of
        # time outside its forwards: (plain total / plain forwards) / (speculative total / its forwards)
        overheads = (row["plain_seconds"] / row["plain_forward_seconds"]) / (
            row["speculative_seconds"] / row["speculative_forward_seconds"])
        assert row["efficiency"] == pytest.approx(overheads, rel=1e-9)
        assert 1 <= row["tokens_per_target_forward"] <= row["gamma"] + 1
        # a block's rows wait for the slowest, so per call a row gets no more than per active block
        # (at batch 1 the last block may emit past the length cut, which only the active mean counts)
        assert row["tokens_per_target_forward"] <= row["tokens_per_active_block"] + 1e-9
    assert "speedup" in capsys.readouterr().out


def test_train_writes_a_pair_and_can_restart_its_draft(tmp_path, tiny_pair_dir, capsys):
    shapes = ["--context", "64", "--target-layers", "1", "--target-width", "32", "--target-heads", "2",
              "--draft-layers", "1", "--draft-width", "16", "--draft-heads", "2", "--no-progress"]
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["train", "--out", str(first), "--target-seconds", "1", "--draft-seconds", "1", *shapes]) == 0
    assert load_pair(first).info["draft_parameters"] > 0
    assert main(["train", "--out", str(second), "--target-seconds", "1", "--draft-seconds", "1",
                 "--draft-init", str(first), *shapes]) == 0
    log = json.loads((second / "train_log.json").read_text())["draft"]
    assert log["initialised_from_trained_weights"] is True
    assert log["initial"]["pair_sha256"] == load_pair(first).sha256
    # --reuse-target keeps the first pair's target, its weights and its log, and trains only a draft
    third = tmp_path / "third"
    assert main(["train", "--out", str(third), "--draft-seconds", "1", "--reuse-target", str(first), *shapes]) == 0
    assert (third / "target.safetensors").read_bytes() == (first / "target.safetensors").read_bytes()
    assert json.loads((third / "train_log.json").read_text())["target"]["pair_sha256"] == load_pair(first).sha256
    # a draft trained on another corpus (the tiny test pair records none) is refused by name
    code = main(["train", "--out", str(tmp_path / "fourth"), "--target-seconds", "1", "--draft-seconds", "1",
                 "--draft-init", str(tiny_pair_dir), *shapes])
    assert code == 2 and "different corpus" in capsys.readouterr().err
    assert not (tmp_path / "fourth").exists()  # nothing half written
