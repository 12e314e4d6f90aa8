"""speculative.audit: it passes the library's sampler, fails every wrong rule of the gallery, says why, and
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

from speculative import audit, pitfalls
from speculative.__main__ import main
from speculative.sampler import SamplerOutput, rejection_sample


def test_the_library_sampler_passes_every_case_and_its_edges():
    report = audit.audit_sampler(rejection_sample, name="rejection_sample")
    assert report.passed, report.table()
    assert len(report.results) == len(audit.default_battery())
    edged = [r for r in report.results if "edges" in r.detail]
    assert len(edged) == sum(c.edges for c in audit.default_battery()) >= 3  # the edge runs really ran
    for result in report.results:
        assert 0 < result.detectable_tv <= 0.11 and result.n >= 1000, result
    assert json.loads(report.to_json())["passed"] is True


@pytest.mark.slow
@pytest.mark.parametrize("pitfall", pitfalls.PITFALLS, ids=lambda p: p.key)
def test_every_wrong_rule_of_the_gallery_fails_and_the_battery_has_the_power_to_see_it(pitfall):
    report = audit.audit_sampler(audit.pitfall_sampler(pitfall), convention="pitfall", name=pitfall.key)
    assert not report.passed, report.table()
    assert audit.pitfall_power(pitfall)["battery"] > 0.999


def test_the_fixed_pruning_rule_passes_in_the_one_step_convention():
    report = audit.audit_sampler(audit.pitfall_sampler(pitfalls.FIX), convention="pitfall")
    assert report.passed, report.table()
    # lossless, so the battery "rejects" it only at the false-alarm rate
    assert audit.pitfall_power(pitfalls.FIX)["battery"] < 1e-5


def _off_by_one_bonus(draft_tokens, draft_probs, target_probs, generator, randomness=None):
    out = rejection_sample(draft_tokens, draft_probs, target_probs, generator, randomness=randomness)
    tokens = out.tokens.clone()
    full = out.num_accepted == draft_tokens.shape[1]
    tokens[full, -1] = draft_tokens[full, -1]  # the bonus token repeats the last draft: a wrong law
    return SamplerOutput(tokens, out.num_accepted, out.num_emitted)


def test_a_subtly_wrong_block_rule_fails_every_block_case_with_two_or_more_drafts():
    cases = [c for c in audit.default_battery() if c.law == "block" and c.gamma >= 2]
    report = audit.audit_sampler(_off_by_one_bonus, cases=cases)
    assert not report.passed
    assert all(not r.passed for r in report.results), report.table()


def test_a_crash_an_out_of_range_id_and_a_wrong_shape_fail_with_the_input_shown():
    cases = [audit.default_battery()[0]]

    def crashes(*args, **kwargs):
        raise RuntimeError("probability tensor contains either inf, nan or element < 0")

    def out_of_range(draft_tokens, draft_probs, target_probs, generator):
        return torch.full((draft_tokens.shape[0], 2), draft_probs.shape[-1])

    def wrong_shape(draft_tokens, draft_probs, target_probs, generator):
        return torch.zeros(draft_tokens.shape[0], dtype=torch.long)

    for fn, needle in ((crashes, "raised RuntimeError"), (out_of_range, "outside"), (wrong_shape, "shape")):
        (result,) = audit.audit_sampler(fn, cases=cases).results
        assert not result.passed and needle in result.detail, result


def test_a_rule_that_accepts_a_token_with_p_zero_at_u_zero_is_caught_at_the_edge():
    # u <= p/q instead of u < p/q: right except when u is exactly 0, which random draws almost never give
    def accept_at_equality(draft_tokens, draft_probs, target_probs, generator, randomness=None):
        from speculative.sampler import draw_randomness

        randomness = randomness or draw_randomness(draft_tokens.shape[0], draft_tokens.shape[1], generator)
        out = rejection_sample(draft_tokens, draft_probs, target_probs, generator, randomness=randomness)
        tokens = out.tokens.clone()
        at_zero = randomness.uniforms[:, 0] == 0
        tokens[at_zero, 0] = draft_tokens[at_zero, 0]
        tokens[at_zero, 1] = -1
        return SamplerOutput(tokens, out.num_accepted, out.num_emitted)

    cases = [c for c in audit.default_battery() if c.name == "drafted tokens with p(x) = 0"]
    (result,) = audit.audit_sampler(accept_at_equality, cases=cases).results
    assert not result.passed and "every uniform at 0 it emitted" in result.detail, result


def test_what_the_sampler_writes_stays_in_a_scratch_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def writes(draft_tokens, draft_probs, target_probs, generator):
        with open("left-behind.txt", "a") as handle:
            handle.write("x")
        return rejection_sample(draft_tokens, draft_probs, target_probs, generator)

    assert audit.audit_sampler(writes, cases=audit.default_battery()[:1]).passed
    assert list(tmp_path.iterdir()) == []


def test_bad_input_is_one_clear_error():
    with pytest.raises(TypeError, match="callable"):
        audit.audit_sampler(3)
    with pytest.raises(ValueError, match="unknown convention"):
        audit.audit_sampler(rejection_sample, convention="nope")


def test_cli_exit_codes(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["audit", "speculative.sampler:rejection_sample", "--no-progress", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["passed"] is True
    assert "every case passed" in capsys.readouterr().out
    # an entry of the gallery, with its demo options (here the 1% rounding shortfall that makes it bite)
    assert main(["audit", "pitfall:unguarded_zero_residual", "--no-progress"]) == 1
    assert "FAIL" in capsys.readouterr().out
    for bad in ("nosuch.module:f", "speculative.sampler:nothing", "speculative.sampler", "speculative.defaults:PROMPTS",
                "speculative.book:glue", "pitfall:nosuch"):
        assert main(["audit", bad, "--no-progress"]) == 2, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err, err


@pytest.mark.slow
def test_hugging_face_sampler_reaches_a_verdict_on_every_case():
    import transformers  # a requirement of the project (requirements.txt): missing means a broken install
    from transformers.generation.utils import _speculative_sampling

    report = audit.audit_sampler(_speculative_sampling, convention="hf", name=transformers.__version__)
    assert len(report.results) == len(audit.default_battery())
    assert all(r.passed or r.detail for r in report.results)  # every failure says what failed
    by_name = {r.name: r for r in report.results}
    # its law is right where random draws decide (the cases without edge runs pass)
    assert all(by_name[c.name].passed for c in audit.default_battery() if not c.edges), report.table()
