"""speculative.audit.core: it passes the library's sampler, fails every wrong rule of the gallery, says why, and
refuses bad input in one line.

False alarms: each audit's family-wise rate is 1e-6 (stated by audit_sampler), so the passing assertions
below fail by chance about once in a million runs each (chi-square approximation); seeds are fixed, so a
run is reproducible.
Power: pitfall_power computes, from each wrong rule's exact law, the chance that the battery rejects it;
the test asserts it is above 0.999 for every entry of the gallery.
"""

import json

import pytest
import torch

from speculative.audit import core as audit
from speculative.audit import pitfalls
from speculative.audit.battery import select_cases
from speculative.cli import main
from speculative.sampling import stats
from speculative.sampling.sampler import SamplerOutput, rejection_sample


@pytest.fixture(scope="module")
def library_report(battery):
    """The whole battery run once on the library's sampler; every test of that audit reads this report."""
    return audit.audit_sampler(rejection_sample, cases=battery, name="rejection_sample")


def test_the_library_sampler_passes_every_case(library_report, battery):
    assert library_report.passed, library_report.table()
    assert [r.name for r in library_report.results] == [c.name for c in battery]
    per_case = library_report.family_false_alarm / len(battery)  # the Bonferroni split the module states
    assert library_report.family_false_alarm == stats.FALSE_ALARM_RATE
    for result in library_report.results:
        assert result.p_value >= per_case, result


def test_each_case_draws_the_sample_its_stated_distance_needs(library_report, battery):
    per_case = library_report.family_false_alarm / len(library_report.results)
    for case, result in zip(battery, library_report.results):
        law = audit._law(case)
        probs = list(law.values()) + [0.0]
        # recomputed from stats, apart from the audit: the smallest n that detects the case's TV at power 0.99
        needed = stats.samples_needed(stats.pooled(probs, result.n), tv=case.tv, false_alarm=per_case)
        assert result.n == audit.MAX_ROWS["probs"] or result.n >= needed * 0.95, (case.name, result.n, needed)
        assert result.detectable_tv == pytest.approx(
            stats.detectable_tv(result.n, stats.pooled(probs, result.n), false_alarm=per_case)), case.name
        if result.n < audit.MAX_ROWS["probs"]:
            assert result.detectable_tv <= case.tv * 1.05, (case.name, result.detectable_tv)


def test_the_edge_runs_ran_on_every_edge_case(library_report, battery):
    edged = [r.name for r in library_report.results if "edges" in r.detail]
    assert edged == [c.name for c in battery if c.edges] and len(edged) >= 3


def test_the_report_round_trips_through_json(library_report):
    data = json.loads(library_report.to_json())
    assert data["passed"] is True and data["convention"] == "probs"
    assert [r["n"] for r in data["results"]] == [r.n for r in library_report.results]
    assert "every case passed" in library_report.table()


@pytest.mark.slow
@pytest.mark.parametrize("pitfall", pitfalls.PITFALLS, ids=lambda p: p.key)
def test_every_wrong_rule_of_the_gallery_fails_and_the_battery_has_the_power_to_see_it(pitfall, battery):
    report = audit.audit_sampler(audit.pitfall_sampler(pitfall), convention="pitfall", cases=battery,
                                 name=pitfall.key)
    assert not report.passed, report.table()
    assert audit.pitfall_power(pitfall, cases=battery)["battery"] > 0.999


def test_the_fixed_pruning_rule_passes_in_the_one_step_convention(battery):
    report = audit.audit_sampler(audit.pitfall_sampler(pitfalls.FIX), convention="pitfall", cases=battery)
    assert report.passed, report.table()
    # lossless, so the battery "rejects" it only at the false-alarm rate
    assert audit.pitfall_power(pitfalls.FIX, cases=battery)["battery"] < 1e-5


def _off_by_one_bonus(draft_tokens, draft_probs, target_probs, generator, randomness=None):
    out = rejection_sample(draft_tokens, draft_probs, target_probs, generator, randomness=randomness)
    tokens = out.tokens.clone()
    full = out.num_accepted == draft_tokens.shape[1]
    tokens[full, -1] = draft_tokens[full, -1]  # the bonus token repeats the last draft: a wrong law
    return SamplerOutput(tokens, out.num_accepted, out.num_emitted)


def test_a_subtly_wrong_block_rule_fails_every_block_case_with_two_or_more_drafts(battery):
    cases = [c for c in battery if c.law == "block" and c.gamma >= 2]
    report = audit.audit_sampler(_off_by_one_bonus, cases=cases)
    assert not report.passed
    assert all(not r.passed for r in report.results), report.table()


def test_a_crash_an_out_of_range_id_and_a_wrong_shape_fail_with_the_input_shown(battery):
    cases = battery[:1]

    def crashes(*args, **kwargs):
        raise RuntimeError("probability tensor contains either inf, nan or element < 0")

    def out_of_range(draft_tokens, draft_probs, target_probs, generator):
        return torch.full((draft_tokens.shape[0], 2), draft_probs.shape[-1])

    def wrong_shape(draft_tokens, draft_probs, target_probs, generator):
        return torch.zeros(draft_tokens.shape[0], dtype=torch.long)

    for fn, needle in ((crashes, "raised RuntimeError"), (out_of_range, "outside"), (wrong_shape, "shape")):
        (result,) = audit.audit_sampler(fn, cases=cases).results
        assert not result.passed and needle in result.detail, result


