"""The whole-engine audit (speculative.audit.engines, audit.audit_engine): its exact laws, its handling of bad
engines, and that it catches real bugs planted in this library's own engine.

The audit's verdicts on this library's engine in its three basic forms, and on the whole gallery with
each wrong engine's power, are asserted by chapter 12 (notebooks/12_audit_engine.md), which `make test`
executes; they are not run again here. The engine's draft-length policies are audited here. Each
statistical test here rejects at the audit's family-wise rate (1e-6, split over the cases it runs), with
fixed seeds, so the suite is deterministic.
"""

import importlib
import os
import time

import numpy as np
import pytest
import torch

from conftest import planted_cut_bug, planted_rollback_bug
from speculative.audit import engine_cases, engine_gallery, engines
from speculative.audit.engine_audit import assert_engine_lossless, audit_engine
from speculative.cli import main
from speculative.engine.evaluate import exact_sequence_law
from speculative.sampling import stats
from speculative.sampling.transforms import PenalizedConfig, SamplingConfig, penalized_logits


@pytest.fixture(scope="module")
def battery():
    cases = engine_cases.engine_battery(penalty=True)
    for case in cases:
        case.law()
    return {case.name: case for case in cases}


def test_the_battery_states_cases_where_rejections_and_full_blocks_are_both_frequent(battery):
    for case in battery.values():
        assert 3 <= case.vocab <= 8 and case.target.config.context >= 64
        assert 0.3 < case.acceptance < 0.9, (case.name, case.acceptance)
        assert case.entropy_bits > 0.5, (case.name, case.entropy_bits)
        # at most 3 drafts a block: two blocks emit at most 8 tokens, so 9 reach a third block
        assert case.length == 9
        assert case.margin > 1e-4  # no support decided by float rounding
    assert len({len(case.prompt) for case in battery.values()}) == len(battery)


def test_the_enumerated_law_is_the_evaluate_modules_law(battery):
    # two implementations: engine_cases._enumerate (tensor codes, processors incl. the penalty) and
    # evaluate.exact_sequence_law (dict of tuples); the top-k case is small enough for the second
    case = battery["V = 8, top-k 2"]
    codes, probs = case.law()
    law, _ = exact_sequence_law(case.target, case.prompt, case.config, case.length)
    assert len(law) == len(codes)
    theirs = {int(case.codes_of(torch.tensor([seq]))[0]): p for seq, p in law.items()}
    # float32 forwards, batched differently: equal to rounding
    assert np.allclose([theirs[int(c)] for c in codes], probs, rtol=1e-5, atol=0)
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)


def test_the_repetition_penalty_is_transformers_own():
    transformers = pytest.importorskip("transformers")
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, generator=generator) * 3
    context = torch.randint(7, (5, 4), generator=generator)
    theirs = RepetitionPenaltyLogitsProcessor(1.7)(context, logits.clone())
    seen = torch.zeros(5, 7, dtype=torch.bool).scatter_(1, context, True)
    assert torch.allclose(penalized_logits(logits, seen, 1.7), theirs), transformers.__version__
    with pytest.raises(ValueError, match="repetition_penalty"):
        PenalizedConfig(repetition_penalty=0)


def test_this_librarys_loops_refuse_a_penalty_instead_of_ignoring_it(battery):
    case = battery["V = 3, repetition penalty 1.5"]
    with pytest.raises(ValueError, match="does not apply a repetition penalty"):
        engines.library_engine()(case.target, case.draft, case.prompt, 9, case.config, torch.Generator(), 4)


def test_power_from_a_sample_is_unbiased_enough_to_state():
    null = np.array([0.4, 0.3, 0.2, 0.1])
    alt = np.array([0.34, 0.33, 0.22, 0.11])
    rng = np.random.default_rng(0)
    exact = stats.power(3_000, null, alt, 1e-6)
    estimates = [stats.power_from_sample(3_000, null, rng.multinomial(20_000, alt), 1e-6) for _ in range(200)]
    assert abs(np.mean(estimates) - exact) < 0.05, (np.mean(estimates), exact)
    # a sample of the null itself: the estimate is near the false-alarm rate, not inflated by noise
    assert np.median([stats.power_from_sample(3_000, null, rng.multinomial(2_000, null)) for _ in range(50)]) < 1e-3


def _engine_of(module, **options):
    def engine(target, draft, prompt, max_new_tokens, config, generator, n):
        out = module.speculative_decode(target, draft, [list(prompt)] * n, max_new_tokens, config=config,
                                        generator=generator, **options)
        return torch.tensor(out.tokens)

    return engine


@pytest.mark.slow
@pytest.mark.parametrize("form", engines.LIBRARY_FORMS[3:], ids=lambda form: "-".join(map(str, form.values())))
def test_every_draft_length_policy_of_this_librarys_engine_passes_the_audit(battery, form):
    plain = [case for name, case in battery.items() if "penalty" not in name]
    report = audit_engine(engines.library_engine(**form), cases=plain)
    assert report.passed, report.table()
    assert all(result.n >= 5_000 for result in report.results)  # full-size samples, not a cap


