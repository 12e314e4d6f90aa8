"""The SymPy derivation (symbolic.py): each step must come out as 0, and must fail on a false statement."""

import random
from fractions import Fraction as F

import pytest
import sympy as sp

from speculative.exact import symbolic
from speculative.exact.exact import random_rational_distribution
from speculative.exact.rule import acceptance_rate


def test_token_identities_hold_in_every_case():
    p, q, _ = symbolic.token_cases()
    for lhs, rhs in [
        (q * sp.Min(1, p / q), sp.Min(p, q)),
        (sp.Min(p, q) + sp.Max(p - q, 0), p),
        (sp.Abs(p - q), 2 * sp.Max(p - q, 0) - (p - q)),
    ]:
        assert set(symbolic.prove_token_identity(lhs, rhs).values()) == {0}


def test_token_identity_check_rejects_a_false_identity():
    p, q, _ = symbolic.token_cases()
    # "accepted mass is q" is false whenever p < q; the check must say so.
    cases = symbolic.prove_token_identity(q * sp.Min(1, p / q), q)
    assert cases["p > q"] == 0 and cases["p < q"] != 0


def test_resolve_min_max_refuses_an_undecidable_order():
    a, b = sp.symbols("a b", real=True)
    with pytest.raises(ValueError, match="cannot decide"):
        symbolic.resolve_min_max(sp.Min(a, b))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_sign_pattern_proof(n):
    counts = symbolic.sign_pattern_proof(n)
    assert counts["patterns"] == 3**n
    assert counts["proved"] + counts["infeasible"] == 3**n
    # feasible patterns: all equal, or at least one strict case of each sign
    assert counts["proved"] == 3**n - 2 * (2**n - 1)


def test_general_vocabulary_proof():
    steps = symbolic.general_vocabulary_proof()
    assert steps["mass_difference"] == 0
    assert steps["tv_difference"] == 0
    assert steps["out_difference"] == 0


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_coupling_accepts_more_than_sum_of_minima(n):
    rng = random.Random(n)
    for _ in range(3):
        p, q = random_rational_distribution(n, rng), random_rational_distribution(n, rng)
        assert symbolic.max_acceptance_lp(p, q) == acceptance_rate(p, q)


def test_lp_rejects_mismatched_vocabularies():
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        symbolic.max_acceptance_lp([F(1)], [F(1, 2), F(1, 2)])


def test_expected_tokens_closed_form_matches_the_law_of_accepted_drafts():
    alpha, gamma_symbol = sp.symbols("alpha gamma", positive=True)  # the assumptions symbolic.py uses
    as_sum, closed = symbolic.expected_tokens_per_call()
    for gamma in range(1, 7):
        law = symbolic.accepted_drafts_law(alpha, gamma)
        assert sp.simplify(sum(law.values()) - 1) == 0
        mean = sum((k + 1) * prob for k, prob in law.items())
        assert sp.simplify(mean - closed.subs(gamma_symbol, gamma)) == 0
        assert sp.simplify(as_sum.subs(gamma_symbol, gamma).doit() - mean) == 0


def test_speedup_formula():
    expr = symbolic.speedup()
    alpha, gamma, c = sp.symbols("alpha gamma c", positive=True)
    value = expr.subs({alpha: sp.Rational(4, 5), gamma: 4, c: sp.Rational(1, 20)})
    tokens = sum(sp.Rational(4, 5) ** i for i in range(5))
    assert value == tokens / (4 * sp.Rational(1, 20) + 1)
