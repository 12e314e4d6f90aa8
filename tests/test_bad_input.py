"""Bad input raises ValueError with a message that names the problem, in rule.py and exact.py."""

from fractions import Fraction as F

import pytest

from speculative.exact import exact, multi_draft, rule

P = [F(1, 2), F(1, 2)]


@pytest.mark.parametrize(
    "probs, message",
    [
        ([F(3, 2), F(-1, 2)], "negative"),
        ([1.5, -0.5], "negative"),
        ([float("nan"), 1.0], "NaN"),
        ([float("inf"), 0.0], "inf"),
        ([F(1, 2), F(1, 3)], "not exactly 1"),
        ([0.5, 0.4], "within the tolerance"),
        ([], "empty"),
        (["0.5", "0.5"], "not a real number"),
        ([True, False], "not a real number"),
        ("ab", "sequence"),
        (3, "sequence"),
    ],
)
def test_bad_distribution(probs, message):
    with pytest.raises(ValueError, match=message):
        rule.validate_distribution(probs)
    # every public entry point validates the same way
    with pytest.raises(ValueError, match=message):
        rule.output_distribution(probs, P)
    with pytest.raises(ValueError, match=message):
        multi_draft.multi_draft_step(P, probs, 1)


def test_float_sum_tolerance_is_the_stated_one():
    slack = rule.FLOAT_SUM_TOLERANCE
    rule.validate_distribution([0.5, 0.5 + slack / 2])  # inside: accepted
    with pytest.raises(ValueError, match="tolerance"):
        rule.validate_distribution([0.5, 0.5 + 2 * slack])


def test_exact_sum_has_no_tolerance():
    with pytest.raises(ValueError, match="not exactly 1"):
        rule.validate_distribution([F(1, 2), F(1, 2) + F(1, 10**12)])


def test_mismatched_vocabularies():
    with pytest.raises(ValueError, match="vocabulary mismatch.*3 entries.*2"):
        rule.output_distribution([F(1, 3)] * 3, P)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        rule.acceptance_rate(P, [F(1, 3)] * 3)


def test_drafted_token_with_zero_draft_probability():
    with pytest.raises(ValueError, match="draft probability q = 0"):
        rule.acceptance_probability([F(1, 2), F(1, 2)], [F(1), F(0)], 1)


@pytest.mark.parametrize("token", [-1, 2, 1.0, True])
def test_token_outside_vocabulary(token):
    with pytest.raises(ValueError, match="not an id"):
        rule.acceptance_probability(P, P, token)


@pytest.mark.parametrize("gamma", [0, -1, 1.5, True])
def test_block_needs_a_positive_integer_gamma(gamma):
    model = exact.RandomTableModel(2, seed=0)
    with pytest.raises(ValueError, match="gamma"):
        exact.speculative_block_law(model, model, (), gamma)


def test_block_with_mismatched_toy_vocabularies():
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        exact.speculative_block_law(exact.RandomTableModel(3, 0), exact.RandomTableModel(4, 1), (), 2)


def test_random_distribution_needs_a_vocabulary():
    import random

    with pytest.raises(ValueError, match="vocab_size"):
        exact.random_rational_distribution(0, random.Random(0))
