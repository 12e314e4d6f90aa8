"""Block verification and several drafts per position: exact laws, batched samplers, wrong variants.

Exact tests compare Fractions, so they cannot fail by chance. Statistical tests reject at p < 1e-6
(stats.FALSE_ALARM_RATE) with fixed seeds; under a correct sampler each fails with probability about
1e-6 (the chi-square approximation). Their power is stated where they are set up: each sabotage test
computes, from the exact wrong law, the probability that its sample size rejects the wrong rule.
"""

import itertools
from fractions import Fraction as F

import numpy as np
import pytest
import torch

from speculative.audit.pitfalls import MULTI_DRAFT_PITFALLS, find
from speculative.exact import exact, multi_draft
from speculative.exact.pitfall_laws import extend
from speculative.exact.rule import total_variation
from speculative.sampling import stats
from speculative.sampling.sampler import (
    Randomness,
    block_verify_sample,
    draw_candidates,
    draw_randomness,
    multi_draft_sample,
    rejection_sample,
    rule_sampler,
)

SEED_P = [F(1, 2), F(3, 10), F(1, 5)]
SEED_Q = [F(1, 5), F(1, 2), F(3, 10)]


def _pair(vocab, seed):
    return exact.RandomTableModel(vocab, seed=2 * seed), exact.RandomTableModel(vocab, seed=2 * seed + 1)


# --------------------------------------------------------------------------- exact: block verification


def test_sun_et_al_binary_example_matches_the_paper():
    # The paper's gamma = 2 values (Sun et al., ICLR 2025, section 1): 10/9 token-wise, 11/9 block.
    rows = exact.sun_example_table((2, 3, 4))
    assert (rows[0]["token"], rows[0]["block"]) == (F(10, 9), F(11, 9))
    # token-wise: alpha + ... + alpha^gamma with alpha = 2/3, computed independently of the enumeration
    for row in rows:
        assert row["token"] == sum(F(2, 3) ** i for i in range(1, row["gamma"] + 1))
        assert row["block"] > row["token"]


@pytest.mark.parametrize("gamma, vocab, seed", [(gamma, vocab, seed) for gamma in (1, 2, 3, 4)
                                                 for vocab, seed in [(2, 0), (3, 1), (3, 2), (4, 3)]
                                                 if vocab ** gamma <= 81])  # draft sequences per block
def test_block_verification_keeps_the_target_law_exactly(gamma, vocab, seed):
    target, draft = _pair(vocab, seed)
    n_tokens = gamma + 1
    law = exact.sequence_law(lambda c: exact.block_verification_law(target, draft, c, gamma), (0,), n_tokens)
    assert law == exact.target_sequence_law(target, (0,), n_tokens)


@pytest.mark.parametrize("gamma", [1, 2, 3, 4])
@pytest.mark.parametrize("vocab, seed", [(2, 4), (3, 5), (3, 6), (4, 7)])
def test_block_verification_never_emits_fewer_tokens_and_equals_token_wise_at_gamma_1(gamma, vocab, seed):
    target, draft = _pair(vocab, seed)
    for context in [(), (0,), (1, 0)]:
        token = exact.speculative_block_law(target, draft, context, gamma)
        block = exact.block_verification_law(target, draft, context, gamma)
        assert exact.expected_length(block) >= exact.expected_length(token)
        if gamma == 1:
            assert block == token


def test_block_verification_can_be_strictly_better_and_coincides_with_token_wise_when_greedy():
    target, draft = _pair(3, 1)
    gains = [exact.expected_length(exact.block_verification_law(target, draft, (c,), 3))
             - exact.expected_length(exact.speculative_block_law(target, draft, (c,), 3)) for c in range(3)]
    assert max(gains) > 0

    def greedy(model):  # the one-hot of the lowest arg-max
        def table(context):
            probs = model(context)
            best = probs.index(max(probs))
            return [F(int(t == best)) for t in range(len(probs))]
        return table
    for gamma in (2, 3):
        assert (exact.block_verification_law(greedy(target), draft, (), gamma)
                == exact.speculative_block_law(greedy(target), draft, (), gamma))


