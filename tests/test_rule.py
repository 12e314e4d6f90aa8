"""Exact tests of the one-step rule (rule.py) with Fractions: the seed's example and the edge cases."""

from fractions import Fraction as F

import pytest

from conftest import one_step_by_branches
from speculative.exact import rule

SEED_P = [F(1, 2), F(3, 10), F(1, 5)]  # target p over {A, B, C}
SEED_Q = [F(1, 5), F(1, 2), F(3, 10)]  # draft q


def test_seed_example_step_by_step():
    # The seed article's hand computation; each figure below is the article's, reproduced by the rule.
    assert rule.accepted_mass(SEED_P, SEED_Q) == [F(1, 5), F(3, 10), F(1, 5)]
    assert rule.acceptance_rate(SEED_P, SEED_Q) == F(7, 10)
    assert rule.rejection_mass(SEED_P, SEED_Q) == F(3, 10)
    assert rule.residual(SEED_P, SEED_Q) == [F(3, 10), 0, 0]
    assert rule.normalized_residual(SEED_P, SEED_Q) == [1, 0, 0]
    assert rule.output_distribution(SEED_P, SEED_Q) == SEED_P


def test_seed_example_results_are_exact_fractions():
    for value in rule.output_distribution(SEED_P, SEED_Q) + rule.normalized_residual(SEED_P, SEED_Q):
        assert isinstance(value, F)


def test_acceptance_probability_per_token():
    assert rule.acceptance_probability(SEED_P, SEED_Q, 0) == 1  # p(A) > q(A)
    assert rule.acceptance_probability(SEED_P, SEED_Q, 1) == F(3, 5)  # (3/10) / (1/2)
    assert rule.acceptance_probability(SEED_P, SEED_Q, 2) == F(2, 3)  # (1/5) / (3/10)


def test_branch_enumeration_agrees_with_closed_form():
    output, accepted, rejected = one_step_by_branches(SEED_P, SEED_Q)
    assert output == rule.output_distribution(SEED_P, SEED_Q) == SEED_P
    assert accepted == rule.accepted_mass(SEED_P, SEED_Q)
    assert rejected == rule.rejection_mass(SEED_P, SEED_Q)


def test_p_equals_q_never_divides(monkeypatch):
    p = [F(1, 3), F(1, 6), F(1, 2)]
    # Make any division by the residual's mass fail loudly: it must not happen when that mass is 0.
    original = F.__truediv__

    def guarded(self, other):
        if other == 0:
            raise AssertionError("division by a zero residual mass")
        return original(self, other)

    monkeypatch.setattr(F, "__truediv__", guarded)
    assert rule.rejection_mass(p, p) == 0
    assert rule.acceptance_rate(p, p) == 1
    assert rule.output_distribution(p, p) == p
    assert rule.normalized_residual(p, p) == p  # the unreachable branch falls back to p, not NaN
    assert one_step_by_branches(p, p)[0] == p


def test_p_equals_q_in_floats_gives_no_nan():
    p = [0.25, 0.25, 0.5]
    out = rule.output_distribution(p, p)
    assert out == p
    assert all(value == value for value in rule.normalized_residual(p, p))  # NaN != NaN


def test_zeros_in_p():
    p = [F(0), F(1, 2), F(1, 2)]
    q = [F(1, 2), F(1, 4), F(1, 4)]
    assert rule.acceptance_probability(p, q, 0) == 0  # a token the target never emits is always rejected
    assert rule.output_distribution(p, q) == p
    assert rule.normalized_residual(p, q)[0] == 0


def test_zeros_in_q():
    p = [F(1, 4), F(1, 4), F(1, 2)]
    q = [F(0), F(1, 2), F(1, 2)]
    # Token 0 is never drafted: all of p(0) must come from the residual.
    assert rule.residual(p, q)[0] == F(1, 4)
    assert rule.output_distribution(p, q) == p


@pytest.mark.parametrize("target_token, draft_token", [(0, 0), (0, 2), (2, 1)])
def test_one_hot_distributions(target_token, draft_token):
    p = [F(int(i == target_token)) for i in range(3)]
    q = [F(int(i == draft_token)) for i in range(3)]
    expected_alpha = 1 if target_token == draft_token else 0
    assert rule.acceptance_rate(p, q) == expected_alpha
    assert rule.output_distribution(p, q) == p
    assert rule.normalized_residual(p, q) == p  # either the one-hot residual or the p = q fallback


def test_float_inputs_follow_the_same_rule():
    p = [0.5, 0.3, 0.2]
    q = [0.2, 0.5, 0.3]
    assert rule.output_distribution(p, q) == pytest.approx(p, abs=1e-15)
    assert rule.acceptance_rate(p, q) == pytest.approx(1 - rule.total_variation(p, q), abs=1e-15)


def test_total_variation_of_seed_pair():
    assert rule.total_variation(SEED_P, SEED_Q) == F(3, 10)
    assert rule.total_variation(SEED_P, SEED_P) == 0
