"""SymPy derivations of the rule: P(out = x) = p(x), alpha = sum min(p, q) = 1 - TV, optimality, cost.

Explained in: notebooks/02_derivation.

SymPy cannot prove an identity that contains ``Min`` or ``Max`` until it knows which argument is smaller.
:func:`resolve_min_max` settles each ``Min``/``Max`` whose order SymPy *can prove* from the symbols'
assumptions and refuses otherwise, so every case below is decided by SymPy, never by us.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Sequence

import sympy as sp

__all__ = [
    "resolve_min_max",
    "token_cases",
    "prove_token_identity",
    "sign_pattern_proof",
    "general_vocabulary_proof",
    "max_acceptance_lp",
    "expected_tokens_per_call",
    "accepted_drafts_law",
    "speedup",
]


def _order(a: sp.Expr, b: sp.Expr) -> bool:
    """Return True if a <= b is provable, False if a > b is provable; raise if neither."""
    difference = sp.simplify(b - a)
    if difference.is_nonnegative:
        return True
    if difference.is_negative:
        return False
    raise ValueError(f"SymPy cannot decide the order of {a} and {b}; add a case split")


def resolve_min_max(expr: sp.Expr) -> sp.Expr:
    """Return ``expr`` with every Min/Max of two arguments replaced by the argument SymPy proves it equals."""

    def settle(node):
        if isinstance(node, (sp.Min, sp.Max)):
            args = [settle(a) for a in node.args]
            if len(args) != 2:
                raise ValueError(f"only two-argument Min/Max are resolved, got {node}")
            a_le_b = _order(*args)
            smaller, larger = (args[0], args[1]) if a_le_b else (args[1], args[0])
            return smaller if isinstance(node, sp.Min) else larger
        if node.args:
            return node.func(*[settle(a) for a in node.args])
        return node

    return settle(sp.sympify(expr))


def token_cases() -> tuple[sp.Symbol, sp.Symbol, dict[str, dict]]:
    """Return symbols p, q (positive) and the three cases for one token: p > q, p < q and p = q.

    Each case is a substitution that makes the order provable: p = q + d or q = p + d with d > 0.
    """
    p, q, d = sp.symbols("p q d", positive=True)
    return p, q, {"p > q": {p: q + d}, "p < q": {q: p + d}, "p = q": {p: q}}


def prove_token_identity(lhs: sp.Expr, rhs: sp.Expr) -> dict[str, sp.Expr]:
    """Return, for each case of :func:`token_cases`, lhs - rhs after resolving Min/Max and simplifying.

    The identity holds for every positive p and q exactly when every returned value is 0.
    """
    _, _, cases = token_cases()
    return {name: sp.simplify(resolve_min_max((lhs - rhs).subs(sub))) for name, sub in cases.items()}


def sign_pattern_proof(n: int) -> dict[str, int]:
    """Prove P(out = x) = p(x) for all x, with fully symbolic p and q over ``n`` tokens.

    Every token is in one of three cases (p > q, p < q, p = q), so there are 3**n sign patterns. In each,
    Min/Max are resolved by SymPy, the constraint sum(p) = 1 is imposed by eliminating one symbol, and
    out(x) - p(x) must simplify to 0 for every x. Patterns where every strict case points the same way
    contradict sum(p) = sum(q) = 1 and are counted as infeasible. Returns the counts; raises
    ``AssertionError`` if any pattern fails.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    proved = infeasible = 0
    for pattern in itertools.product(("p > q", "p < q", "p = q"), repeat=n):
        if ("p > q" in pattern) != ("p < q" in pattern):
            infeasible += 1  # sum(p - q) = 0 cannot hold with all strict differences of one sign
            continue
        base = sp.symbols(f"b1:{n + 1}", positive=True)
        gap = sp.symbols(f"d1:{n + 1}", positive=True)
        target, draft = [], []
        for case, b, d in zip(pattern, base, gap):
            target.append(b + d if case == "p > q" else b)
            draft.append(b + d if case == "p < q" else b)
        accepted = [resolve_min_max(sp.Min(p, q)) for p, q in zip(target, draft)]
        owed = [resolve_min_max(sp.Max(p - q, 0)) for p, q in zip(target, draft)]
        alpha, mass = sum(accepted), sum(owed)
        # impose sum(p) = 1 by solving it for the last base symbol (after the order is settled)
        constraint = {base[-1]: sp.solve(sp.Eq(sum(target), 1), base[-1])[0]}
        for x in range(n):
            if mass == 0:
                out = accepted[x]
            else:
                out = accepted[x] + (1 - alpha) * owed[x] / mass
            if sp.simplify((out - target[x]).subs(constraint)) != 0:
                raise AssertionError(f"pattern {pattern}, token {x}: out - p does not vanish")
        proved += 1
    return {"patterns": 3**n, "proved": proved, "infeasible": infeasible}