def test_a_wrong_block_rule_is_caught_by_the_exact_check():
    # vllm-ascend #7807: the block path reused the token-wise acceptance test and residual. Planted here:
    # positions kept with the token-wise ratio p_i, but tau chosen as the largest kept one.
    target, draft = _pair(3, 2)

    def wrong_block(context, gamma=2):
        from collections import defaultdict

        law = defaultdict(F)
        for drafts in itertools.product(range(3), repeat=gamma):
            prob = F(1)
            for i, x in enumerate(drafts):
                prob *= draft(context + drafts[:i])[x]
            if not prob:
                continue
            keep = [min(F(1), target(context + drafts[:i])[x] / draft(context + drafts[:i])[x])
                    for i, x in enumerate(drafts)]
            for tau in range(gamma, -1, -1):
                chance = (keep[tau - 1] if tau else F(1)) * np.prod([1 - k for k in keep[tau:]], dtype=object)
                here = context + drafts[:tau]
                final = target(here) if tau == gamma else exact.normalized_residual(target(here), draft(here))
                for y, f in enumerate(final):
                    law[drafts[:tau] + (y,)] += prob * chance * f
        return dict(law)

    law = exact.sequence_law(wrong_block, (0,), 3)
    assert exact.law_total_variation(law, exact.target_sequence_law(target, (0,), 3)) > 0


# --------------------------------------------------------------------------- exact: several drafts, trees


@pytest.mark.parametrize("scheme", multi_draft.SCHEMES)
@pytest.mark.parametrize("branching", [(2,), (3,), (2, 1), (1, 2), (2, 2), (3, 1, 1)])
def test_tree_rules_keep_the_law_exactly_and_the_wrong_ones_do_not(scheme, branching):
    wrong = scheme not in multi_draft.LOSSLESS_SCHEMES
    distances = []
    for seed in range(4):
        target, draft = _pair(3, 10 + seed)
        n_tokens = len(branching) + 1
        law = exact.sequence_law(lambda c, t=target, d=draft: multi_draft.tree_law(t, d, c, branching, scheme, F(1, 2)),
                                 (0,), n_tokens)
        assert sum(law.values()) == 1
        distances.append(exact.law_total_variation(law, exact.target_sequence_law(target, (0,), n_tokens)))
    if wrong:
        assert max(distances) > 0, "the exact check must see the wrong variant on some model"
    else:
        assert distances == [0, 0, 0, 0]


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_one_chain_tree_is_token_wise_verification(gamma):
    target, draft = _pair(3, 20)
    chain = exact.speculative_block_law(target, draft, (1,), gamma)
    assert multi_draft.tree_law(target, draft, (1,), (1,) * gamma) == chain


def test_more_drafts_accept_more_on_the_three_token_example():
    rows = {row["scheme"]: row for row in multi_draft.multi_draft_table()}
    alpha = sum(min(p, q) for p, q in zip(SEED_P, SEED_Q))
    assert rows["with_replacement"]["acceptance"][0] == rows["without_replacement"]["acceptance"][0] == alpha
    for scheme in multi_draft.LOSSLESS_SCHEMES:
        acceptance = rows[scheme]["acceptance"]
        assert acceptance == sorted(acceptance) and acceptance[-1] > acceptance[0]
        assert rows[scheme]["tv"] == [0, 0, 0]
    # without replacement, k = V candidates cover every token: one of them is always accepted
    assert rows["without_replacement"]["acceptance"][2] == 1
    # a fixed top-1 list is accepted with p(argmax q) only: below a single random draft
    assert rows["top_k"]["acceptance"][0] == SEED_P[SEED_Q.index(max(SEED_Q))] < alpha
    assert any(rows["top_k_threshold"]["tv"])


def test_the_wrong_multi_draft_variants_bite_on_their_demo_pairs():
    for pitfall in MULTI_DRAFT_PITFALLS:
        law = pitfall.exact_law()
        assert sum(law) == 1
        assert total_variation(law, extend(pitfall.demo_p)) > F(1, 5)
        assert find(pitfall.key) is pitfall


