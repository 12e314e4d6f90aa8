"""Exact enumeration of gamma-token blocks on toy autoregressive tables (exact.py)."""

from fractions import Fraction as F

import pytest

from speculative.exact import exact


def _pair(vocab_size, seed):
    return exact.RandomTableModel(vocab_size, seed=2 * seed), exact.RandomTableModel(vocab_size, seed=2 * seed + 1)


@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("vocab_size, seed", [(2, 0), (3, 1), (3, 2), (4, 3)])
def test_joint_law_of_emitted_tokens_equals_target(gamma, vocab_size, seed):
    target, draft = _pair(vocab_size, seed)
    n_tokens = gamma + 1  # long enough to contain a full block with its bonus token
    speculative = exact.speculative_sequence_law(target, draft, (0,), gamma, n_tokens)
    reference = exact.target_sequence_law(target, (0,), n_tokens)
    assert all(len(seq) == n_tokens for seq in reference)  # whole sequences, not single tokens
    assert speculative == reference
    assert sum(speculative.values()) == 1


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_first_token_of_a_block_has_the_target_law(gamma):
    target, draft = _pair(3, 5)
    block = exact.speculative_block_law(target, draft, (), gamma)
    first = [sum((prob for seq, prob in block.items() if seq[0] == token), F(0)) for token in range(3)]
    assert first == list(target(()))
    assert all(1 <= len(seq) <= gamma + 1 for seq in block)
    assert sum(block.values()) == 1


def test_block_law_detects_a_wrong_draft_table():
    # The check has power: a block whose residual is built against the wrong q is not the target's law.
    target, draft = _pair(3, 7)

    def stale_draft_ratio(context):  # q used in the ratio from the context one step back (a rollback bug)
        return draft(context[:-1]) if context else draft(context)

    good = exact.speculative_sequence_law(target, draft, (1,), 2, 3)
    reference = exact.target_sequence_law(target, (1,), 3)
    assert exact.law_total_variation(good, reference) == 0
    # Drafting from one table but verifying with another is not a valid scheme: the law moves away from p.
    wrong = _biased_sequence_law(target, draft, stale_draft_ratio, (1,), 2, 3)
    assert exact.law_total_variation(wrong, reference) > 0


def _biased_sequence_law(target, draft_sampled, draft_in_ratio, context, gamma, n_tokens):
    """Enumerate blocks where drafts come from one table but the ratio uses another (a planted bug)."""
    from collections import defaultdict

    from speculative.exact.rule import normalized_residual

    law = defaultdict(F)

    def block(ctx):
        out = defaultdict(F)

        def extend(prefix, prob):
            here = ctx + prefix
            if len(prefix) == gamma:
                for y, py in enumerate(target(here)):
                    out[prefix + (y,)] += prob * py
                return
            p, q_sampled, q_ratio = target(here), draft_sampled(here), draft_in_ratio(here)
            r = normalized_residual(p, q_ratio)
            for x, q in enumerate(q_sampled):
                if q == 0:
                    continue
                accept = min(1, p[x] / q_ratio[x]) if q_ratio[x] else F(1)
                extend(prefix + (x,), prob * q * accept)
                for y, ry in enumerate(r):
                    out[prefix + (y,)] += prob * q * (1 - accept) * ry

        extend((), F(1))
        return out

    def run(emitted, prob):
        if len(emitted) >= n_tokens:
            law[emitted[:n_tokens]] += prob
            return
        for seq, pb in block(context + emitted).items():
            if pb:
                run(emitted + seq, prob * pb)

    run((), F(1))
    return dict(law)


def test_law_total_variation():
    assert exact.law_total_variation({(0,): F(1)}, {(1,): F(1)}) == 1
    assert exact.law_total_variation({(0,): F(1, 2), (1,): F(1, 2)}, {(0,): F(1)}) == F(1, 2)


def test_random_table_model_is_reproducible():
    a, b = exact.RandomTableModel(5, seed=3), exact.RandomTableModel(5, seed=3)
    assert a((1, 2)) == b((1, 2))
    assert sum(a((4,))) == 1
    assert a((1,)) != exact.RandomTableModel(5, seed=4)((1,))