@pytest.mark.slow
def test_the_planted_rollback_bug_in_this_librarys_engine_is_caught(battery):
    broken = planted_rollback_bug()
    report = audit_engine(_engine_of(broken, gamma=2), cases=[battery["V = 3, T = 1"], battery["V = 4, top-k 3"]])
    assert not report.passed, report.table()
    # the same audit of the unbroken engine, same seeds: it passes (the control)
    from speculative.engine import decode

    assert audit_engine(_engine_of(decode, gamma=2), cases=[battery["V = 3, T = 1"], battery["V = 4, top-k 3"]]).passed


@pytest.mark.slow
def test_the_planted_cut_bug_is_caught(battery):
    from speculative.engine.policy import make_policy

    broken = planted_cut_bug().rejection_sample
    engine = _engine_of(importlib.import_module("speculative.engine.decode"),
                        gamma=make_policy("heuristic", 2, max_gamma=3), sampler=broken, per_row=True)
    report = audit_engine(engine, cases=[battery["V = 3, T = 1"], battery["V = 4, top-k 3"]])
    assert not report.passed, report.table()


def _fine(target, draft, prompt, max_new_tokens, config, generator, n):
    return engine_gallery.reference_engine(target, draft, prompt, max_new_tokens, config, generator, n)


@pytest.mark.parametrize("bad, message", [
    (lambda *a: 1 / 0, "raised ZeroDivisionError: division by zero"),
    (lambda t, d, p, k, c, g, n: torch.zeros(n, k - 1, dtype=torch.long), "returned shape"),
    (lambda t, d, p, k, c, g, n: torch.full((n, k), 3), "with an id outside 0..2"),
    (lambda t, d, p, k, c, g, n: torch.zeros(n, k), "returned torch.float32 values"),
    (lambda t, d, p, k, c, g, n: "tokens", "not a tensor of token ids"),
])
def test_a_bad_engine_fails_its_case_with_one_line(battery, bad, message):
    report = audit_engine(bad, cases=[battery["V = 3, T = 1"]], max_rows=300)
    (result,) = report.results
    assert not result.passed and message in result.detail and "\n" not in result.detail, result.detail


def test_an_engine_that_hangs_fails_at_the_time_limit(battery):
    def slow(*args):
        time.sleep(30)

    began = time.perf_counter()
    report = audit_engine(slow, cases=[battery["V = 3, T = 1"]], time_limit=1.0)
    assert time.perf_counter() - began < 10
    assert "ran past the case's time limit of 1 s" in report.results[0].detail


def test_nothing_an_engine_writes_lands_in_the_callers_folder(battery, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def scribbling(target, draft, prompt, max_new_tokens, config, generator, n):
        with open("scribble.txt", "w") as handle:
            handle.write("x")
        return _fine(target, draft, prompt, max_new_tokens, config, generator, n)

    audit_engine(scribbling, cases=[battery["V = 8, top-k 2"]], max_rows=200)
    assert os.listdir(tmp_path) == []


def test_assert_engine_lossless_raises_with_the_table(battery):
    wrong = next(entry for entry in engine_gallery.GALLERY if entry.key == "argmax_verify").engine()
    with pytest.raises(AssertionError, match=r"\| V = 3, T = 1 +\| +9 \|"):
        assert_engine_lossless(wrong, cases=[battery["V = 3, T = 1"]], max_rows=3_000)
    with pytest.raises(TypeError):
        audit_engine("not an engine")
    with pytest.raises(ValueError, match="unknown engine convention"):
        audit_engine(_fine, convention="probs")


def test_a_config_whose_support_is_too_large_is_refused_in_one_line():
    with pytest.raises(ValueError, match="support holds 6\\^9 sequences"):
        engine_cases.engine_battery(config=SamplingConfig(temperature=1.0))[2].law()


def test_the_cli_audits_an_engine_and_exits_by_its_verdict(tmp_path, capsys):
    path = tmp_path / "report.json"
    assert main(["audit-engine", "ours", "--case", "V = 8", "--no-progress", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fixed γ = 2" in out and "every case passed" in out and path.exists()
    assert main(["audit-engine", "gallery:argmax_verify", "--case", "V = 8", "--max-rows", "2000",
                 "--no-progress"]) == 1


@pytest.mark.parametrize("argv, message", [
    (["audit-engine", "nothing"], "expected ours, hf, gallery:KEY or MODULE:FUNCTION"),
    (["audit-engine", "gallery:nope"], "no gallery engine 'nope'"),
    (["audit-engine", "ours", "--repetition-penalty", "1.5"], "does not apply a repetition penalty"),
    (["audit-engine", "ours", "--temperature", "1", "--case", "V = 6"], "support holds 6^9 sequences"),
    (["audit-engine", "ours", "--case", "no such case"], "no engine case matches"),
    (["audit-engine", "hf", "--hf-config", "no such"], "no transformers configuration matches"),
])
def test_an_engine_audit_that_cannot_run_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
