"""Draft lengths chosen on the fly (speculative.engine.policy): exact proofs that past-only policies keep the
target's law, the exact counterexample of a policy that peeks at the target, and the policies in the engine.

The exact tests enumerate every branch with Fractions (no sampling, no false alarms): a policy keeps the
law when the law of the first n emitted tokens equals the target's exactly. The engine's sampled law tests
are in test_engine_law.py.
"""

from fractions import Fraction

import pytest
import torch

from speculative.audit.pitfalls import find
from speculative.engine.decode import plain_decode, speculative_decode
from speculative.engine.pair import load_pair
from speculative.engine.policy import (
    ConfidenceStop,
    CostModelPolicy,
    DraftPolicy,
    FixedLength,
    HeuristicSchedule,
    expected_tokens,
    make_policy,
)
from speculative.exact.exact import (
    RandomTableModel,
    adaptive_block_law,
    adaptive_sequence_law,
    law_total_variation,
    shared_batch_law,
    speculative_sequence_law,
    target_sequence_law,
    verify_drafts_law,
)
from speculative.exact.pitfall_laws import SEED_P, SEED_Q, PeekAtTargetLength
from speculative.sampling.transforms import SamplingConfig


class EveryHistory(DraftPolicy):
    """A test policy that uses all a lawful policy may: its length is a function of the whole list of past
    outcomes, and it stops after any drafted token whose q is a fraction with an even denominator."""

    name = "history"
    max_gamma = 4

    def start(self):
        return ()

    def length(self, state):
        return 1 + (sum(a * (i + 1) for i, (a, _) in enumerate(state)) + len(state)) % 4

    def stop_after(self, q):
        return isinstance(q, Fraction) and q.denominator % 2 == 0

    def update(self, state, accepted, full):
        return state + ((accepted, full),)


LAWFUL = [FixedLength(2), HeuristicSchedule(start_gamma=1, max_gamma=4), ConfidenceStop(threshold=0.4, max_gamma=4),
          CostModelPolicy(c=0.3, v={1: 1.1, 4: 1.5}, max_gamma=4), EveryHistory()]


@pytest.mark.parametrize("policy", LAWFUL, ids=lambda p: p.name)
@pytest.mark.parametrize("seed", range(4))
def test_a_policy_that_looks_only_at_the_past_keeps_the_target_law_exactly(policy, seed):
    target, draft = RandomTableModel(3, seed), RandomTableModel(3, 100 + seed)
    for n_tokens in (1, 2, 3, 4):
        assert adaptive_sequence_law(target, draft, (0,), n_tokens, policy) == target_sequence_law(target, (0,),
                                                                                                    n_tokens)


@pytest.mark.parametrize("policy", LAWFUL, ids=lambda p: p.name)
@pytest.mark.parametrize("seed", range(4))
def test_the_same_policies_keep_the_law_under_block_verification(policy, seed):
    # each block verified by block verification (Sun et al.) at the length the policy chose, a confidence
    # stop ending the chain early: not covered by Sun et al.'s proof (fixed lengths), shown here exactly
    target, draft = RandomTableModel(3, seed), RandomTableModel(3, 100 + seed)
    for n_tokens in (1, 2, 3):
        assert adaptive_sequence_law(target, draft, (0,), n_tokens, policy, rule="block") == target_sequence_law(
            target, (0,), n_tokens)


def test_a_confidence_stop_really_changes_the_block_verification_law():
    # the check above is not vacuous: the stop changes what one block emits, and how many tokens
    from speculative.exact.exact import block_verification_law, expected_length

    stop = ConfidenceStop(threshold=0.4, max_gamma=3).stop_after
    changed = 0
    for seed in range(4):
        target, draft = RandomTableModel(3, seed), RandomTableModel(3, 100 + seed)
        stopped = block_verification_law(target, draft, (0,), 3, stop)
        whole = block_verification_law(target, draft, (0,), 3)
        changed += stopped != whole and expected_length(stopped) < expected_length(whole)
    assert changed >= 2


