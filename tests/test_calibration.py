"""The decode benchmark's calibration spread through its timed runs, with whole decoding calls on held-out
prompts: where its rounds go, how the analysis pools them, and what a record keeps."""

import json
import statistics

import pytest

from speculative.measure.analysis_decode import pooled_calibration
from speculative.measure.bench_decode import _calibration_schedule


@pytest.mark.parametrize("rounds, slots", [(1, 1), (2, 1), (5, 4), (5, 32), (6, 2), (9, 3), (3, 64)])
def test_the_schedule_spends_every_round_and_puts_half_first(rounds, slots):
    first, later = _calibration_schedule(rounds, slots)
    assert first + sum(later.values()) == rounds
    assert first == (rounds + 1) // 2  # the policy decides by these: never fewer than half
    assert all(0 <= slot < slots for slot in later)
    if slots > 1:
        assert all(slot >= 1 for slot in later)  # later rounds come after some timed runs


def test_the_later_rounds_are_spread_through_the_runs():
    first, later = _calibration_schedule(5, 32)
    assert (first, sorted(later)) == (3, [11, 21])  # thirds of the 32 slots, not bunched at the start


def test_pooled_calibration_takes_the_median_of_all_rounds():
    a = {"rule": "token", "drafts": 1, "before_slot": 0, "repeats": 2,
         "rounds": {"plain": [1.0, 2.0], "draft": [0.1, 0.2]}, "seconds": {"plain": 1.5, "draft": 0.15}}
    b = {"rule": "token", "drafts": 1, "before_slot": 3, "repeats": 1,
         "rounds": {"plain": [9.0], "draft": [0.3]}, "seconds": {"plain": 9.0, "draft": 0.3}}
    pooled = pooled_calibration([a, b])
    assert pooled["seconds"] == {"plain": statistics.median([1.0, 2.0, 9.0]), "draft": 0.2}
    assert pooled["repeats"] == 3 and pooled["rule"] == "token" and "before_slot" not in pooled
    assert pooled_calibration([a]) is a


def test_bench_decode_calibrates_through_the_runs_and_decodes_held_out_prompts(tiny_pair_dir, tmp_path):
    from speculative.cli import main

    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--pair", str(tiny_pair_dir), "--gamma", "2", "--temperature", "1",
                 "--batch", "1", "--prompts", "2", "--max-new-tokens", "8", "--repeats", "2", "--no-progress",
                 "--calibration-repeats", "3", "--drafts", "1,2", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    slots = {(c["rule"], c["drafts"]): [] for c in record["calibrations"]}
    for c in record["calibrations"]:
        slots[(c["rule"], c["drafts"])].append((c["before_slot"], c["repeats"]))
        assert "plain_decoded" in c["seconds"] and "block_decoded_2" in c["seconds"]
    # each decoder's calibration: two rounds before the first of the four timed slots, one before slot 2
    assert slots == {key: [(0, 2), (2, 1)] for key in [("token", 1), ("chains", 1), ("chains", 2)]}
    rows = record["results"]
    assert {(r["rule"], r["drafts"]) for r in rows} == set(slots)
    for r in rows:
        assert r["efficiency_decoded"] == pytest.approx(r["speedup"] / r["predicted_decoded"])
        assert r["predicted_decoded"] > 0


def _ar_rows(rho, rows=32, length=40, seed=1):
    """Rows of 0..4 accepted counts whose time order carries lag-1 correlation rho (0: independent)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        x = [rng.normal()]
        for _ in range(length - 1):
            x.append(rho * x[-1] + np.sqrt(1 - rho**2) * rng.normal())
        out.append(np.clip(np.round(np.array(x) + 2), 0, 4))
    return out


def test_the_permutation_test_removes_the_short_row_bias_and_finds_planted_clustering():
    from speculative.measure.analysis_decode import lag1_autocorrelation, lag1_permutation_test

    independent = _ar_rows(0.0)
    raw, pairs = lag1_autocorrelation(independent, within_row=True)
    found = lag1_permutation_test(independent, permutations=500)
    assert found["null_mean"] < -0.01  # the within-row estimate is biased low for rows of 40
    assert found["p"] > 0.05 and abs(found["z"]) < 3 and found["r"] == raw
    clustered = lag1_permutation_test(_ar_rows(0.3), permutations=500)
    assert clustered["p"] == 1 / 501 and clustered["z"] > 3