def test_a_rule_that_accepts_a_token_with_p_zero_at_u_zero_is_caught_at_the_edge(battery):
    # u <= p/q instead of u < p/q: right except when u is exactly 0, which random draws almost never give
    def accept_at_equality(draft_tokens, draft_probs, target_probs, generator, randomness=None):
        from speculative.sampling.sampler import draw_randomness

        randomness = randomness or draw_randomness(draft_tokens.shape[0], draft_tokens.shape[1], generator)
        out = rejection_sample(draft_tokens, draft_probs, target_probs, generator, randomness=randomness)
        tokens = out.tokens.clone()
        at_zero = randomness.uniforms[:, 0] == 0
        tokens[at_zero, 0] = draft_tokens[at_zero, 0]
        tokens[at_zero, 1] = -1
        return SamplerOutput(tokens, out.num_accepted, out.num_emitted)

    cases = [c for c in battery if c.name == "drafted tokens with p(x) = 0"]
    (result,) = audit.audit_sampler(accept_at_equality, cases=cases).results
    assert not result.passed and "every uniform at 0 it emitted" in result.detail, result


def test_what_the_sampler_writes_stays_in_a_scratch_folder(tmp_path, monkeypatch, battery):
    monkeypatch.chdir(tmp_path)

    def writes(draft_tokens, draft_probs, target_probs, generator):
        with open("left-behind.txt", "a") as handle:
            handle.write("x")
        return rejection_sample(draft_tokens, draft_probs, target_probs, generator)

    assert audit.audit_sampler(writes, cases=battery[:1]).passed
    assert list(tmp_path.iterdir()) == []


def test_bad_input_is_one_clear_error():
    with pytest.raises(TypeError, match="callable"):
        audit.audit_sampler(3)
    with pytest.raises(ValueError, match="unknown convention"):
        audit.audit_sampler(rejection_sample, convention="nope")


def test_select_cases_picks_by_name_and_refuses_a_name_that_matches_none(battery):
    chosen = select_cases(["BLOCKS OF 2", "three-token"], battery)
    assert [c.name for c in chosen] == [c.name for c in battery if c.name in ("three-token example",
                                                                              "context-dependent tables, blocks of 2")]
    with pytest.raises(ValueError, match="no case of the battery is named like 'nosuch'") as error:
        select_cases(["three-token", "nosuch"], battery)
    assert "\n" not in str(error.value) and battery[-1].name in str(error.value)


def test_cli_exit_codes(tmp_path, capsys):
    # the whole battery on the library's sampler is test_the_library_sampler_passes_every_case's: here one case
    out = tmp_path / "report.json"
    assert main(["audit", "speculative.sampling.sampler:rejection_sample", "--case", "three-token", "--no-progress",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["passed"] is True and [r["name"] for r in report["results"]] == ["three-token example"]
    assert "every case passed" in capsys.readouterr().out
    # an entry of the gallery, with its demo options: 0/0 on the p = q case gives the id V
    assert main(["audit", "pitfall:unguarded_zero_residual", "--case", "p = q", "--no-progress"]) == 1
    assert "FAIL" in capsys.readouterr().out
    for bad in ("nosuch.module:f", "speculative.sampling.sampler:nothing", "speculative.sampling.sampler",
                "speculative.defaults:PROMPTS",
                "speculative.book.glue:glue", "pitfall:nosuch"):
        assert main(["audit", bad, "--case", "three-token", "--no-progress"]) == 2, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err, err
    assert main(["audit", "speculative.sampling.sampler:rejection_sample", "--case", "nosuch", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no case of the battery is named like 'nosuch'" in err, err


def test_hugging_face_sampler_keeps_the_law_and_fails_only_where_its_code_says(battery):
    """The "hf" convention on five cases: the two whose edge runs reach the paths its code has, and three
    ordinary ones (the float16 and bfloat16 pairs among them). Chapter 09 runs the whole battery on it in
    the book's build (``make test`` builds the book) and asserts the same of every case there; this test
    keeps the adapter tested when pytest runs alone, at a third of that audit's cost."""
    import inspect

    import transformers  # a requirement of the project (requirements.txt): missing means a broken install
    from transformers.generation.utils import _speculative_sampling

    cases = select_cases(["three-token", "float16 inputs", "p(x) = 0", "zero residual"], battery)
    assert len(cases) == 5  # float16 and bfloat16 inputs both match
    report = audit.audit_sampler(_speculative_sampling, convention="hf", cases=cases, name=transformers.__version__)
    assert [r.name for r in report.results] == [c.name for c in cases]
    # its law is right where random draws decide: every case's law test passes
    per_case = report.family_false_alarm / len(cases)
    assert all(r.p_value is not None and r.p_value >= per_case for r in report.results), report.table()
    # what must fail at the edges, read from its source apart from the audit: accepting at r <= p/q takes a
    # draft with p = 0 when the uniform is 0; dividing the residual by its sum with no guard gives NaN
    # weights (which torch.multinomial refuses) when the residual is all zero and the uniform is near 1
    source = inspect.getsource(_speculative_sampling)
    expected = {}
    if "r_i <= probability_ratio" in source:
        expected["drafted tokens with p(x) = 0"] = "with every uniform at 0 it emitted"
    if "p_prime.div_(p_prime_sum)" in source:
        expected["equal up to rounding, zero residual"] = "with every uniform at 1 − 2⁻²⁴ it raised"
    failed = {r.name: r.detail for r in report.results if not r.passed}
    assert set(failed) == set(expected), report.table()
    for name, start in expected.items():
        assert failed[name].startswith(start), failed[name]
