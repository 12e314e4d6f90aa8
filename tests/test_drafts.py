"""Which draft: distillation losses, candidate drafts on disk, exact alpha from forwards, prices and the race."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import TINY, save_tiny_pair
from speculative.engine.model import GPT, GPTConfig
from speculative.engine.pair import load_pair
from speculative.measure import analysis, analysis_drafts, analysis_prices
from speculative.measure.drafts import (
    acceptance_from_forwards,
    compiled,
    draft_training,
    load_draft,
    measure_agreement,
    save_draft,
    ship_draft,
    train_drafts,
    training_summary,
    with_draft,
)
from speculative.measure.ranking import draft_ranking
from speculative.sampling.transforms import SamplingConfig
from speculative.training.train import DISTILL_OBJECTIVES, distill_loss, parse_candidate


def _random_logprobs(seed, shape=(3, 5, 7)):
    return F.log_softmax(torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 2, dim=-1)


def test_the_tv_loss_is_one_minus_the_acceptance_rate():
    student_logits, teacher = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(1)), _random_logprobs(2)
    q, p = F.softmax(student_logits, -1), teacher.exp()
    alpha = torch.minimum(p, q).sum(-1).mean()  # the rule's acceptance rate, sum min(p, q), per position
    assert distill_loss(student_logits, teacher, "tv").item() == pytest.approx(1 - alpha.item(), abs=1e-6)


def test_the_kl_losses_are_the_textbook_ones_and_zero_at_the_teacher():
    student_logits, teacher = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(3)), _random_logprobs(4)
    q, p = F.log_softmax(student_logits, -1), teacher
    forward = (p.exp() * (p - q)).sum(-1).mean()  # KL(p || q), per position
    reverse = (q.exp() * (q - p)).sum(-1).mean()
    assert distill_loss(student_logits, teacher, "kl").item() == pytest.approx(forward.item(), rel=1e-5)
    assert distill_loss(student_logits, teacher, "mixed").item() == pytest.approx(0.5 * (forward + reverse).item(),
                                                                                  rel=1e-5)
    for objective in DISTILL_OBJECTIVES:
        assert distill_loss(teacher, teacher, objective).item() == pytest.approx(0, abs=1e-6)
    with pytest.raises(ValueError, match="unknown distillation objective 'jsd'"):
        distill_loss(student_logits, teacher, "jsd")


@pytest.mark.parametrize("text, problem", [("a=2x128:tv", "is not"), ("a=2x128:jsd:10", "unknown objective"),
                                           ("a=2x128:tv:10:warm", "is not"), ("=2x128:tv:10", "is not"),
                                           ("a=2x128:tv:-1", "is not"), ("a=2x128:tv:9:from=", "is not"),
                                           ("a=2x128:tv:inf", "is not"), ("../x=2x128:tv:9", "must be letters")])
def test_a_bad_candidate_is_refused_in_one_line(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_candidate(text)


def test_a_candidate_names_its_shape_loss_budget_and_start():
    assert parse_candidate("tv=2x256:tv:240:init") == {"name": "tv", "n_layer": 2, "d_model": 256, "n_head": 4,
                                                       "objective": "tv", "seconds": 240.0, "init": True}


def test_exact_alpha_is_one_for_the_target_itself_and_matches_one_position_by_hand():
    torch.manual_seed(0)
    target, draft = GPT(TINY).eval(), GPT(GPTConfig(context=32, n_layer=1, n_head=1, d_model=8)).eval()
    contexts = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(5))
    for config in (SamplingConfig(), SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.7, top_k=5)):
        assert acceptance_from_forwards(target, target, contexts, 4, config) == pytest.approx([1.0] * 3)
    # the last context's last position, by hand, through the rule's own acceptance rate
    from speculative.exact.rule import acceptance_rate

    rates = acceptance_from_forwards(target, draft, contexts[:, :5], 4, SamplingConfig())
    with torch.no_grad():
        p = F.softmax(target(contexts[2:, :4])[0, -1], -1).double().tolist()
        q = F.softmax(draft(contexts[2:, :4])[0, -1], -1).double().tolist()
    assert rates[2] == pytest.approx(float(acceptance_rate(p, q)), abs=1e-6)
    greedy = acceptance_from_forwards(target, draft, contexts, 1, SamplingConfig(temperature=0.0))
    with torch.no_grad():
        agree = (target(contexts[:, :-1]).argmax(-1) == draft(contexts[:, :-1]).argmax(-1)).double().mean(-1)
    assert greedy == pytest.approx(agree.tolist())
    with pytest.raises(ValueError, match="first must be in"):
        acceptance_from_forwards(target, draft, contexts, 12, SamplingConfig())


def test_a_candidate_draft_round_trips_and_refuses_corruption_and_another_target(tmp_path):
    save_tiny_pair(tmp_path / "pair")
    pair = load_pair(tmp_path / "pair")
    torch.manual_seed(1)
    draft = GPT(GPTConfig(context=32, n_layer=1, n_head=2, d_model=16)).eval()
    digest = save_draft(tmp_path / "d", draft, pair, {"name": "d"})
    loaded, info, again = load_draft(tmp_path / "d")
    assert again == digest and info["target_pair_sha256"] == pair.sha256
    tokens = torch.tensor([[1, 2, 3]])
    assert torch.allclose(loaded(tokens), draft.half().float()(tokens), atol=1e-4)
    swapped = with_draft(pair, tmp_path / "d")
    assert swapped.target is pair.target and swapped.draft.config == draft.config
    assert swapped.sha256 not in (pair.sha256, digest)
    with pytest.raises(FileExistsError):
        save_draft(tmp_path / "d", draft, pair, {})
    from dataclasses import replace

    save_draft(tmp_path / "elsewhere", draft, replace(pair, sha256="f" * 64), {})
    with pytest.raises(ValueError, match="distilled from pair ffffffffffff, not from this pair"):
        with_draft(pair, tmp_path / "elsewhere")
    info_path = tmp_path / "d" / "draft.json"
    record = json.loads(info_path.read_text())
    info_path.write_text(json.dumps(dict(record, target_pair_sha256="0" * 64)))
    with pytest.raises(ValueError, match="corrupt"):
        with_draft(pair, tmp_path / "d")
    with pytest.raises(FileNotFoundError, match="no draft"):
        load_draft(tmp_path / "nothing")


def test_shipping_a_candidate_replaces_only_the_draft_and_keeps_the_old_pair_reachable(tmp_path):
    save_tiny_pair(tmp_path / "pair")
    pair = load_pair(tmp_path / "pair")
    torch.manual_seed(2)
    for name in ("new", "other"):
        save_draft(tmp_path / name, GPT(GPTConfig(context=32, n_layer=1, n_head=2, d_model=16)).eval(), pair,
                   {"name": name, "train_log": {"final_validation_bpb": 7.5}})
    digest = ship_draft(pair, tmp_path / "new", tmp_path / "shipped", keep_old=tmp_path / "old")
    shipped = load_pair(tmp_path / "shipped")
    assert shipped.sha256 == digest != pair.sha256
    for name, source in (("target.safetensors", "pair"), ("prompts.json", "pair"), ("draft.safetensors", "new")):
        assert (tmp_path / "shipped" / name).read_bytes() == (tmp_path / source / name).read_bytes()  # byte for byte
    assert shipped.info["draft_validation_bpb"] == 7.5 and shipped.info["draft_config"]["d_model"] == 16
    assert shipped.info["replaced"][0]["pair_sha256"] == pair.sha256
    assert shipped.info["replaced"][0]["draft"]["draft_config"] == pair.info["draft_config"]
    log, before = (json.loads((tmp_path / folder / "train_log.json").read_text()) for folder in ("shipped", "pair"))
    assert log == dict(before, draft={"final_validation_bpb": 7.5}, replaced_drafts=[None])  # the tiny pair logs none
    # the candidates distilled from the old pair race beside the new one, the old draft among them
    old = with_draft(shipped, tmp_path / "old")
    tokens = torch.tensor([[1, 2, 3]])
    assert torch.equal(old.draft(tokens), pair.draft(tokens))
    assert not torch.equal(shipped.draft(tokens), pair.draft(tokens))
    assert with_draft(shipped, tmp_path / "other").info["base_pair_sha256"] == shipped.sha256
    # what a record keeps of the draft it raced: the shipped draft's training from pair.json, a candidate's own
    assert draft_training(pair) is None  # never shipped: the tiny pair's own draft has no candidate's log
    assert draft_training(shipped) == shipped.info["shipped_draft"]["training"] == training_summary(
        json.loads((tmp_path / "new" / "draft.json").read_text()))
    assert draft_training(with_draft(shipped, tmp_path / "other"))["validation_bpb"] == 7.5
    # the same inputs give the same pair, hash included
    assert ship_draft(pair, tmp_path / "new", tmp_path / "again", keep_old=tmp_path / "old2") != digest  # kept_as named
    assert ship_draft(pair, tmp_path / "new", tmp_path / "shipped", keep_old=tmp_path / "old", overwrite=True) == digest
    # shipping again from the new pair lists both earlier pairs; a foreign draft is refused in one line
    ship_draft(shipped, tmp_path / "other", tmp_path / "twice")
    twice = load_pair(tmp_path / "twice")
    assert [r["pair_sha256"] for r in twice.info["replaced"]] == [shipped.sha256, pair.sha256]
    with_draft(twice, tmp_path / "old")  # distilled from the first pair, whose target this still is
    save_tiny_pair(tmp_path / "foreign", seed=1)
    save_draft(tmp_path / "alien", GPT(GPTConfig(context=32, n_layer=1, n_head=2, d_model=16)).eval(),
               load_pair(tmp_path / "foreign"), {"name": "alien"})
    with pytest.raises(ValueError, match="distilled from pair .*, not from this pair"):
        ship_draft(pair, tmp_path / "alien", tmp_path / "nope")
    with pytest.raises(FileExistsError):
        ship_draft(pair, tmp_path / "new", tmp_path / "shipped")


def test_train_drafts_distils_candidates_that_load_beside_their_pair(tmp_path):
    save_tiny_pair(tmp_path / "pair")
    pair = load_pair(tmp_path / "pair")
    candidates = [parse_candidate("warm=1x8:tv:1:init"), parse_candidate("wide=1x32:mixed:1")]
    digests = train_drafts(pair, tmp_path / "out", candidates, sampled_windows=4, text_windows=4, progress=False)
    assert set(digests) == {"warm", "wide"}
    for name in digests:
        swapped = with_draft(pair, tmp_path / "out" / name)
        log = json.loads((tmp_path / "out" / name / "draft.json").read_text())["train_log"]
        assert log["steps"] >= 1 and log["train"]["objective"] == candidates[name == "wide"]["objective"]
        assert [p["source"] for p in log["distillation_data"]["parts"]] == ["text", "text"]  # context 32: no room
        assert swapped.draft.config.d_model == candidates[name == "wide"]["d_model"]
    with pytest.raises(ValueError, match="starts from a draft of shape 1x8, not 1x32"):
        train_drafts(pair, tmp_path / "bad", [parse_candidate("x=1x32:tv:1:init")], 4, 4, progress=False)
    # a candidate may start from another candidate
    again = parse_candidate(f"more=1x32:tv:1:from={tmp_path / 'out' / 'wide'}")
    train_drafts(pair, tmp_path / "next", [again], 4, 4, progress=False)
    info = json.loads((tmp_path / "next" / "more" / "draft.json").read_text())
    assert info["initial_draft_sha256"] == digests["wide"] and info["train_log"]["initialised_from_trained_weights"]
    # but not from a candidate distilled from another pair's target
    save_tiny_pair(tmp_path / "other", seed=1)
    other = load_pair(tmp_path / "other")
    assert other.sha256 != pair.sha256
    with pytest.raises(ValueError, match="distilled from pair .*, not from this pair"):
        train_drafts(other, tmp_path / "elsewhere", [again], 4, 4, progress=False)


def _prices(rounds: dict) -> dict:
    shapes = {n.split("_", 1)[1]: {"parameters": 1000} for n in rounds if n.startswith("draft_")}
    return {"benchmark": "prices", "observations": rounds, "shapes": shapes}


def test_prices_are_relative_to_a_plain_forward_and_a_cliff_is_found_only_where_every_round_shows_it():
    record = _prices({"target_1": [2.0, 2.2, 2.1], "target_2": [2.5, 2.4, 2.6], "target_3": [2.4, 2.3, 2.5],
                      "target_4": [2.6, 2.2, 2.7], "draft_2x128": [0.4, 0.44, 0.42]})
    rows = {(r["kind"], r.get("width", r.get("shape"))): r for r in analysis.analyse(record)}
    assert rows[("verification", 1)]["relative"] == 1
    assert rows[("verification", 2)]["relative"] == pytest.approx(2.5 / 2.1)
    assert rows[("draft", "2x128")]["relative"] == pytest.approx(0.42 / 2.1)
    assert rows[("draft", "2x128")]["relative_range"] == pytest.approx([0.2, 0.2])
    # width 2 costs more than width 3 in every round; width 2 against 4 only in one of three
    assert [(c["narrow"], c["wide"]) for c in analysis_prices.price_cliffs(record)] == [(2, 3)]


def test_the_ranking_prefers_the_draft_that_agrees_more_at_the_same_price_and_predicts_by_the_formula():
    prices = _prices({"target_1": [1.0], "target_2": [1.1], "target_3": [1.2], "target_4": [1.3], "target_5": [1.4],
                      "draft_2x128": [0.2]})
    shape = {"n_layer": 2, "d_model": 128}
    agreement = {"benchmark": "agreement", "drafts": {"a": {"draft_config": shape}, "b": {"draft_config": shape}},
                 "observations": [{"draft": "a", "temperature": 1.0, "rates": [0.6, 0.7, 0.65, 0.62]},
                                  {"draft": "b", "temperature": 1.0, "rates": [0.8, 0.85, 0.83, 0.9]}]}
    ranking = draft_ranking(agreement, prices, gammas=range(1, 5))
    assert [r["draft"] for r in ranking] == ["b", "a"]
    best = ranking[0]
    alpha = sum([0.8, 0.85, 0.83, 0.9]) / 4
    g = best["best_gamma"]
    expected = (1 - alpha ** (g + 1)) / (1 - alpha) / (g * 0.2 + 1.0 + 0.1 * g)
    assert best["predicted"] == pytest.approx(expected)
    assert best["predicted"] == max(best["predicted_by_gamma"].values())
    low, high = best["predicted_ci95"]
    assert low < best["predicted"] < high
    # by default every priced width is searched: widths 2..5 price gamma 1..4, the range passed above
    assert draft_ranking(agreement, prices) == ranking
    # a length whose verification width was not priced is refused, not skipped
    with pytest.raises(ValueError, match=r"gamma \[5, 6\]: the prices record priced no verification"):
        draft_ranking(agreement, prices, gammas=range(1, 7))
    with pytest.raises(ValueError, match="no verification wider than one position"):
        draft_ranking(agreement, _prices({"target_1": [1.0], "draft_2x128": [0.2]}))
    agreement["drafts"]["a"]["draft_config"] = {"n_layer": 9, "d_model": 9}
    with pytest.raises(ValueError, match="no draft of shape 9x9"):
        draft_ranking(agreement, prices)


def test_agreement_and_race_on_a_tiny_pair_record_what_they_ran_and_reanalyse_the_same(tmp_path):
    from speculative.measure.bench_drafts import bench_drafts
    from speculative.measure.records import read_record, write_record

    save_tiny_pair(tmp_path / "pair")
    pair = load_pair(tmp_path / "pair")
    torch.manual_seed(3)
    save_draft(tmp_path / "wide", GPT(GPTConfig(context=32, n_layer=1, n_head=2, d_model=16)), pair, {})
    drafts = {"shipped": pair, "wide": with_draft(pair, tmp_path / "wide")}
    agreement = measure_agreement(pair, drafts, (0.0, 1.0), contexts=4, prefix=8, new_tokens=8)
    agreement["results"] = analysis.analyse(agreement)
    assert {(r["draft"], r["temperature"]) for r in agreement["results"]} == {
        (d, t) for d in drafts for t in (0.0, 1.0)}
    assert all(0 <= r["alpha"] <= 1 and r["contexts"] == 4 for r in agreement["results"])
    race = bench_drafts(pair, drafts, gammas=(2,), temperatures=(0.0, 1.0), batches=(1,), prompts=2,
                        max_new_tokens=6, repeats=1, calibration_repeats=1, runs=2, progress=False, profile=True)
    assert [(r["draft"], r["temperature"], len(r["runs"])) for r in race["results"]] == [
        ("shipped", 0.0, 2), ("shipped", 1.0, 2), ("wide", 0.0, 2), ("wide", 1.0, 2)]
    # each run profiles the first draft's block: greedily on both paths, sampled on the one
    profiles = race["runs"][0]["profiles"]
    assert [(p["temperature"], p["fast_greedy"]) for p in profiles] == [(0.0, True), (0.0, False), (1.0, False)]
    for figures in map(analysis_drafts.block_profile, profiles):
        assert 0 < figures["parts_outside_forwards"] < 1 and 0 < figures["runs_outside_forwards"] < 1
        assert sum(figures["share"].values()) == pytest.approx(1)
    compared = analysis_drafts.compare_drafts(race, "shipped", "wide", temperature=1.0, gamma=2)
    assert len(compared) == 2 and all(math.isfinite(c["speedup_ratio"]) for c in compared)
    for record in (agreement, race):
        path = write_record(record, tmp_path / f"{record['benchmark']}.json")
        again = read_record(path)
        assert analysis.analyse(again) == json.loads(json.dumps(record["results"]))
    with pytest.raises(ValueError, match="another target"):
        bench_drafts(pair, {"x": load_pair(tmp_path / "pair")}, gammas=(2,), temperatures=(1.0,), batches=(1,),
                     prompts=2, max_new_tokens=6, progress=False)


def test_target_samples_continue_text_with_the_targets_own_tokens(tmp_path):
    from speculative.engine.decode import plain_decode
    from speculative.sampling.transforms import SamplingConfig
    from speculative.training.train import target_samples

    save_tiny_pair(tmp_path / "pair")
    pair = load_pair(tmp_path / "pair")
    text = b"line one\nline two\nline three\nline four\n" * 20
    data = target_samples(pair.target, text, 3, prefix=8, temperature=0.0, progress=False)
    assert data.tokens.shape == (3, 32) and data.teacher_logprobs.shape == (3, 31, 256)
    assert data.description["source"] == "target samples"
    prompts = [bytes(row[:8].tolist()) for row in data.tokens]
    greedy = plain_decode(pair.target, prompts, 24, SamplingConfig(temperature=0.0)).tokens
    assert [row[8:].tolist() for row in data.tokens] == greedy  # greedily, the continuation is the target's
    with torch.no_grad():
        expected = F.log_softmax(pair.target(data.tokens[:, :-1]).float(), -1)
    assert torch.allclose(data.teacher_logprobs.float(), expected, atol=1e-2)


def test_prices_refuse_widths_without_one_and_repeated_shapes():
    from speculative.measure.drafts import measure_prices

    target = GPT(TINY).eval()
    with pytest.raises(ValueError, match="include 1"):
        measure_prices(target, [{"n_layer": 1, "d_model": 8, "n_head": 1}], [2, 4], [[1, 2, 3]], position=8)
    with pytest.raises(ValueError, match="shapes must be distinct"):
        measure_prices(target, [{"n_layer": 1, "d_model": 8, "n_head": 1}] * 2, [1], [[1, 2, 3]], position=8)


def test_a_compiled_draft_decodes_the_same_tokens_and_races_under_its_own_name(tmp_path):
    """drafts.compiled wraps the draft only; on the tiny pair, decoding with it gives the eager draft's
    tokens and accepted counts (same seeds), and a race records which drafts were compiled. (One test:
    the first compile costs about a minute on a CPU.)"""
    from speculative.engine.decode import speculative_decode
    from speculative.measure.bench_drafts import bench_drafts

    save_tiny_pair(tmp_path / "pair")
    pair = load_pair(tmp_path / "pair")
    fast = compiled(pair)
    assert fast.target is pair.target and fast.sha256 == pair.sha256
    assert isinstance(fast.draft, torch._dynamo.eval_frame.OptimizedModule)
    for temperature in (0.0, 1.0):
        config = SamplingConfig(temperature=temperature)
        runs = [speculative_decode(p.target, p.draft, pair.prompts[:3], 8, 3, config=config,
                                   generator=torch.Generator().manual_seed(5)) for p in (pair, fast)]
        assert runs[0].tokens == runs[1].tokens, temperature
        assert [a.tolist() for a in runs[0].accepted] == [a.tolist() for a in runs[1].accepted], temperature
    race = bench_drafts(pair, {"shipped": pair, "shipped+compiled": fast}, gammas=(2,), temperatures=(1.0,),
                        batches=(1,), prompts=2, max_new_tokens=6, repeats=1, calibration_repeats=1, progress=False)
    assert [race["drafts"][name]["compiled"] is not None for name in ("shipped", "shipped+compiled")] == [False, True]
    with pytest.raises(ValueError, match="compiled already"):
        compiled(fast)


def test_the_race_adds_a_compiled_twin_of_each_draft_only_when_asked(tmp_path):
    from speculative.engine.pair import load_pair
    from speculative.measure.drafts import raced_drafts

    save_tiny_pair(tmp_path / "pair")
    pair = load_pair(tmp_path / "pair")
    for flag, names in ((False, ["shipped"]), (True, ["shipped", "shipped+compiled"])):
        drafts = raced_drafts(pair, [], with_compiled=flag)
        assert list(drafts) == names
        assert [bool(d.info.get("draft_compiled")) for d in drafts.values()] == [n.endswith("+compiled") for n in names]
