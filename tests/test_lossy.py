"""lossy.py and lossy_laws.py: the five rules that are lossy by design, each exact law against its sampler,
its hand-worked figure on the demo pair, and the settings at which it becomes lawful again.

The sampled checks use the chi-square test of stats at its false-alarm rate of 1e-6 (a lawful sampler
fails once in a million runs), with enough rows for power 1 - 1e-4 against the rule's distance from the
lawful output (computed, and asserted below).
"""

import random
from fractions import Fraction as F

import pytest
import torch

from speculative.audit.lossy import LOSSY_RULES
from speculative.exact import lossy_laws, pitfall_laws
from speculative.exact.exact import random_rational_distribution
from speculative.exact.pitfall_laws import SEED_P, SEED_Q, extend
from speculative.exact.rule import total_variation
from speculative.sampling import stats

RULES = {rule.key: rule for rule in LOSSY_RULES}


def random_pairs(seed, count=300):
    rng = random.Random(seed)
    for _ in range(count):
        size = rng.randint(1, 7)
        yield random_rational_distribution(size, rng), random_rational_distribution(size, rng)


def test_five_rules_each_documented_cited_and_shown_as_an_edit_of_the_right_rule():
    from pathlib import Path

    bib = (Path(__file__).resolve().parents[1] / "book" / "references.bib").read_text()
    assert len(RULES) == len(LOSSY_RULES) == 5
    for rule in LOSSY_RULES:
        assert rule.title and rule.mistake and rule.seen_in and rule.cites and not rule.lossless
        assert all("{" + key + "," in bib for key in rule.cites), rule.key
        assert "LOSSY RULE" in pitfall_laws.diff_from_correct(rule.exact), rule.key


@pytest.mark.parametrize(
    "key, expected",
    [
        ("relaxed_acceptance", [0, 1, 0, 0]),  # argmax q = 1; 3/10 >= 1/2 - 3/5, and 1 is in the top 10
        ("typical_acceptance_entropy", [F(1, 5), F(1, 2), F(3, 10), 0]),  # every p(x) > 0.09: the law is q
        ("sglang_thresholds", [F(2, 7), F(3, 5), F(4, 35), 0]),  # accept 3/5; else (1/2, 1/5) / (7/10)
        ("fly", [F(3, 4) + F(1, 4) * F(3, 4) ** 6, F(1, 4) * (1 - F(3, 4) ** 6) / 2,
                 F(1, 4) * (1 - F(3, 4) ** 6) / 2, 0]),
        ("fuzzy", [0, 1, 0, 0]),  # JS(p, q) is about 0.05 nats, under 0.4: the greedy draft is kept
    ],
)
def test_demo_pair_figures_worked_by_hand(key, expected):
    assert RULES[key].exact_law() == expected


def test_the_floating_point_quantities_by_hand():
    import math

    p, q = [0.5, 0.3, 0.2], [0.2, 0.5, 0.3]
    m = [0.35, 0.4, 0.25]
    kl = lambda a: sum(x * math.log(x / y) for x, y in zip(a, m))  # noqa: E731
    assert lossy_laws.js_divergence(SEED_P, SEED_Q) == pytest.approx((kl(p) + kl(q)) / 2, rel=1e-12)
    assert lossy_laws.top3_entropy([F(1, 2), F(1, 2), 0, 0]) == pytest.approx(math.log(2), rel=1e-12)
    assert lossy_laws.entropy([F(1)]) == pytest.approx(-math.log(1 + 1e-5), rel=1e-9)
    assert lossy_laws.arg_max([F(1, 3), F(1, 3), F(1, 3)]) == 0  # ties go to the first, as torch.argmax


@pytest.mark.parametrize("rule", LOSSY_RULES, ids=lambda r: r.key)
def test_each_rule_is_lossy_on_its_demo_pair_and_its_sampler_draws_its_exact_law(rule):
    law, lawful = rule.exact_law(), rule.target_law()
    assert sum(law) == 1 and law[-1] == 0
    assert total_variation(law, lawful) > 0
    n = max(20_000, stats.samples_needed(lawful, law, power=1 - 1e-4))
    counts = stats.counts_of(rule.draw(n, torch.Generator().manual_seed(7)), len(law))
    if sum(1 for v in law if v) > 1:  # a deterministic law has no sampling noise to test
        assert not stats.goodness_of_fit(counts, law).rejects(), rule.key
    else:
        assert counts.tolist() == [n * int(v) for v in law]
    assert stats.goodness_of_fit(counts, lawful).rejects(), rule.key


def test_sglang_is_exact_at_its_default_thresholds_for_a_top1_draft():
    for p, q in random_pairs(11):
        assert lossy_laws.exact_sglang_thresholds(p, q, threshold_single=1, threshold_acc=1) == extend(p)
    assert lossy_laws.exact_sglang_thresholds(SEED_P, SEED_Q, threshold_single=F(2, 5), threshold_acc=1) \
        == extend(SEED_P)  # threshold_single above p(x) = 3/10 changes nothing here
    assert lossy_laws.exact_sglang_thresholds(SEED_P, SEED_Q, threshold_single=F(1, 4), threshold_acc=1) \
        == [0, 1, 0, 0]  # below it, x is always kept


def test_fly_is_exact_when_its_gate_is_shut_and_lossy_when_open():
    for p, q in random_pairs(12):
        assert lossy_laws.exact_fly(p, q, entropy_threshold=10) == extend(p)  # top-3 entropy is at most ln 3
    laws = [lossy_laws.exact_fly(p, q, window=w) for w in (1, 3, 6) for p, q in [(SEED_P, SEED_Q)]]
    tvs = [total_variation(law, extend(SEED_P)) for law in laws]
    assert tvs[0] > tvs[1] > tvs[2] > 0  # a longer window keeps fewer rejected drafts


def test_relaxed_acceptance_is_greedy_at_top1_and_delta_0_and_keeps_more_as_delta_grows():
    for p, q in random_pairs(13):
        assert lossy_laws.exact_relaxed_acceptance(p, q, topk=1, delta=0) == lossy_laws.greedy_law(p)
    assert lossy_laws.exact_relaxed_acceptance(SEED_P, SEED_Q, delta=F(1, 10)) == lossy_laws.greedy_law(SEED_P)
    assert lossy_laws.exact_relaxed_acceptance(SEED_P, SEED_Q, delta=F(1, 5)) == [0, 1, 0, 0]  # p(1) = p(0) - 1/5


def test_fuzzy_draws_from_p_when_its_threshold_is_below_the_divergence():
    for p, q in random_pairs(14):
        assert lossy_laws.exact_fuzzy(p, q, threshold=-1) == extend(p)
    assert lossy_laws.exact_fuzzy(SEED_P, SEED_Q, threshold=F(1, 100)) == extend(SEED_P)  # JS is about 0.05


def test_typical_acceptance_threshold_falls_with_the_entropy():
    flat, peaked = [F(1, 4)] * 4, [F(97, 100), F(1, 100), F(1, 100), F(1, 100)]
    # alpha exp(-H) is 0.3 / 4 = 0.075 for the flat p, below the threshold 0.09: every draft is kept
    assert lossy_laws.exact_typical_acceptance_entropy(flat, flat) == extend(flat)
    # the peaked p has H about 0.17, so the bar is min(0.09, 0.25) = 0.09: drafts of p = 1/100 are replaced
    law = lossy_laws.exact_typical_acceptance_entropy(peaked, flat)
    assert law == [F(1), 0, 0, 0, 0]