def test_multi_draft_bad_input():
    with pytest.raises(ValueError, match="drafts"):
        multi_draft.multi_draft_step(SEED_P, SEED_Q, 0)
    with pytest.raises(ValueError, match="unknown scheme"):
        multi_draft.multi_draft_step(SEED_P, SEED_Q, 2, "tree")
    with pytest.raises(ValueError, match="threshold"):
        multi_draft.multi_draft_step(SEED_P, SEED_Q, 2, "top_k_threshold", F(3, 2))
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        multi_draft.multi_draft_step(SEED_P, SEED_Q + [F(0)], 2)
    with pytest.raises(ValueError, match="sums to 6/5"):
        multi_draft.multi_draft_step(SEED_P, SEED_Q[:2] + [F(1, 2)], 2)
    with pytest.raises(ValueError, match="branching"):
        multi_draft.tree_law(lambda c: SEED_P, lambda c: SEED_Q, (), ())


# --------------------------------------------------------------------------- the batched block sampler


def _block_inputs(target, draft, vocab, gamma, n, generator, dtype=torch.float64):
    """Draw n blocks of gamma drafts from the draft table and look up p and q along each."""
    sequences = list(itertools.product(range(vocab), repeat=gamma))
    weights = []
    for seq in sequences:
        prob = F(1)
        for i, x in enumerate(seq):
            prob *= draft(seq[:i])[x]
        weights.append(float(prob))
    index = torch.multinomial(torch.tensor(weights, dtype=torch.float64), n, replacement=True, generator=generator)
    tokens = torch.tensor(sequences)[index]
    q = torch.tensor([[[float(v) for v in draft(s[:i])] for i in range(gamma)] for s in sequences], dtype=dtype)
    p = torch.tensor([[[float(v) for v in target(s[:i])] for i in range(gamma + 1)] for s in sequences], dtype=dtype)
    return tokens, q[index], p[index]


def _fit(rows, law):
    """Chi-square of the emitted blocks against ``law``; the last cell counts blocks the law rules out, so
    any of them makes the test reject (p = 0)."""
    outcomes = list(law)
    cell = {o: i for i, o in enumerate(outcomes)}
    counts = np.zeros(len(outcomes) + 1, dtype=np.int64)
    for row in rows:
        counts[cell.get(tuple(row), len(outcomes))] += 1
    probs = [float(law[o]) for o in outcomes] + [0.0]
    if counts[-1] == 0:
        counts, probs = counts[:-1], probs[:-1]
    return stats.goodness_of_fit(counts, probs)


def _bonus_from_draft(law, draft, gamma):
    """The law ``law`` would have if the bonus token (after all gamma drafts are kept) came from the draft's
    q instead of the target's p: the mass of each kept block is spread over the next token by q."""
    wrong = {o: v for o, v in law.items() if len(o) <= gamma}
    for prefix in {o[:-1] for o in law if len(o) == gamma + 1}:
        kept = sum(v for o, v in law.items() if len(o) == gamma + 1 and o[:-1] == prefix)
        for y, q_y in enumerate(draft(prefix)):
            wrong[prefix + (y,)] = kept * q_y
    return wrong


@pytest.mark.parametrize("vocab, gamma, seed", [(3, 3, 30), (2, 4, 31), (4, 2, 32)])
def test_block_sampler_follows_the_exact_block_law(vocab, gamma, seed):
    target, draft = _pair(vocab, seed)
    generator = torch.Generator().manual_seed(seed)
    n = 100_000
    tokens, q, p = _block_inputs(target, draft, vocab, gamma, n, generator)
    out = block_verify_sample(tokens, q, p, generator)
    law = exact.block_verification_law(target, draft, (), gamma)
    assert _fit(out.rows(), law).p_value >= stats.FALSE_ALARM_RATE
    # Power, from exact wrong laws: the token-wise law (what a block path that reuses the token-wise rule
    # emits, vllm-ascend #7807) and the bonus token drawn from q instead of p; this sample rejects each one
    # that differs from the block law with probability > 0.99, and on every parametrisation one does
    token_law = exact.speculative_block_law(target, draft, (), gamma)
    differing = [wrong for wrong in (token_law, _bonus_from_draft(law, draft, gamma))
                 if exact.law_total_variation(law, wrong) > 0]
    assert differing
    for wrong in differing:
        outcomes = sorted(set(law) | set(wrong))
        right_probs, wrong_probs = ([float(x.get(o, 0)) for o in outcomes] for x in (law, wrong))
        assert stats.power(n, right_probs, wrong_probs) > 0.99
    if exact.law_total_variation(law, token_law) > F(1, 100):
        token_out = rejection_sample(tokens, q, p, generator)
        assert _fit(token_out.rows(), law).p_value < stats.FALSE_ALARM_RATE  # sabotage: the other rule fails


