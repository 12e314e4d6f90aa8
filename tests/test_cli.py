"""The command line and the benchmark: they run, print and record. They are not timed tests."""

import json

import pytest

from speculative.cli import main
from speculative.engine.pair import load_pair
from speculative.measure.report import DECODE_LEGEND, SAMPLER_LEGEND


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
    probe = record["environment"]["host_probe"]  # the machine's state as the run ended
    assert probe["softmax_ms"] > 0 and probe["first_touch_gib_per_s"] > 0
    assert [(r["batch"], r["vocab"]) for r in record["results"]] == [(2, 16), (2, 32)]
    for row in record["results"]:
        assert row["speedup"] == pytest.approx(row["batched_positions_per_s"] / row["reference_positions_per_s"])
    assert SAMPLER_LEGEND in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "sampler", "--batch", "0"], "batches must be integers >= 1, got [0]"),
        (["bench", "sampler", "--vocab", "x"], "comma-separated integers"),
        (["bench", "sampler", "--device", "tpu"], "unknown device"),
        (["bench", "decode", "--rule", "tree"], "unknown verification rule 'tree'"),
        (["bench", "decode", "--rule", "block,block"], "rules must name each verification rule once"),
        (["bench", "decode", "--runs", "0"], "integer >= 1"),
        (["audit", "speculative.sampling.sampler:block_verify_sample", "--rule", "tree"], "invalid choice"),
        (["bench", "nothing"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_with_a_message(argv, message, capsys):
    try:  # argparse refuses what it cannot parse; the settings refuse what they cannot run
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_bench_decode_runs_keeps_each_run_and_prints_their_range(tiny_pair_dir, tmp_path, capsys):
    out = tmp_path / "runs.json"
    assert main(["bench", "decode", "--pair", str(tiny_pair_dir), "--gamma", "2", "--temperature", "1",
                 "--batch", "1", "--prompts", "2", "--max-new-tokens", "4", "--repeats", "1", "--runs", "2",
                 "--no-progress", "--calibration-repeats", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["config"]["runs"] == 2 and [len(run["observations"]) for run in record["runs"]] == [4, 4]
    (row,) = record["results"]
    low, high = row["speedup_range"]
    assert f"{low:.2f}-{high:.2f}x" in capsys.readouterr().out  # the table's last column


def test_bench_decode_records_the_pair_and_the_prompts(tiny_pair_dir, tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--pair", str(tiny_pair_dir), "--gamma", "1,2", "--temperature", "0,1",
                 "--batch", "1,2", "--prompts", "4", "--max-new-tokens", "4", "--repeats", "2", "--no-progress",
                 "--calibration-repeats", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert len(record["pair_sha256"]) == 64 and len(record["prompts_sha256"]) == 64
    assert record["config"]["max_new_tokens"] == 4 and record["config"]["prompts"] == 4
    assert len(record["results"]) == 2 * 2 * 2
    for row in record["results"]:
        assert row["prompts"] == 4 and row["groups"] == 4 // row["batch"] and row["repeats"] == 2
        assert 0 <= row["alpha"] <= 1 and row["c"] > 0 and row["v"] > 0
        # the prediction: this run's tokens per call over the calibrated costs, no timing of this run
        calibrated = row["calibration"]
        assert row["predicted"] == pytest.approx(
            row["tokens_per_target_forward"] / (row["gamma"] * calibrated["c"] + calibrated["v"]))
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["predicted"])
        # the pooled speedup is total plain seconds over total speculative seconds; one figure per group,
        # per repeat, and an interval over groups that holds the pooled figure
        assert row["speedup"] == pytest.approx(row["plain_seconds"] / row["speculative_seconds"])
        assert len(row["speedup_per_group"]) == row["groups"] and len(row["speedup_per_repeat"]) == 2
        # each resample's pooled ratio is a weighted mean of group ratios, so the interval lies within them
        low, high = row["speedup_ci95"]
        groups = row["speedup_per_group"]
        if row["groups"] > 1:
            assert min(groups) - 1e-9 <= low <= high <= max(groups) + 1e-9
        else:
            assert low != low and high != high  # one group: no interval (NaN), not a made-up one
        assert row["c_isolated"] > 0 and row["v_isolated"] > 0
        assert row["plain_prefill_seconds"] > 0 and row["speculative_prefill_seconds"] > 0
        # speeds are of the decode phase: every repeat's new tokens over its seconds after the prefill
        assert row["plain_tokens_per_s"] == pytest.approx(row["batch"] * 4 * 2 * row["groups"] / row["plain_seconds"])
        # the in-situ decomposition: on a CPU, its share is each side's time outside its forwards
        overheads = (row["plain_seconds"] / row["plain_forward_seconds"]) / (
            row["speculative_seconds"] / row["speculative_forward_seconds"])
        assert row["in_situ_share"] == pytest.approx(overheads, rel=1e-9)
        assert row["in_situ_share"] == pytest.approx(row["speedup"] / row["decomposed_speedup"])
        assert 1 <= row["tokens_per_target_forward"] <= row["gamma"] + 1
        # a block's rows wait for the slowest, so per call a row gets no more than per active block
        # (at batch 1 the last block may emit past the length cut, which only the active mean counts)
        assert row["tokens_per_target_forward"] <= row["tokens_per_active_block"] + 1e-9
        assert 0 <= row["repeat_share_median"] <= 1 and len(row["accepted_per_block"]) == 4
    assert DECODE_LEGEND in capsys.readouterr().out


def test_repeat_share_counts_repeated_eight_grams():
    from speculative.measure.shared import repeat_share

    # 27 tokens: the 20 generated positions that end an 8-gram; the third period repeats the second (9)
    assert repeat_share(list(b"abcdefgh" * 3), list(b"xyz")) == pytest.approx(9 / 20)
    assert repeat_share(list(range(20)), [100]) == 0
    assert repeat_share(list(b"abcdefgh"), list(b"abcdefgh")) == pytest.approx(1 / 8)


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


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "decode", "--pair", "/nonexistent"], "no model pair at /nonexistent"),
        (["bench", "decode", "--gamma", "1000", "--batch", "1"], "exceeds the model's context"),
        (["bench", "decode", "--max-new-tokens", "5000", "--batch", "1"], "exceeds the model's context"),
        (["bench", "decode", "--batch", "1000"], "needs more prompts"),
        (["bench", "decode", "--drafts", "2", "--batch", "4"], "one prompt at a time"),
    ],
)
def test_bad_decode_settings_fail_at_once_with_one_line(argv, message, capsys, tmp_path):
    out = tmp_path / "record.json"
    assert main([*argv, "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()  # no record written


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "decode", "--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1, got 0"),
        (["bench", "decode", "--top-p", "1.5"], "top_p must be a number in (0, 1], got 1.5"),
        (["bench", "decode", "--temperature", "-1"], "temperatures must be finite numbers >= 0"),
        (["bench", "decode", "--runs", "x"], "expected an integer >= 1, got 'x'"),
        (["train", "--out", "x", "--target-width", "100", "--target-heads", "3"], None),
        (["train", "--out", "x", "--distill", "1"], "distill must be a number in [0, 1)"),
        (["train", "--out", "x", "--target-seconds", "0"], "target_seconds must be a number of seconds > 0"),
        (["train-draft", "--out", "x", "--candidate", "a=2x128:jsd:10"], "unknown objective 'jsd'"),
        (["train-draft", "--out", "x", "--candidate", "a=2x128"], "is not NAME=LAYERSxWIDTH:OBJECTIVE:SECONDS"),
        (["train-draft", "--out", "x", "--candidate", "a=1x8:tv:1", "--candidate", "a=1x8:kl:1"],
         "two candidates share a name"),
        (["bench", "prices", "--shapes", "2x"], "a shape is LAYERSxWIDTH, e.g. 2x128, got '2x'"),
        (["bench", "agreement", "--draft", "no-such-folder"], "no draft at no-such-folder"),
        (["bench", "drafts", "--gamma", "0"], "gammas must be integers >= 1, got [0]"),
        (["bench", "peer", "--draft", "no-such-folder"], "no draft at no-such-folder"),
        (["bench", "peer", "--pair", "no-such-folder"], "no model pair at no-such-folder"),
        (["ship-draft", "--draft", "no-such-folder", "--out", "x"], "no draft at no-such-folder"),
    ],
)
def test_bad_values_exit_2_with_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert (message or "d_model (100) must be divisible by n_head (3)") in err
    assert not (tmp_path / "x").exists()


