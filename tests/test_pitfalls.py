"""pitfalls.py: exact laws of the wrong rules, and sabotage tests that the statistical test catches each.

Sabotage tests draw n samples from each wrong sampler, where n = stats.samples_needed(..., power=1 - 1e-4)
for that pitfall's exact law, and assert that the goodness-of-fit test rejects at p < 1e-6. The same test,
with the same n, must accept the library's real sampler on the same pair (false-alarm rate 1e-6).
"""

from fractions import Fraction as F

import pytest
import torch

from speculative.audit import pitfalls
from speculative.audit.pitfalls import FIX, PITFALLS
from speculative.exact import pitfall_laws
from speculative.exact.pitfall_laws import SEED_P, SEED_Q, extend
from speculative.exact.rule import output_distribution, total_variation
from speculative.sampling import stats
from speculative.sampling.sampler import rejection_sample

POWER = 1 - 1e-4


def test_at_least_ten_pitfalls_each_documented():
    assert len(PITFALLS) >= 10
    assert len({p.key for p in PITFALLS}) == len(PITFALLS)
    for pitfall in PITFALLS:
        assert pitfall.title and pitfall.mistake and pitfall.seen_in
        assert not pitfall.lossless


def test_exact_correct_is_the_rule():
    import random

    from speculative.exact.exact import random_rational_distribution

    assert pitfall_laws.exact_correct(list(SEED_P), list(SEED_Q)) == extend(output_distribution(SEED_P, SEED_Q))
    rng = random.Random(5)  # the gallery's listing and the rule's closed form agree on any pair, zeros included
    for _ in range(300):
        size = rng.randint(1, 8)
        p, q = random_rational_distribution(size, rng), random_rational_distribution(size, rng)
        assert pitfall_laws.exact_correct(p, q) == extend(output_distribution(p, q))


@pytest.mark.parametrize(
    "key, expected",
    [
        ("resample_from_target", [F(7, 20), F(39, 100), F(13, 50), 0]),
        ("greedy_draft_softmax_ratio", [F(2, 5), F(3, 5), 0, 0]),
        ("prune_reuse_formula", [F(2, 5), F(9, 25), F(6, 25), 0]),
        ("lenient_acceptance", [F(1, 5), F(1, 2), F(3, 10), 0]),
    ],
)
def test_seed_pair_figures_from_the_design(key, expected):
    # figures worked out by hand, apart from the code, for p = (1/2, 3/10, 1/5), q = (1/5, 1/2, 3/10)
    assert pitfalls.find(key).exact_law(SEED_P, SEED_Q) == expected


@pytest.mark.parametrize("pitfall", PITFALLS, ids=lambda p: p.key)
def test_every_pitfall_is_wrong_on_its_demo_pair(pitfall):
    law = pitfall.exact_law()
    assert sum(law) == 1
    assert total_variation(law, extend(pitfall.demo_p)) > 0


def test_the_pruning_fix_is_exact_on_many_pairs():
    import random

    from speculative.exact.exact import random_rational_distribution

    rng = random.Random(4)
    for _ in range(300):
        size = rng.randint(1, 8)
        p, q = random_rational_distribution(size, rng), random_rational_distribution(size, rng)
        assert FIX.exact_law(p, q) == extend(p)


def test_exact_and_sampled_forms_agree():
    # each sampler makes the same mistake as its exact law: its samples fit that (wrong) law
    gen = torch.Generator().manual_seed(21)
    for pitfall in PITFALLS + [FIX]:
        law = pitfall.exact_law()
        counts = stats.counts_of(pitfall.draw(20_000, gen), len(law))
        assert not stats.goodness_of_fit(counts, law).rejects(), pitfall.key


@pytest.mark.parametrize("pitfall", PITFALLS, ids=lambda p: p.key)
def test_sabotage_the_test_catches_each_pitfall(pitfall):
    target = extend(pitfall.demo_p)
    law = pitfall.exact_law()
    n = max(stats.samples_needed(target, law, power=POWER), 50)
    gen = torch.Generator().manual_seed(1000 + PITFALLS.index(pitfall))
    wrong = stats.goodness_of_fit(stats.counts_of(pitfall.draw(n, gen), len(target)), target)
    assert wrong.rejects(), (pitfall.key, n, wrong)
    # the control: the library's sampler, same pair, same n, same test
    p = torch.tensor([float(v) for v in pitfall.demo_p], dtype=torch.float64)
    q = torch.tensor([float(v) for v in pitfall.demo_q], dtype=torch.float64)
    drafts = torch.multinomial(q, n, replacement=True, generator=gen).unsqueeze(1)
    right = rejection_sample(drafts, q.expand(n, 1, len(q)), p.expand(n, 2, len(p)), gen)
    control = stats.goodness_of_fit(stats.counts_of(right.tokens[:, 0], len(target)), target)
    assert not control.rejects(), (pitfall.key, control)


def test_find_unknown_key():
    with pytest.raises(ValueError, match="unknown pitfall"):
        pitfalls.find("nope")