def test_block_sampler_with_per_row_lengths_is_each_row_alone_draw_for_draw():
    # a row of length L among longer padded rows is verified exactly as a call on its first L drafts
    generator = torch.Generator().manual_seed(42)
    batch, k, vocab = 600, 4, 5
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=generator) * 2, -1).double()
    q = torch.softmax(torch.randn(batch, k, vocab, generator=generator) * 2, -1).double()
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=generator).reshape(batch, k)
    lengths = torch.randint(1, k + 1, (batch,), generator=generator)
    randomness = draw_randomness(batch, k, generator)
    out = block_verify_sample(drafts, q, p, randomness=randomness, lengths=lengths)
    seen = set()
    for length in range(1, k + 1):
        rows = (lengths == length).nonzero().squeeze(1)
        alone = block_verify_sample(drafts[rows, :length], q[rows, :length], p[rows, :length + 1],
                                    randomness=Randomness(randomness.uniforms[rows, :length + 1]))
        assert torch.equal(out.num_accepted[rows], alone.num_accepted)
        assert torch.equal(out.tokens[rows, :length + 1], alone.tokens)
        assert bool((out.tokens[rows, length + 1:] == -1).all())
        seen |= {(length, int(a)) for a in alone.num_accepted}
    assert {(length, length) for length in range(1, k + 1)} <= seen and (k, 0) in seen  # bonus and rejection paths
    full = block_verify_sample(drafts, q, p, randomness=randomness, lengths=torch.full((batch,), k))
    assert torch.equal(full.tokens, block_verify_sample(drafts, q, p, randomness=randomness).tokens)
    for bad in (torch.zeros(batch, dtype=torch.long), torch.full((batch,), k + 1),
                torch.ones(batch + 1, dtype=torch.long)):
        with pytest.raises(ValueError, match="lengths must"):
            block_verify_sample(drafts, q, p, randomness=randomness, lengths=bad)


def test_block_sampler_at_gamma_1_is_token_wise_draw_for_draw():
    generator = torch.Generator().manual_seed(40)
    batch, vocab = 512, 7
    p = torch.softmax(torch.randn(batch, 2, vocab, generator=generator), -1)
    q = torch.softmax(torch.randn(batch, 1, vocab, generator=generator), -1)
    drafts = torch.multinomial(q[:, 0], 1, generator=generator)
    randomness = draw_randomness(batch, 1, generator)
    a = block_verify_sample(drafts, q, p, randomness=randomness)
    b = rejection_sample(drafts, q, p, randomness=randomness)
    assert torch.equal(a.tokens, b.tokens)