def test_the_block_rule_enumeration_refuses_a_peek_and_an_unknown_rule():
    target, draft = RandomTableModel(3, 0), RandomTableModel(3, 100)
    with pytest.raises(ValueError, match="peeks at the target"):
        adaptive_sequence_law(target, draft, (0,), 2, PeekAtTargetLength(2), rule="block")
    with pytest.raises(ValueError, match="unknown verification rule"):
        adaptive_sequence_law(target, draft, (0,), 2, FixedLength(2), rule="tree")


def test_the_lawful_policies_really_vary_the_length():
    # the proof above is not about constant lengths in disguise: each adaptive policy's blocks differ
    target, draft = RandomTableModel(3, 0), RandomTableModel(3, 100)
    for policy in LAWFUL[1:]:
        states = {s for (_, s) in adaptive_block_law(target, draft, (0,), policy)}
        lengths = {policy.length(s) for s in states} | {policy.length(policy.start())}
        stops = policy.stop_after(Fraction(1, 4))
        assert len(lengths) > 1 or stops, policy.describe()


def test_a_fixed_policy_is_the_fixed_block_rule():
    target, draft = RandomTableModel(3, 7), RandomTableModel(3, 107)
    assert adaptive_sequence_law(target, draft, (1,), 4, FixedLength(3)) == speculative_sequence_law(
        target, draft, (1,), 3, 4)


@pytest.mark.parametrize("seed", range(3))
def test_peeking_at_the_target_to_choose_what_to_verify_breaks_the_law(seed):
    target, draft = RandomTableModel(3, seed), RandomTableModel(3, 100 + seed)
    laws = [adaptive_sequence_law(target, draft, (0,), n, PeekAtTargetLength(2)) for n in (2, 3)]
    refs = [target_sequence_law(target, (0,), n) for n in (2, 3)]
    assert max(law_total_variation(a, b) for a, b in zip(laws, refs)) > Fraction(1, 100)


def test_the_counterexample_law_on_the_seed_pair():
    # one position, p = (1/2, 3/10, 1/5), q = (1/5, 1/2, 3/10), threshold 1/4: token 2 is never verified
    law = find("peek_target_length").exact_law()
    assert law == [Fraction(11, 20), Fraction(39, 100), Fraction(3, 50), Fraction(0)]
    assert sum(abs(a - b) for a, b in zip(law, list(SEED_P) + [0])) / 2 == Fraction(7, 50)
    # and the same law from the block enumeration of whole sequences, at one token
    block = adaptive_sequence_law(lambda c: list(SEED_P), lambda c: list(SEED_Q), (), 1, PeekAtTargetLength(1))
    assert [block[(x,)] for x in range(3)] == law[:3]


@pytest.fixture(scope="module")
def pair():
    return load_pair()


@pytest.mark.parametrize("name", ["fixed", "heuristic", "confidence", "auto"])
@pytest.mark.parametrize("batch, per_row", [(1, False), (3, False), (3, True)])
def test_every_policy_decodes_greedily_as_plain_decoding(pair, name, batch, per_row):
    prompts = [pair.prompts[0], pair.prompts[1][:60], pair.prompts[2]][:batch]
    policy = make_policy(name, gamma=4, calibration={"c": 0.1, "v": {1: 1.3, 4: 1.4, 8: 1.6}})
    out = speculative_decode(pair.target, pair.draft, prompts, 48, policy, SamplingConfig(temperature=0.0),
                             per_row=per_row)
    assert out.tokens == plain_decode(pair.target, prompts, 48, SamplingConfig(temperature=0.0)).tokens
    sizes = torch.cat([s[s >= 0] for s in out.lengths])
    assert 1 <= int(sizes.min()) and int(sizes.max()) <= policy.max_gamma
    if name != "fixed":
        assert len(set(sizes.tolist())) > 1  # the length really changed from block to block or row to row
    assert 0 < out.acceptance_rate() <= 1