def test_train_refuses_an_existing_folder_without_force(tmp_path, capsys):
    (tmp_path / "pair").mkdir()
    (tmp_path / "pair" / "notes.txt").write_text("mine")
    assert main(["train", "--out", str(tmp_path / "pair"), "--target-seconds", "1", "--draft-seconds", "1"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "pair" / "notes.txt").read_text() == "mine"


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from _subparsers(sub)


def test_version_and_defaults_in_every_help(capsys):
    from speculative import __version__, defaults
    from speculative.cli import build_parser

    with pytest.raises(SystemExit):
        main(["--version"])
    assert __version__ in capsys.readouterr().out
    parser = build_parser()
    commands = dict(_subparsers(parser))
    assert {"verify", "bench", "sampler", "decode", "train"} <= set(commands)
    for name, sub in commands.items():
        text = " ".join(sub.format_help().split())
        for action in sub._actions:  # every option that has a default says it in --help
            if action.help and action.default not in (None, False) and action.dest != "help":
                shown = ",".join(map(str, action.default)) if isinstance(action.default, list) else action.default
                assert f"(default: {action.default})" in text or f"(default: {shown})" in text, (name, action.dest)
    train_help = " ".join(commands["train"].format_help().split())
    assert f"(default: {defaults.TARGET_SECONDS})" in train_help  # and the defaults are defaults.py's


def test_the_installed_command_fails_without_a_traceback(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "speculative", "bench", "decode", "--pair", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "SHA256SUMS is missing" in done.stderr


def test_verify_prints_the_block_and_multi_draft_tables(capsys):
    assert main(["verify"]) == 0
    out = capsys.readouterr().out
    # Sun et al.'s gamma = 2 values, computed by the enumeration (the paper states 10/9 and 11/9)
    assert "    2         10/9         11/9" in out
    assert "top_k_threshold" in out and "without_replacement_unadjusted   (9/20, 9/20, 1/10, 0)" in out


def test_bench_decode_races_rules_and_chains(tiny_pair_dir, tmp_path, capsys):
    from speculative.measure.compare import compare_variants

    out = tmp_path / "rules.json"
    assert main(["bench", "decode", "--pair", str(tiny_pair_dir), "--gamma", "2", "--temperature", "0,1",
                 "--batch", "1", "--prompts", "3", "--max-new-tokens", "6", "--repeats", "1", "--rule", "token,block",
                 "--drafts", "1,2", "--no-progress", "--calibration-repeats", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["config"]["rules"] == ["token", "block"] and record["config"]["drafts"] == [1, 2]
    variants = sorted((r["temperature"], r["rule"], r["drafts"]) for r in record["results"])
    assert variants == sorted((t, rule, k) for t in (0.0, 1.0) for rule, k in (("token", 1), ("block", 1),
                                                                                  ("chains", 1), ("chains", 2)))
    for row in record["results"]:
        assert len(row["target_calls_per_group"]) == 3 and sum(row["target_calls_per_group"]) > 0
    # one chain in the multi-draft loop makes the same target calls as the single-chain loop (same seeds)
    single = compare_variants(record, ("token", 1), ("chains", 1))
    assert [c["tokens_per_call_ratio"] for c in single if c["temperature"] == 0] == [1.0]
    for other in (("block", 1), ("chains", 2)):
        compared = compare_variants(record, ("token", 1), other)
        assert len(compared) == 2
        for c in compared:
            ratio = c["other_tokens_per_call"] / c["baseline_tokens_per_call"]
            assert c["tokens_per_call_ratio"] == pytest.approx(ratio)
            low, high = c["tokens_per_call_ratio_ci95"]
            assert low <= c["tokens_per_call_ratio"] + 1e-9 and c["tokens_per_call_ratio"] - 1e-9 <= high
    greedy = compare_variants(record, ("token", 1), ("block", 1))
    assert [c["tokens_per_call_ratio"] for c in greedy if c["temperature"] == 0] == [1.0]
    assert "block" in capsys.readouterr().out


def test_ship_draft_writes_a_pair_with_the_candidates_draft(tiny_pair_dir, tmp_path, capsys):
    import torch

    from speculative.engine.model import GPT, GPTConfig
    from speculative.measure.drafts import save_draft

    torch.manual_seed(5)
    save_draft(tmp_path / "wide", GPT(GPTConfig(context=32, n_layer=1, n_head=2, d_model=16)),
               load_pair(tiny_pair_dir), {"name": "wide"})
    argv = ["ship-draft", "--pair", str(tiny_pair_dir), "--draft", str(tmp_path / "wide"), "--out",
            str(tmp_path / "new"), "--keep-old", str(tmp_path / "old")]
    assert main(argv) == 0
    shipped = load_pair(tmp_path / "new")
    assert f"pair written to {tmp_path / 'new'} (sha256 {shipped.sha256})" in capsys.readouterr().out
    assert shipped.draft.config.d_model == 16 and shipped.info["replaced"][0]["kept_as"] == str(tmp_path / "old")
    assert main(argv) == 2 and "already exists" in capsys.readouterr().err  # no silent overwrite


def test_bench_drafts_races_a_candidate_beside_the_pairs_own_draft(tiny_pair_dir, tmp_path, capsys):
    import torch

    from speculative.engine.model import GPT, GPTConfig
    from speculative.measure.drafts import save_draft

    torch.manual_seed(4)
    save_draft(tmp_path / "wide", GPT(GPTConfig(context=32, n_layer=1, n_head=2, d_model=16)),
               load_pair(tiny_pair_dir), {"name": "wide"})
    out = tmp_path / "race.json"
    assert main(["bench", "drafts", "--pair", str(tiny_pair_dir), "--draft", str(tmp_path / "wide"), "--gamma", "2",
                 "--temperature", "1", "--prompts", "2", "--max-new-tokens", "6", "--runs", "2",
                 "--calibration-repeats", "1", "--no-progress", "--no-profile", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert list(record["drafts"]) == ["shipped", "wide"] and record["config"]["runs"] == 2
    assert all(run["profiles"] == [] for run in record["runs"])
    # the calibration also decoded a prompt the race did not (the third of four) and predicts from it:
    # tokens per call x plain decoding's seconds per token / a decoded block's seconds
    for row in record["results"]:
        for run, alone in zip(row["runs"], record["runs"]):
            (raw,) = [c for c in alone["calibrations"] if c["draft"] == row["draft"]]
            seconds = raw["seconds"]
            assert len(raw["rounds"]["block_decoded_2"]) == 1 and seconds["plain_decoded"] > 0
            expected = run["tokens_per_target_forward"] * seconds["plain_decoded"] / seconds["block_decoded_2"]
            assert run["predicted_decoded"] == pytest.approx(expected)
            assert run["efficiency_decoded"] == pytest.approx(run["speedup"] / expected)
    printed = capsys.readouterr().out
    assert "speedup per run" in printed and "wide" in printed
    assert main(["bench", "drafts", "--pair", str(tiny_pair_dir), "--draft", str(tmp_path / "wide"), "--draft",
                 str(tmp_path / "wide")]) == 2
    assert "two drafts are named 'wide'" in capsys.readouterr().err