def test_block_sampler_equals_token_wise_when_the_target_is_greedy():
    generator = torch.Generator().manual_seed(41)
    batch, k, vocab = 1024, 4, 5
    logits = torch.randn(batch, k + 1, vocab, generator=generator)
    p = torch.nn.functional.one_hot(logits.argmax(-1), vocab).double()
    q = torch.softmax(torch.randn(batch, k, vocab, generator=generator), -1).double()
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=generator).reshape(batch, k)
    randomness = draw_randomness(batch, k, generator)
    a = block_verify_sample(drafts, q, p, randomness=randomness)
    b = rejection_sample(drafts, q, p, randomness=randomness)
    assert torch.equal(a.tokens, b.tokens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_block_sampler_edge_cases_never_give_nan_or_a_bad_id(dtype):
    generator = torch.Generator().manual_seed(42)
    batch, k, vocab = 256, 4, 11
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=generator) * 3, -1).to(dtype)
    q = p[:, :k].clone()  # p = q: every ratio is 1, every residual 0
    drafts = torch.multinomial(q.float().reshape(-1, vocab), 1, generator=generator).reshape(batch, k)
    for uniform in (0.0, float(np.nextafter(np.float32(1), np.float32(0)))):
        randomness = Randomness(torch.full((batch, k + 1), uniform, dtype=torch.float64))
        out = block_verify_sample(drafts, q, p, randomness=randomness, check_values=False)
        assert ((out.tokens >= -1) & (out.tokens < vocab)).all()
        assert bool((out.num_accepted == k).all())  # p = q: the whole block is kept
    # every draft ruled out by p: q puts all its mass on a token p gives 0, so nothing is kept
    p = torch.zeros(batch, k + 1, vocab, dtype=dtype)
    p[..., 0] = 1
    q = torch.zeros(batch, k, vocab, dtype=dtype)
    q[..., 1] = 1
    out = block_verify_sample(torch.ones(batch, k, dtype=torch.long), q, p, generator)
    assert bool((out.num_accepted == 0).all()) and bool((out.tokens[:, 0] == 0).all())
    # a residual of zero mass at the cut (p a hair below q everywhere, as rounding can leave it): with the
    # uniforms just below 1 no position is kept, the weights max(p - q, 0) are all 0, and the sampler must
    # fall back to p instead of dividing 0 by 0
    logits = torch.randn(batch, k, vocab, generator=generator, dtype=torch.float64)
    logits[..., -1] = -float("inf")  # the last id has probability 0: a sampler that falls through lands there
    q = torch.softmax(logits, -1)
    p = torch.cat([q, q[:, :1]], 1) * 0.99  # a shortfall that survives rounding to half precision
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=generator).reshape(batch, k)
    high = Randomness(torch.full((batch, k + 1), float(np.nextafter(np.float32(1), np.float32(0))),
                                 dtype=torch.float64))
    out = block_verify_sample(drafts, q.to(dtype), p.to(dtype), randomness=high, check_values=False)
    assert bool((out.num_accepted == 0).all())
    first = out.tokens[:, 0]
    assert bool(((first >= 0) & (first < vocab)).all())
    assert bool((p[torch.arange(batch), 0, first] > 0).all())  # a token of p, never a made-up one


def test_block_sampler_refuses_bad_input_like_the_token_wise_one():
    generator = torch.Generator().manual_seed(43)
    q = torch.full((2, 3, 4), 0.25)
    p = torch.full((2, 4, 4), 0.25)
    drafts = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="target_probs has shape"):
        block_verify_sample(drafts, q, p[:, :3], generator)
    bad = p.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        block_verify_sample(drafts, q, bad, generator)
    with pytest.raises(ValueError, match="unknown verification rule"):
        rule_sampler("tree")
    assert rule_sampler("block") is block_verify_sample


@pytest.mark.slow
def test_the_audit_passes_block_verification_and_tells_the_two_rules_apart(battery):
    from speculative.audit.core import audit_sampler

    cases = [c for c in battery if c.law == "block" and c.gamma >= 2][:3]
    assert audit_sampler(block_verify_sample, rule="block", cases=cases).passed
    # each rule audited as the other fails: the audit's block law tells them apart
    assert not audit_sampler(block_verify_sample, rule="token", cases=cases).passed
    assert not audit_sampler(rejection_sample, rule="block", cases=cases).passed


# --------------------------------------------------------------------------- the batched multi-draft sampler


# two pairs: the second is one where judging without-replacement drafts against the plain q is wrong
PAIRS = [([F(1, 2), F(1, 4), F(1, 8), F(1, 8)], [F(1, 8), F(1, 4), F(1, 2), F(1, 8)]),
         ([F(7, 10), F(1, 5), F(1, 10), F(0)], [F(1, 10), F(1, 10), F(4, 5), F(0)])]