def general_vocabulary_proof() -> dict[str, sp.Expr]:
    """Return the steps that prove P(out = x) = p(x) for a vocabulary of any size n, as SymPy objects.

    The per-token identities come from :func:`prove_token_identity`; the sums use only linearity and
    sum(p) = 1, with n left symbolic. Each returned ``*_difference`` entry must be 0.
    """
    p, q, _ = token_cases()
    P, Q = sp.IndexedBase("p"), sp.IndexedBase("q")
    j, n = sp.symbols("j n", integer=True, positive=True)
    total = lambda term: sp.Sum(term, (j, 1, n))  # noqa: E731 - a one-line shorthand for the sums below

    def termwise(lhs, rhs):
        assert all(v == 0 for v in prove_token_identity(lhs, rhs).values()), (lhs, rhs)
        return lhs, rhs

    # (1) per token: residual = p - min(p, q); |p - q| = 2 max(p - q, 0) - (p - q); accepted + residual = p
    termwise(sp.Max(p - q, 0), p - sp.Min(p, q))
    termwise(sp.Abs(p - q), 2 * sp.Max(p - q, 0) - (p - q))
    termwise(q * sp.Min(1, p / q), sp.Min(p, q))
    termwise(sp.Min(p, q) + sp.Max(p - q, 0), p)
    alpha = total(sp.Min(P[j], Q[j]))
    mass = total(P[j] - sp.Min(P[j], Q[j]))  # the residual's mass, by (1)
    # (2) residual mass = sum(p) - alpha = 1 - alpha
    mass_difference = mass.expand().subs(total(P[j]), 1) - (1 - alpha)
    # (3) TV = (1/2) sum |p - q| = sum max(p - q, 0) - (1/2)(sum p - sum q) = 1 - alpha
    tv = sp.Rational(1, 2) * total(2 * (P[j] - sp.Min(P[j], Q[j])) - (P[j] - Q[j]))
    tv_value = tv.expand().doit().subs({total(P[j]): 1, total(Q[j]): 1})
    tv_difference = sp.simplify(tv_value - (1 - alpha))
    # (4) output of token x: accepted(x) + (1 - alpha) * residual(x) / mass, with mass = 1 - alpha
    a_x, m_x, A = sp.symbols("a_x m_x A", positive=True)  # min(p_x, q_x), max(p_x - q_x, 0), alpha < 1
    out_difference = sp.simplify(a_x + (1 - A) * m_x / (1 - A) - (a_x + m_x))
    return {
        "alpha": alpha,
        "residual_mass": mass,
        "mass_difference": sp.simplify(mass_difference.doit()),
        "tv": tv,
        "tv_difference": tv_difference,
        "out_difference": out_difference,
    }


def max_acceptance_lp(target_probs: Sequence[Fraction], draft_probs: Sequence[Fraction]) -> sp.Rational:
    """Return the largest P(output = draft) over all couplings of draft ~ q and output ~ p, solved exactly.

    Any valid scheme that accepts a draft x and emits it, while emitting tokens with law p, defines such a
    coupling, so this is the best acceptance rate any valid scheme can reach (a linear program over the
    n x n joint table, solved in exact rationals by SymPy's simplex).
    """
    from sympy.solvers.simplex import lpmax

    n = len(target_probs)
    if len(draft_probs) != n:
        raise ValueError(f"vocabulary mismatch: {n} target entries, {len(draft_probs)} draft entries")
    joint = sp.Matrix(n, n, lambda i, k: sp.Symbol(f"pi_{i}_{k}"))  # no sign assumption: `>= 0` must stay a constraint
    constraints = [joint[i, k] >= 0 for i in range(n) for k in range(n)]
    constraints += [sp.Eq(sum(joint.row(i)), sp.Rational(draft_probs[i])) for i in range(n)]
    constraints += [sp.Eq(sum(joint.col(k)), sp.Rational(target_probs[k])) for k in range(n)]
    best, _ = lpmax(sum(joint[i, i] for i in range(n)), constraints)
    return best


def accepted_drafts_law(alpha: sp.Expr, gamma: int) -> dict[int, sp.Expr]:
    """Return P(N = k) for the number N of accepted drafts in a block of ``gamma``, i.i.d. acceptances."""
    return {k: (alpha**k * (1 - alpha) if k < gamma else alpha**gamma) for k in range(gamma + 1)}


def expected_tokens_per_call() -> tuple[sp.Expr, sp.Expr]:
    """Return (symbolic sum, closed form) of E[tokens per target call] = sum_{i=0}^{gamma} alpha^i."""
    alpha, gamma = sp.symbols("alpha gamma", positive=True)
    i = sp.symbols("i", integer=True, nonnegative=True)
    as_sum = sp.Sum(alpha**i, (i, 0, gamma))
    return as_sum, (1 - alpha ** (gamma + 1)) / (1 - alpha)


def speedup() -> sp.Expr:
    """Return the expected wall-time factor (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

    One block costs gamma draft forwards (c each, in units of one target forward) plus one target
    forward, and yields E[tokens per call] tokens; plain decoding yields one token per target forward.
    """
    alpha, gamma, c = sp.symbols("alpha gamma c", positive=True)
    _, tokens = expected_tokens_per_call()
    return tokens / (gamma * c + 1)