def test_the_heuristic_follows_its_rule_block_by_block(pair):
    out = speculative_decode(pair.target, pair.draft, [pair.prompts[3]], 64, HeuristicSchedule(4, 12),
                             SamplingConfig(temperature=1.0), torch.Generator().manual_seed(2))
    sizes = [int(s[0]) for s in out.lengths]
    accepted = [int(a[0]) for a in out.accepted]
    assert sizes[0] == 4
    for k, a, following in zip(sizes, accepted, sizes[1:]):
        assert following == (min(12, k + 2) if a == k else max(1, k - 1))


def test_the_cost_model_policy_fits_noisy_verification_costs_non_decreasing():
    from speculative.engine.policy import isotonic

    assert isotonic([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert isotonic([1.5, 1.71, 1.51, 1.38]) == pytest.approx([1.5] + [(1.71 + 1.51 + 1.38) / 3] * 3)
    noisy = {1: 1.50, 2: 1.71, 3: 1.51, 4: 1.38, 5: 1.35, 6: 1.46, 7: 1.43, 8: 1.53}  # a calibration seen here
    policy = CostModelPolicy(c=0.1, v=noisy, max_gamma=8)
    fitted = [policy.v_fitted[k] for k in range(1, 9)]
    assert all(a <= b for a, b in zip(fitted, fitted[1:]))
    assert sum(fitted) == pytest.approx(sum(noisy.values()))  # a least-squares fit keeps the mean
    # what the fit prevents: with the raw costs, a row at alpha 0.5 picks the length where the timing
    # dipped (4, at 1.38 against 1.50 for one draft); with the fit, the length the cost model gives (3)
    raw = [expected_tokens(0.5, k) / (k * 0.1 + noisy[k]) for k in range(1, 9)]
    assert 1 + raw.index(max(raw)) == 4
    assert policy.length((0.5e6, 1e6)) == 3  # alpha 0.5 (the prior's weight is negligible)


def test_the_cost_model_policy_prices_no_verification_below_a_plain_step():
    cheap = {1: 0.79, 2: 0.9, 4: 1.4, 8: 1.9}  # v(1) as one run on another CPU timed it
    assert CostModelPolicy(c=0.1, v=cheap).v_fitted == {1: 1.0, 2: 1.0, 4: 1.4, 8: 1.9}
    assert CostModelPolicy(c=0.1, v=cheap, v_floor=0).v_fitted == cheap  # already non-decreasing
    assert CostModelPolicy(c=0.1, v=cheap, v_floor=2).v_fitted == dict.fromkeys(cheap, 2.0)
    with pytest.raises(ValueError, match="v_floor must be a finite number >= 0"):
        CostModelPolicy(c=0.1, v=cheap, v_floor=float("nan"))


def test_the_cost_model_policy_drafts_longer_when_drafts_are_accepted():
    policy = CostModelPolicy(c=0.1, v={1: 1.2, 8: 1.6}, max_gamma=8)
    often, rarely = (40.0, 40.0), (2.0, 40.0)
    assert policy.length(often) > policy.length(rarely)
    assert policy.length(often) == 8 and policy.length(rarely) == 1


class _Broken(DraftPolicy):
    max_gamma = 4

    def length(self, state):
        return 5


def test_bad_policies_and_settings_fail_with_one_line(pair):
    with pytest.raises(ValueError, match="draft lengths \\[5\\]; each must be an integer in \\[1, 4\\]"):
        speculative_decode(pair.target, pair.draft, [pair.prompts[0]], 8, _Broken())
    with pytest.raises(ValueError, match="pass either rule"):
        speculative_decode(pair.target, pair.draft, [pair.prompts[0]], 8, FixedLength(2), rule="block",
                           sampler=lambda *a, **k: None)
    with pytest.raises(ValueError, match="integer >= 1 or a draft-length policy"):
        speculative_decode(pair.target, pair.draft, [pair.prompts[0]], 8, "auto")
    with pytest.raises(ValueError, match="per_row=True .* the sampler must take lengths="):
        speculative_decode(pair.target, pair.draft, [pair.prompts[0]], 8, FixedLength(2), per_row=True,
                           sampler=lambda drafts, draft_probs, target_probs, generator, check_values=True: None)
    with pytest.raises(ValueError, match="needs a calibration"):
        make_policy("auto")
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("best")
    with pytest.raises(ValueError, match="v must map"):
        CostModelPolicy(c=0.1, v={})
    with pytest.raises(ValueError, match="exceeds max_gamma"):
        HeuristicSchedule(start_gamma=9, max_gamma=8)


def test_a_noisy_calibration_falls_back_to_the_verification_timed_alone():
    """On tiny models a block can time faster than its draft steps (CI saw v(7) = -0.28): the loop's v is
    then unmeasurable, so v_alone stands in, is listed, and the cost model still builds."""
    from speculative.measure.costs import calibration_costs, step_costs

    seconds = {"plain": 2.0, "draft": 1.0, "block_1": 3.0, "block_2": 1.9, "verify_1": 2.2, "verify_2": 2.4}
    costs = step_costs(seconds, [1, 2], seconds["plain"])
    assert costs["c"] == 0.5 and costs["v"] == {1: 1.0, 2: 1.2} and costs["v_from_alone"] == [2]
    assert costs["v_alone"] == {1: 1.1, 2: 1.2}
    rebased = calibration_costs({"seconds": seconds}, 4.0)
    assert rebased["v"] == {1: 0.5, 2: 0.6} and rebased["v_from_alone"] == [2]
    assert make_policy("auto", calibration=costs, max_gamma=2).length((0.0, 0.0)) in (1, 2)


def test_length_prices_price_the_fixed_lengths_and_a_clairvoyant_rule():
    from speculative.measure.costs import length_prices

    def row(gamma, predicted, v, runs, **extra):
        return {"batch": 1, "temperature": 1.0, "gamma": gamma, "rule": "token", "drafts": 1, "predicted": predicted,
                "calibration": {"c": 0.1, "v": v}, "accepted_per_block": runs, "speedup": predicted / 2,
                "speedup_ci95": [predicted / 3, predicted], "efficiency": 0.5, **extra}

    record = {"results": [row(1, 1.1, 1.2, [[0, 1]]), row(3, 1.3, 1.6, [[0, 1, 3, -1], [2, 3]]),
                          row(3, 9.0, 1.6, [[3]], batch=4), row("auto", 9.0, 1.5, [[3]]),
                          row(2, 9.0, 1.4, [[2]], drafts=2)]}
    out = length_prices(record, 1.0)
    assert out["fixed"] == {1: 1.1, 3: 1.3} and out["best_fixed"] == 3 and out["longest_gamma"] == 3
    # runs 0, 1, 3, 2, 3 from the longest gamma: a plain step; 1 draft at 0.1 + v(1) = 1.2; 3 drafts at
    # 0.3 + 1.6 (the cap, twice); 2 drafts at 0.2 + v(2), interpolated between v(1) and v(3) to 1.4
    assert out["clairvoyant"] == pytest.approx((1 + 2 + 4 + 3 + 4) / (1 + 1.3 + 1.9 + 1.6 + 1.9))
    assert out["clairvoyant_blocks"] == 5 and out["clairvoyant_skipped"] == 0.2 and out["clairvoyant_capped"] == 0.4
    assert out["speedup"] == {1: 0.55, 3: 0.65} and out["speedup_ci95"][3] == [1.3 / 3, 1.3]
    assert out["efficiency"] == {1: 0.5, 3: 0.5} and out["v"] == {1: 1.2, 3: 1.6} and out["c"] == 0.1
    with pytest.raises(ValueError, match="no fixed-gamma rows at batch 2"):
        length_prices(record, 1.0, batch=2)


# ---------------------------------------------------------------------------------------------------------
# the command line: --gamma auto, and the policies in the race


def test_bench_decode_gamma_auto_records_the_policy(tiny_pair_dir, tmp_path):
    import json

    from speculative.cli import main

    out = tmp_path / "auto.json"
    # batch 1 only (test_records' fresh record runs the cost model at batch 2 too): a calibration per point
    assert main(["bench", "decode", "--pair", str(tiny_pair_dir), "--gamma", "2,auto", "--temperature", "0,1",
                 "--batch", "1", "--prompts", "2", "--max-new-tokens", "12", "--repeats", "1", "--no-progress",
                 "--rule", "token,block", "--calibration-repeats", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    rows = record["results"]
    assert record["config"]["calibration_repeats"] == 1  # the flag reached the benchmark
    auto = [r for r in rows if r["gamma"] == "auto"]
    assert sorted(r["rule"] for r in auto) == ["block"] * 2 + ["token"] * 2  # the cost model under either rule
    assert all(1 <= r["mean_gamma"] <= 8 and r["predicted"] > 0 for r in auto)
    assert all(r["v_isolated"] is None for r in auto) and all(r["v_isolated"] > 0 for r in rows if r["gamma"] == 2)


def test_bench_decode_prices_auto_with_the_costs_the_policy_chose_by(tiny_pair_dir, tmp_path, monkeypatch):
    """The auto row's prediction prices its blocks with the calibration's non-decreasing fit (what the
    policy chooses by), not the raw timings: a calibration made to time v(2) falsely cheap shows which."""
    import json

    import speculative.measure.bench_decode as bench_decode
    from speculative.cli import main
    from speculative.measure.costs import calibration_costs, interpolated

    real, raw = bench_decode.calibrate_steps, {}

    def noisy(*args, **kwargs):  # v(1) timed below a plain step and v(2) at a tenth of it: the fit pools
        measured = real(*args, **kwargs)  # them, and the floor raises the pool to a plain step
        seconds, v1 = dict(measured["seconds"]), 0.8
        seconds["block_1"] = seconds["draft"] + seconds["plain"] * v1
        seconds["block_2"] = 2 * seconds["draft"] + seconds["plain"] * v1 / 10
        calibration = calibration_costs({"seconds": seconds, "rounds": {}, "repeats": 1})
        raw.update(calibration["v"])
        assert raw[2] == pytest.approx(raw[1] / 10)
        return calibration

    monkeypatch.setattr(bench_decode, "calibrate_steps", noisy)  # where bench decode looks it up
    out = tmp_path / "auto.json"
    assert main(["bench", "decode", "--pair", str(tiny_pair_dir), "--gamma", "auto", "--temperature", "1",
                 "--batch", "1", "--prompts", "2", "--max-new-tokens", "12", "--repeats", "1", "--no-progress",
                 "--calibration-repeats", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    (row,) = record["results"]
    fitted = {int(k): x for k, x in row["calibration"]["v_fitted"].items()}
    assert record["config"]["auto_v_floor"] == 1.0
    assert fitted[1] == fitted[2] == 1.0  # pooled (to 0.44), then raised to a plain step
    assert all(a <= b for a, b in zip(list(fitted.values()), list(fitted.values())[1:]))
    counts = {int(k): n for k, n in row["block_lengths"].items()}
    priced = sum(n * interpolated(fitted, k) for k, n in counts.items()) / sum(counts.values())
    assert row["calibration"]["v"] == pytest.approx(priced, rel=1e-12)
    # the blocks' lengths make the two pricings differ: this test would see the raw costs used instead
    by_raw = sum(n * interpolated(raw, k) for k, n in counts.items()) / sum(counts.values())
    assert abs(by_raw - priced) > 1e-6 * priced
    assert row["mean_gamma"] == pytest.approx(sum(k * n for k, n in counts.items()) / sum(counts.values()))
    assert row["predicted"] == pytest.approx(
        row["tokens_per_target_forward"] / (row["mean_gamma"] * row["calibration"]["c"] + priced))
    # a record made before the floor was recorded is re-analysed with the fit its run chose by: no floor
    from speculative.measure.analysis import analyse

    del record["config"]["auto_v_floor"]
    (before,) = analyse(record)
    unfloored = {int(k): x for k, x in before["calibration"]["v_fitted"].items()}
    assert unfloored[1] == unfloored[2] == pytest.approx((raw[1] + raw[2]) / 2) and unfloored[1] < 1


@pytest.mark.parametrize("argv, message", [
    (["bench", "peer", "--policies", "best"], "policies must be distinct names among fixed, heuristic, confidence, "
                                              "auto"),
    (["bench", "peer", "--policies", "auto+tree"], "the only suffix is +block"),
    (["bench", "peer", "--policies", "auto,auto+"], "the only suffix is +block"),
])
def test_bad_policy_settings_exit_2_with_one_line(argv, message, capsys, tmp_path):
    from speculative.cli import main

    try:
        code = main([*argv, "--no-progress", "--out", str(tmp_path / "r.json")])
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_bench_peer_races_every_policy(tmp_path):
    import json

    from speculative.cli import main

    out = tmp_path / "peer.json"
    assert main(["bench", "peer", "--prompts", "2", "--max-new-tokens", "8", "--repeats", "1", "--temperature", "1",
                 "--schedules", "fixed", "--policies", "fixed,heuristic,confidence,auto,auto+block", "--no-progress",
                 "--calibration-repeats", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    rows = record["results"]
    assert record["config"]["calibration_repeats"] == 1 and {c["repeats"] for c in record["calibrations"]} == {1}
    assert sorted(r["policy"] for r in rows) == ["auto", "auto+block", "confidence", "fixed", "heuristic"]
    assert [r["rule"] for r in rows if r["policy"] == "auto+block"] == ["block"]
    for row in rows:  # the cost model's rows keep its calibration, the fit it chose by included
        if row["policy"].startswith("auto"):
            calibration = row["calibration"]
            fitted = [calibration["v_fitted"][k] for k in sorted(calibration["v_fitted"], key=int)]
            assert calibration["rule"] == row["rule"] and calibration["c"] > 0 and len(fitted) == 8, calibration
            assert all(a <= b for a, b in zip(fitted, fitted[1:]))
        else:
            assert "calibration" not in row
    assert all(r["rule"] == "token" for r in rows if r["policy"] != "auto+block")
    for row in rows:
        low, high = row["ours_over_hf_assisted_ci95"]
        assert low <= row["ours_over_hf_assisted"] <= high and row["ours_tokens_per_s"] > 0
        assert row["ours_over_hf_assisted"] == pytest.approx(sum(row["seconds_per_prompt"]["hf_fixed"])
                                                             / sum(row["seconds_per_prompt"]["ours"]))
    assert len({r["ours_tokens_per_s"] for r in rows}) == 5  # five decoders, not one reported five times


def test_the_race_decodes_a_block_policy_by_block_verification(pair):
    # bench peer's decoder for "auto+block" really runs the block rule: the same seed gives the block rule's
    # tokens, not the token-wise rule's
    from speculative.measure.bench_peer import _peer_decoders
    from speculative.measure.settings import PeerSettings, split_policy

    config = SamplingConfig(temperature=1.0)
    policy = make_policy("heuristic", gamma=4, max_gamma=8)
    generator = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    settings = PeerSettings(policies=("heuristic+block",))
    (decoder,) = [d for d in _peer_decoders(pair, settings, config, 5, {"heuristic+block": policy}, models={})
                  if d.name == "ours_heuristic_block"]
    raced = decoder.run(list(pair.prompts[4]), 48).tokens[0]
    prompt = [pair.prompts[4]]
    block = speculative_decode(pair.target, pair.draft, prompt, 48, policy, config, generator(), rule="block")
    token = speculative_decode(pair.target, pair.draft, prompt, 48, policy, config, generator())
    assert raced == block.tokens[0] and raced != token.tokens[0]
    with pytest.raises(ValueError, match="unknown verification rule 'tree'"):
        split_policy("auto+tree")


def test_under_block_verification_each_row_is_verified_at_its_own_length(pair):
    # rows of one batch with different lengths: none accepts more drafts than it asked for, though the
    # batch drafted up to the longest (the sampler's lengths=, not the padded block, decides)
    policy = make_policy("heuristic", gamma=2, max_gamma=8)
    prompts = [pair.prompts[0], pair.prompts[5], pair.prompts[9], pair.prompts[12]]
    out = speculative_decode(pair.target, pair.draft, prompts, 64, policy, SamplingConfig(temperature=1.0),
                             torch.Generator().manual_seed(3), rule="block", per_row=True)
    mixed = [s for s in out.lengths if len(set(s[s >= 0].tolist())) > 1]
    assert mixed  # some block had rows of different lengths
    assert all(bool((a[s >= 0] <= s[s >= 0]).all()) for a, s in zip(out.accepted, out.lengths))
    assert any(bool((a[s >= 0] == s[s >= 0]).any()) for a, s in zip(out.accepted, out.lengths))


class _LongOnceDone(DraftPolicy):
    """One draft while a row is short of ``done`` tokens, ``max_gamma`` once it has them all."""

    max_gamma = 8

    def __init__(self, done: int):
        self.done = done

    def start(self):
        return 0

    def length(self, state):
        return self.max_gamma if state >= self.done else 1

    def update(self, state, accepted, full):
        return state + accepted + 1  # the tokens the row emitted


def test_a_finished_row_does_not_lengthen_the_batchs_block(pair):
    # rows that finished ride along until half the batch is done; what their policy would ask for must
    # not set the block's length: here every decoding row asks for 1 draft and every finished one for 8,
    # so each block must draft exactly once (one draft forward per target forward)
    prompts = [pair.prompts[i] for i in (0, 5, 9, 12)]
    rode_along = 0
    for seed in range(6):
        for per_row in (False, True):
            out = speculative_decode(pair.target, pair.draft, prompts, 24, _LongOnceDone(24),
                                     SamplingConfig(temperature=1.0), torch.Generator().manual_seed(seed),
                                     per_row=per_row)
            rode_along += any(0 < int((a < 0).sum()) < len(prompts) / 2 for a in out.accepted)
            assert out.draft_forwards == out.target_forwards
    assert rode_along >= 3  # a finished row rode along in several of these runs


def test_the_cost_model_chooses_a_shared_block_for_the_whole_batch():
    # rows sharing a block share its cost: the length maximises their summed expected tokens per unit time
    policy = CostModelPolicy(c=0.1, v={1: 1.2, 8: 1.6}, max_gamma=8)
    often, rarely = (40.0, 40.0), (2.0, 40.0)
    assert policy.batch_length([often]) == policy.length(often) == 8
    assert policy.batch_length([rarely]) == policy.length(rarely) == 1
    middling = (30.0, 40.0)  # alpha 0.75
    for states in ([often, rarely], [often, rarely, rarely], [middling, rarely], [middling] * 2 + [rarely]):
        alphas = [policy.alpha(state) for state in states]
        cost = {k: 0.1 * k + 1.2 + 0.4 * (k - 1) / 7 for k in range(1, 9)}  # v interpolated from 1.2 to 1.6
        rate = {k: sum(expected_tokens(a, k) for a in alphas) / cost[k] for k in cost}
        assert policy.batch_length(states) == max(rate, key=rate.get)
    # not the longest any row asks for: a row at alpha 0.75 alone drafts more than it does beside a poor row
    assert 1 < policy.batch_length([middling, rarely]) < policy.length(middling)
    assert HeuristicSchedule(2, 8).batch_length([2, 5, 3]) == 5  # the others: the longest any row asks for


def test_a_batch_shares_each_block_and_every_row_verifies_all_of_it(pair):
    # the default: each block's length comes from all decoding rows, and every row may accept all of it;
    # per_row=True keeps each row's own length (a row never accepts more than it asked for)
    policy = make_policy("heuristic", gamma=2, max_gamma=8)
    prompts = [pair.prompts[0], pair.prompts[5], pair.prompts[9], pair.prompts[12]]
    config, seed = SamplingConfig(temperature=1.0), 3
    shared = speculative_decode(pair.target, pair.draft, prompts, 64, policy, config,
                                torch.Generator().manual_seed(seed))
    for a, s in zip(shared.accepted, shared.lengths):
        decoding = s >= 0
        assert len(set(s[decoding].tolist())) == 1 and bool((a[decoding] <= s[decoding]).all())
    # the heuristic's rows drift apart, so a shared block is longer than some rows would have asked for;
    # those rows then accept past their own length in some block
    own = [HeuristicSchedule(2, 8).start() for _ in prompts]
    longer = 0
    for a, s in zip(shared.accepted, shared.lengths):
        for row, (accepted, size) in enumerate(zip(a.tolist(), s.tolist())):
            if size >= 0:
                longer += accepted > HeuristicSchedule(2, 8).length(own[row])
                own[row] = HeuristicSchedule(2, 8).update(own[row], accepted, accepted == size)
    assert longer > 0
    per_row = speculative_decode(pair.target, pair.draft, prompts, 64, policy, config,
                                 torch.Generator().manual_seed(seed), per_row=True)
    assert any(len(set(s[s >= 0].tolist())) > 1 for s in per_row.lengths)


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("seed", range(3))
def test_rows_sharing_blocks_keep_the_target_law_jointly(rule, seed, monkeypatch):
    # two rows decoded as one batch whose rows share each block (the engine's default): the block's length
    # comes from both rows' states, a confidence stop ends drafting only when both rows have stopped, and
    # each row verifies every draft. Exactly, the two outputs are independent draws from the target's law.
    target, draft = RandomTableModel(2, seed), RandomTableModel(2, seed + 50)
    law = target_sequence_law(target, (0,), 3)
    product = {(a, b): law[a] * law[b] for a in law for b in law}
    for policy in (ConfidenceStop(threshold=Fraction(1, 2), max_gamma=3), HeuristicSchedule(1, 3),
                   CostModelPolicy(c=0.1, v={1: 1.2, 3: 1.3}, max_gamma=3, prior_weight=1.0)):
        joint = shared_batch_law(target, draft, (0,), 3, policy, rows=2, rule=rule)
        assert law_total_variation(joint, product) == 0, (policy.describe(), rule)
    # not vacuous: some shared block of the confidence stop ended early, both rows having stopped
    import speculative.exact.exact as exact

    verified, real = [], exact.verify_drafts_law
    monkeypatch.setattr(exact, "verify_drafts_law", lambda *a: verified.append(len(a[3])) or real(*a))
    shared_batch_law(target, draft, (0,), 3, ConfidenceStop(threshold=Fraction(1, 2), max_gamma=3), rows=2, rule=rule)
    assert 0 < min(verified) < 3 == max(verified)


def test_verifying_given_drafts_sums_to_the_block_laws():
    # verify_drafts_law, averaged over the drafts' own probabilities, is the fixed-length block law
    from speculative.exact.exact import block_verification_law, speculative_block_law

    target, draft = RandomTableModel(3, 1), RandomTableModel(3, 51)
    for rule, reference in (("token", speculative_block_law), ("block", block_verification_law)):
        mixed = {}
        for x in range(3):
            for y in range(3):
                chance = draft((0,))[x] * draft((0, x))[y]
                if chance == 0:  # never drafted
                    continue
                for tokens, p in verify_drafts_law(target, draft, (0,), (x, y), rule).items():
                    mixed[tokens] = mixed.get(tokens, 0) + chance * p
        assert law_total_variation(mixed, reference(target, draft, (0,), 2)) == 0
    with pytest.raises(ValueError, match="unknown verification rule 'tree'"):
        verify_drafts_law(target, draft, (0,), (1,), "tree")