def test_diff_from_correct_shows_only_the_changed_lines():
    assert pitfall_laws.diff_from_correct(pitfall_laws.exact_correct) == ""
    diff = pitfall_laws.diff_from_correct(pitfall_laws.exact_resample_from_target).splitlines()
    assert diff == ["-    r = normalized_residual(p, q)",
                    "+    r = p  # MISTAKE: after a rejection, draw from p itself"]
    for pitfall in PITFALLS + [FIX]:
        assert pitfall_laws.diff_from_correct(pitfall.exact).strip(), pitfall.key


@pytest.mark.parametrize("key, make", [("typical_acceptance", pitfalls.typical_acceptance_sampler),
                                       ("resample_from_target", pitfalls.resample_from_target_sampler)])
def test_batched_mistakes_have_their_exact_wrong_law(key, make):
    # 20,000 draws; at the false-alarm rate of stats (1e-6) the first assert fails by chance once in a million
    # runs, and the second has power above 0.999 against the TV of 0.15 (or more) that each entry has here
    sampler = make()
    gen = torch.Generator().manual_seed(31)
    n = 20_000
    p = torch.tensor([float(v) for v in SEED_P], dtype=torch.float64)
    q = torch.tensor([float(v) for v in SEED_Q], dtype=torch.float64)
    drafts = torch.multinomial(q, n, replacement=True, generator=gen).unsqueeze(1)
    out = sampler(drafts, q.expand(n, 1, 3), p.expand(n, 2, 3), gen)
    counts = stats.counts_of(out.tokens[:, 0], 4)
    assert not stats.goodness_of_fit(counts, pitfalls.find(key).exact_law()).rejects()
    assert stats.goodness_of_fit(counts, extend(SEED_P)).rejects()


def test_every_source_a_pitfall_cites_is_in_the_bibliography():
    from pathlib import Path

    bib = (Path(__file__).resolve().parents[1] / "book" / "references.bib").read_text()
    for pitfall in PITFALLS + [FIX]:
        for key in pitfall.cites:
            assert "{" + key + "," in bib, f"{pitfall.key} cites {key}, which references.bib lacks"


def test_the_shared_inverse_cdf_gives_the_invalid_id_only_where_a_pitfall_asks_for_it():
    # the samplers' draws come from sampling.draws.inverse_cdf: one row, many uniforms
    from speculative.sampling.draws import inverse_cdf

    weights = torch.tensor([0.0, 0.25, 0.0, 0.25], dtype=torch.float64)  # mass 1/2, as an unnormalised residual
    uniforms = torch.tensor([0.0, 0.3, 0.6, 1 - 2.0 ** -53], dtype=torch.float64)
    assert inverse_cdf(weights, uniforms).tolist() == [1, 1, 3, 3]  # normalised: never a zero weight, never V
    assert inverse_cdf(weights, uniforms, normalise=False, clamp=False).tolist() == [1, 3, 4, 4]  # runs off the end
    assert inverse_cdf(weights, uniforms, normalise=False).tolist() == [1, 3, 3, 3]  # ... clamped to V - 1
    nan = torch.zeros(4, dtype=torch.float64) / 0  # a zero residual divided anyway
    assert inverse_cdf(nan, uniforms, normalise=False, clamp=False).tolist() == [4] * 4


def test_the_torch_law_of_resampling_from_p_is_the_exact_one():
    entry = next(p for p in PITFALLS if p.key == "resample_from_target")
    p, q = [F(1, 2), F(1, 3), F(1, 6)], [F(1, 6), F(1, 2), F(1, 3)]
    exact = entry.exact_law(p, q)[:3]
    torched = pitfalls.resample_from_target_law(torch.tensor([[float(v) for v in p]], dtype=torch.float64),
                                                torch.tensor([[float(v) for v in q]], dtype=torch.float64))[0]
    assert torched.tolist() == pytest.approx([float(v) for v in exact], abs=1e-15)
    assert total_variation(exact, p) > 0


def test_the_two_byte_law_of_the_resampling_sampler_is_what_it_emits(law_pair):
    from speculative.engine.decode import speculative_decode
    from speculative.engine.evaluate import exact_two_byte_law
    from speculative.sampling.transforms import SamplingConfig

    config = SamplingConfig(temperature=1.0)
    prompt = law_pair.prompts[0]
    law = exact_two_byte_law(law_pair.target, prompt, config, draft=law_pair.draft,
                             step=pitfalls.resample_from_target_law).reshape(-1).tolist()
    target_law = exact_two_byte_law(law_pair.target, prompt, config).reshape(-1).tolist()
    out = speculative_decode(law_pair.target, law_pair.draft, [prompt] * 4000, 2, 4, config,
                             torch.Generator().manual_seed(8), sampler=pitfalls.resample_from_target_sampler())
    counts = stats.counts_of([t[0] * 256 + t[1] for t in out.tokens], 256 * 256)
    # a chi-square test of the emitted rows against the computed wrong law, false alarm 1e-6 (fixed seed)
    assert stats.goodness_of_fit(counts, law).p_value >= stats.FALSE_ALARM_RATE
    assert 0.5 * sum(abs(a - b) for a, b in zip(law, target_law)) > 1e-3  # and that law is not the target's
