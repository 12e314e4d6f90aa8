"""Property-based tests (hypothesis): for any rational p and q the one-step output is exactly p."""

from fractions import Fraction as F

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import one_step_by_branches
from speculative.exact import rule


@st.composite
def rational_pair(draw, min_size=1, max_size=50):
    """Two exact distributions over one vocabulary of 1 to 50 tokens; zeros and p = q included."""
    size = draw(st.integers(min_size, max_size))
    weights = st.lists(st.integers(0, 30), min_size=size, max_size=size).filter(any)
    p_weights = draw(weights)
    q_weights = draw(st.one_of(st.just(p_weights), weights))
    return [F(w, sum(p_weights)) for w in p_weights], [F(w, sum(q_weights)) for w in q_weights]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(rational_pair())
def test_output_distribution_equals_target(pair):
    p, q = pair
    assert rule.output_distribution(p, q) == p
    output, accepted, rejected = one_step_by_branches(p, q)  # the event tree, walked apart from rule.py
    assert output == p and accepted == rule.accepted_mass(p, q) and rejected == rule.rejection_mass(p, q)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(rational_pair())
def test_acceptance_rate_is_one_minus_total_variation(pair):
    p, q = pair
    alpha = rule.acceptance_rate(p, q)
    assert alpha == 1 - rule.total_variation(p, q)
    assert alpha == sum(q_x * rule.acceptance_probability(p, q, x) for x, q_x in enumerate(q) if q_x)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(rational_pair())
def test_residual_is_a_distribution_or_unused(pair):
    p, q = pair
    r = rule.normalized_residual(p, q)
    assert sum(r) == 1 and min(r) >= 0
    if rule.rejection_mass(p, q) > 0:
        # r only puts mass where p exceeds q
        assert all(r_x == 0 for r_x, p_x, q_x in zip(r, p, q) if p_x <= q_x)