def _joint(law):
    """A multi-draft step's law as the cells the sampler test counts: accepted y, then all rejected and y."""
    return [float(a) for a in law["accepted"]] + [float(f) for f in law["residual"]]


@pytest.mark.parametrize("scheme", multi_draft.SCHEMES)
@pytest.mark.parametrize("drafts", [1, 2, 3])
@pytest.mark.parametrize("pair", [0, 1])
def test_multi_draft_sampler_follows_the_exact_step_law(scheme, drafts, pair):
    generator = torch.Generator().manual_seed(50 + drafts + 10 * pair)
    n = 60_000
    p, q = PAIRS[pair]
    target = torch.tensor([[float(v) for v in p]] * n, dtype=torch.float64)
    draft = torch.tensor([[float(v) for v in q]] * n, dtype=torch.float64)
    candidates = draw_candidates(draft, drafts, scheme, generator)
    out = multi_draft_sample(candidates, draft, target, generator, scheme=scheme, threshold=0.5)
    law = multi_draft.multi_draft_step(p, q, drafts, scheme, F(1, 2))
    # the joint law of (accepted?, token): P(token y accepted) and P(all rejected, final y)
    joint = _joint(law)
    # Power, from exact wrong laws: the final token drawn from p instead of the residual, one candidate
    # fewer verified, another scheme's rule; this sample rejects each one that differs from the joint law
    # with probability > 0.99, and on every parametrisation one does
    rejected = sum(law["residual"])
    wrongs = [[float(a) for a in law["accepted"]] + [float(rejected * p_y) for p_y in p]]
    if drafts > 1:
        wrongs.append(_joint(multi_draft.multi_draft_step(p, q, drafts - 1, scheme, F(1, 2))))
    wrongs += [_joint(multi_draft.multi_draft_step(p, q, drafts, other, F(1, 2)))
               for other in multi_draft.SCHEMES if other != scheme]
    differing = [wrong for wrong in wrongs if wrong != joint]
    assert differing
    for wrong in differing:
        assert stats.power(n, joint, wrong) > 0.99, wrong
    cells = torch.where(out.chosen >= 0, out.token, out.token + 4)
    counts = torch.bincount(cells, minlength=8).numpy()
    impossible = sum(c for c, j in zip(counts, joint) if j == 0)
    assert impossible == 0
    keep = [i for i, j in enumerate(joint) if j > 0]
    assert stats.goodness_of_fit(counts[keep], [joint[i] for i in keep]).p_value >= stats.FALSE_ALARM_RATE


@pytest.mark.parametrize("pitfall", MULTI_DRAFT_PITFALLS, ids=lambda p: p.key)
def test_sabotage_the_wrong_multi_draft_variants_are_caught(pitfall):
    n = 20_000
    law = [float(v) for v in pitfall.exact_law()]
    target = [float(v) for v in extend(pitfall.demo_p)]
    # power of this sample size against the exact wrong law, at the stated false-alarm rate
    assert stats.power(n, target, law) > 0.999
    draws = pitfall.draw(n, torch.Generator().manual_seed(60))
    counts = stats.counts_of(draws, len(target))
    assert stats.goodness_of_fit(counts[:-1], target[:-1]).p_value < stats.FALSE_ALARM_RATE
    # and the same draws fit the wrong rule's own exact law: the sampler makes exactly the mistake described
    keep = [i for i, v in enumerate(law) if v > 0]
    assert stats.goodness_of_fit(counts[keep], [law[i] for i in keep]).p_value >= stats.FALSE_ALARM_RATE


def test_candidates_are_drawn_as_each_scheme_says():
    generator = torch.Generator().manual_seed(70)
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 1000, dtype=torch.float64)
    without = draw_candidates(q, 3, "without_replacement", generator)
    assert bool((without[:, 0] != without[:, 1]).all()) and bool((without[:, 2] == -1).all())
    top = draw_candidates(q, 3, "top_k", generator)
    assert top[0].tolist() == [0, 1, -1]  # ties to the lower id; nothing beyond q's support
    with_r = draw_candidates(q, 2, "with_replacement", generator)
    assert bool((with_r[:, 0] == with_r[:, 1]).any())
