"""The batched torch sampler: distribution (goodness of fit), determinism, batching, greedy, edge dtypes.

Statistical tests reject at p < FALSE_ALARM_RATE (1e-6); under a correct sampler each fails with
probability 1e-6 per run, and all seeds are fixed, so the suite is deterministic.
"""

import math

import pytest
import torch

from speculative.sampling import stats
from speculative.sampling.sampler import (
    Randomness,
    categorical,
    draw_randomness,
    reference_rejection_sample,
    rejection_sample,
    sum_tolerance,
)
from speculative.sampling.transforms import SamplingConfig, logits_to_probs


def _random_probs(shape, generator, sharpness=2.0):
    return torch.softmax(torch.randn(shape, generator=generator, dtype=torch.float64) * sharpness, dim=-1)


def _drafts(draft_probs, generator):
    batch, k, vocab = draft_probs.shape
    return torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=generator).reshape(batch, k)


@pytest.mark.parametrize("vocab, k, seed", [(10, 1, 0), (23, 2, 1), (37, 3, 2), (50, 4, 3)])
def test_each_emitted_position_follows_the_target(vocab, k, seed):
    gen = torch.Generator().manual_seed(seed)
    n = 30_000
    # one p and q per position, the same for every row: the token emitted at position j, among rows that
    # reach it, must follow p_j (drafts at j are independent of how the row got there)
    target = _random_probs((1, k + 1, vocab), gen).expand(n, k + 1, vocab)
    draft = _random_probs((1, k, vocab), gen).expand(n, k, vocab)
    out = rejection_sample(_drafts(draft, gen), draft, target, gen)
    tested = []
    for j in range(k + 1):
        reached = out.num_emitted > j
        if reached.sum() < 200:  # too few rows to test this position
            continue
        counts = stats.counts_of(out.tokens[reached, j], vocab)
        result = stats.goodness_of_fit(counts, target[0, j].tolist())
        assert not result.rejects(), (j, result)
        tested.append(j)
    # the loop must have tested something beyond the first position; for k <= 2 the bonus position
    # (reached only when every draft is accepted) is reached often enough to be tested too
    assert tested[:2] == [0, 1], tested
    if k <= 2:
        assert k in tested, tested


def _toy_tables(vocab, gen):
    """p and q for contexts (), (x1,), (x1, x2): dense tables of a small autoregressive model."""
    return [_random_probs((vocab,) * depth + (vocab,), gen, sharpness=1.5) for depth in range(3)]


def test_joint_law_of_the_first_two_emitted_tokens():
    vocab, n = 4, 60_000
    gen = torch.Generator().manual_seed(11)
    p0, p1, p2 = _toy_tables(vocab, gen)
    q0, q1, _ = _toy_tables(vocab, gen)
    # block 1, gamma = 2: x1 ~ q0, x2 ~ q1[x1]; target at (), (x1,), (x1, x2)
    x1 = torch.multinomial(q0.expand(n, vocab), 1, generator=gen).squeeze(1)
    x2 = torch.multinomial(q1[x1], 1, generator=gen).squeeze(1)
    out = rejection_sample(torch.stack([x1, x2], 1), torch.stack([q0.expand(n, vocab), q1[x1]], 1),
                           torch.stack([p0.expand(n, vocab), p1[x1], p2[x1, x2]], 1), gen)
    first, second = out.tokens[:, 0], out.tokens[:, 1].clone()
    # rows that emitted one token: the second comes from the next block, gamma = 1, context (first,)
    short = out.num_emitted == 1
    y = torch.multinomial(q1[first[short]], 1, generator=gen).squeeze(1)
    nxt = rejection_sample(y.unsqueeze(1), q1[first[short]].unsqueeze(1),
                           torch.stack([p1[first[short]], p2[first[short], y]], 1), gen)
    second[short] = nxt.tokens[:, 0]
    joint = (p0.unsqueeze(1) * p1).reshape(-1)  # P(t1 = a, t2 = b) = p0(a) p1(b | a)
    counts = stats.counts_of(first * vocab + second, vocab * vocab)
    result = stats.goodness_of_fit(counts, joint.tolist())
    assert not result.rejects(), result


def test_same_seed_same_result_and_another_seed_differs():
    gen = torch.Generator().manual_seed(5)
    target, draft = _random_probs((64, 4, 30), gen), _random_probs((64, 3, 30), gen)
    drafts = _drafts(draft, gen)
    a = rejection_sample(drafts, draft, target, torch.Generator().manual_seed(99))
    b = rejection_sample(drafts, draft, target, torch.Generator().manual_seed(99))
    c = rejection_sample(drafts, draft, target, torch.Generator().manual_seed(100))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)
    assert not torch.equal(a.tokens, c.tokens)


def test_batched_equals_row_by_row_and_the_reference():
    gen = torch.Generator().manual_seed(6)
    batch, k, vocab = 32, 4, 40
    target, draft = _random_probs((batch, k + 1, vocab), gen), _random_probs((batch, k, vocab), gen)
    drafts = _drafts(draft, gen)
    randomness = draw_randomness(batch, k, gen)
    batched = rejection_sample(drafts, draft, target, randomness=randomness)
    for b in range(batch):
        row = rejection_sample(drafts[b:b + 1], draft[b:b + 1], target[b:b + 1],
                               randomness=Randomness(randomness.uniforms[b:b + 1]))
        assert torch.equal(row.tokens[0], batched.tokens[b]), b
    reference = reference_rejection_sample(drafts, draft, target, randomness)
    assert torch.equal(reference.tokens, batched.tokens)
    assert torch.equal(reference.num_accepted, batched.num_accepted)


def _rows_alone_differ(sample, reference=None):
    """Verify rows of random lengths L <= k inside one width-k call (``lengths=``) and each length's rows
    alone as calls on their first L drafts, with the uniforms those consume (L tests, then the last token).
    Return how many rows differ; check both paths (bonus at L, rejection) were taken."""
    generator = torch.Generator().manual_seed(42)
    batch, k, vocab = 600, 4, 5
    target, draft = _random_probs((batch, k + 1, vocab), generator), _random_probs((batch, k, vocab), generator)
    drafts = _drafts(draft, generator)
    lengths = torch.randint(1, k + 1, (batch,), generator=generator)
    randomness = draw_randomness(batch, k, generator)
    out = sample(drafts, draft, target, randomness=randomness, lengths=lengths)
    differ, seen = 0, set()
    for length in range(1, k + 1):
        rows = (lengths == length).nonzero().squeeze(1)
        alone = rejection_sample(drafts[rows, :length], draft[rows, :length], target[rows, :length + 1],
                                 randomness=Randomness(randomness.uniforms[rows, :length + 1]))
        same = (out.num_accepted[rows] == alone.num_accepted) & (out.tokens[rows, :length + 1] == alone.tokens).all(1)
        differ += int((~same | (out.tokens[rows, length + 1:] != -1).any(1)).sum())
        seen |= {(length, int(a)) for a in alone.num_accepted}
    assert {(length, length) for length in range(1, k + 1)} <= seen and (k, 0) in seen  # bonus and rejection
    if reference is not None:
        by_hand = reference(drafts, draft, target, randomness, lengths=lengths)
        assert torch.equal(by_hand.tokens, out.tokens) and torch.equal(by_hand.num_accepted, out.num_accepted)
    return differ


def test_a_row_verified_at_its_own_length_is_that_block_alone_draw_for_draw():
    # lengths=: a row of length L among longer padded rows is verified exactly as a block of L drafts
    # (its first L tested, then the residual, or the bonus token from p at L + 1), as the block rule does
    from conftest import planted_cut_bug

    assert _rows_alone_differ(rejection_sample, reference_rejection_sample) == 0
    # a bonus token drawn one position too far (the engine law test's planted bug) differs in many rows
    assert _rows_alone_differ(planted_cut_bug().rejection_sample) > 50
    drafts, draft, target = _valid(batch=3, k=4)
    randomness = draw_randomness(3, 4, torch.Generator().manual_seed(1))
    full = rejection_sample(drafts, draft, target, randomness=randomness, lengths=torch.full((3,), 4))
    plain = rejection_sample(drafts, draft, target, randomness=randomness)
    assert torch.equal(full.tokens, plain.tokens)  # every row at the full length: the call without lengths
    for bad in (torch.zeros(3, dtype=torch.long), torch.full((3,), 5), torch.ones(4, dtype=torch.long),
                torch.ones(3)):
        with pytest.raises(ValueError, match="lengths must"):
            rejection_sample(drafts, draft, target, randomness=randomness, lengths=bad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_own_lengths_with_p_equal_to_q_in_half_precision_accept_each_row_whole_without_nan(dtype):
    gen = torch.Generator().manual_seed(14)
    probs = _random_probs((128, 5, 64), gen).to(dtype)
    drafts = _drafts(probs[:, :4].double() / probs[:, :4].double().sum(-1, keepdim=True), gen)
    lengths = torch.randint(1, 5, (128,), generator=gen)
    out = rejection_sample(drafts, probs[:, :4], probs, gen, lengths=lengths)
    assert torch.equal(out.num_accepted, lengths)  # p = q: every draft a row tests is accepted
    assert out.tokens.gather(1, lengths.unsqueeze(1)).min() >= 0 and out.tokens.max() < 64


def test_greedy_equals_the_target_argmax():
    gen = torch.Generator().manual_seed(7)
    batch, k, vocab = 200, 4, 16
    target_logits = torch.randn(batch, k + 1, vocab, generator=gen)
    draft_logits = target_logits[:, :k] + 0.8 * torch.randn(batch, k, vocab, generator=gen)
    greedy = SamplingConfig(temperature=0)
    target, draft = logits_to_probs(target_logits, greedy), logits_to_probs(draft_logits, greedy)
    drafts = draft.argmax(-1)
    out = rejection_sample(drafts, draft, target, gen)
    argmax = target_logits.argmax(-1)  # (B, k+1)
    for b in range(batch):
        n = int(out.num_accepted[b])
        assert torch.equal(drafts[b, :n], argmax[b, :n])  # accepted drafts are the target's choices
        assert out.tokens[b, n] == argmax[b, n]  # the correction or bonus is the target's argmax
        if n < k:
            assert drafts[b, n] != argmax[b, n]  # and a draft is rejected exactly when it differs
    assert 0 < out.num_accepted.float().mean() < k


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_p_equals_q_accepts_everything_without_nan(dtype):
    gen = torch.Generator().manual_seed(8)
    probs = _random_probs((128, 4, 64), gen).to(dtype)
    drafts = _drafts(probs[:, :3].double(), gen)
    out = rejection_sample(drafts, probs[:, :3], probs, gen)
    assert torch.equal(out.num_accepted, torch.full((128,), 3))
    assert out.tokens.min() >= 0 and out.tokens.max() < 64


def test_zero_residual_falls_back_to_the_target():
    # p sits below q everywhere except rounding: max(p - q, 0) is all zero, yet a rejection can happen
    n = 20_000
    q = torch.tensor([[[0.5, 0.5]]], dtype=torch.float32).expand(n, 1, 2)
    p_row = torch.tensor([0.499, 0.499])  # a rejection has probability 0.002 per row
    target = torch.stack([p_row, torch.tensor([0.5, 0.5])]).expand(n, 2, 2)
    drafts = torch.zeros(n, 1, dtype=torch.long)
    out = rejection_sample(drafts, q, target, torch.Generator().manual_seed(9), check_values=False)
    emitted = torch.cat([torch.tensor(row) for row in out.rows()])
    assert emitted.min() >= 0 and emitted.max() < 2
    assert (out.num_accepted == 0).sum() > 0  # some rejections did take the zero-residual branch


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_follow_their_rounded_target(dtype):
    gen = torch.Generator().manual_seed(10)
    n, vocab = 40_000, 20
    target = _random_probs((1, 2, vocab), gen).to(dtype)
    draft = _random_probs((1, 1, vocab), gen).to(dtype)
    target, draft = target.expand(n, 2, vocab), draft.expand(n, 1, vocab)
    out = rejection_sample(_drafts(draft.double() / draft.double().sum(-1, keepdim=True), gen), draft, target, gen)
    assert out.tokens[out.tokens >= 0].max() < vocab
    rounded = target[0, 0].double() / target[0, 0].double().sum()  # the law the half values describe
    # with q rounded too, the law is p_rounded only up to the rounding of sums (about 1e-3): test at
    # the level this sample size can see, which is far coarser
    result = stats.goodness_of_fit(stats.counts_of(out.tokens[:, 0], vocab), rounded.tolist())
    assert not result.rejects(), result


def test_output_layout():
    gen = torch.Generator().manual_seed(12)
    target, draft = _random_probs((50, 4, 9), gen), _random_probs((50, 3, 9), gen)
    out = rejection_sample(_drafts(draft, gen), draft, target, gen)
    for row, n_emitted, tokens in zip(range(50), out.num_emitted.tolist(), out.rows()):
        assert len(tokens) == n_emitted and all(0 <= t < 9 for t in tokens)
        assert (out.tokens[row, n_emitted:] == -1).all()
    assert torch.equal(out.num_emitted, out.num_accepted + 1)


def _valid(batch=2, k=2, vocab=5):
    gen = torch.Generator().manual_seed(0)
    target, draft = _random_probs((batch, k + 1, vocab), gen), _random_probs((batch, k, vocab), gen)
    return _drafts(draft, gen), draft, target


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d, q, p: (d, q, p[:, :-1]), "expected .* k drafted positions plus one"),
        (lambda d, q, p: (d, q[:, :, :4], p), "vocabulary mismatch"),
        (lambda d, q, p: (d, q[:1], p), "draft_probs has shape"),
        (lambda d, q, p: (d.float(), q, p), "draft_tokens must be an int64"),
        (lambda d, q, p: (d + 10, q, p), "outside"),
        (lambda d, q, p: (d, q.long(), p), "float64, float32"),
        (lambda d, q, p: (d, q, p[0]), "shape \\(batch, positions, vocab\\)"),
        (lambda d, q, p: (d, q.clone().fill_(float("nan")), p), "NaN or inf"),
        (lambda d, q, p: (d, q - 0.5, p), "negative"),
        (lambda d, q, p: (d, q * 0.5, p), "sum to 1"),
    ],
)
def test_bad_input(mutate, message):
    drafts, draft, target = mutate(*_valid())
    with pytest.raises(ValueError, match=message):
        rejection_sample(drafts, draft, target, torch.Generator().manual_seed(0))


def test_a_generator_or_randomness_is_required():
    with pytest.raises(ValueError, match="torch.Generator"):
        rejection_sample(*_valid())
    with pytest.raises(ValueError, match="uniforms must have shape"):
        rejection_sample(*_valid(), randomness=Randomness(torch.rand(2, 2, dtype=torch.float64)))


@pytest.mark.parametrize("bad", [-0.5, 1.5, float("nan"), 1.0])
def test_uniforms_outside_zero_one_are_refused(bad):
    drafts, draft, target = _valid()
    uniforms = torch.full((2, 3), 0.5, dtype=torch.float64)
    uniforms[1, 0] = bad
    with pytest.raises(ValueError, match=r"uniforms must lie in \[0, 1\)"):
        rejection_sample(drafts, draft, target, randomness=Randomness(uniforms))


def test_a_drafted_token_the_draft_could_not_sample_is_refused():
    drafts, draft, target = _valid()
    draft = draft.clone()
    draft[1, 0, drafts[1, 0]] = 0.0  # q(x) = 0 for a drafted x: the verifier was handed another q
    draft[1, 0] /= draft[1, 0].sum()
    with pytest.raises(ValueError, match=r"draft_tokens\[1, 0\] .* draft probability 0"):
        rejection_sample(drafts, draft, target, torch.Generator().manual_seed(0))
    out = rejection_sample(drafts, draft, target, torch.Generator().manual_seed(0), allow_zero_draft_prob=True)
    assert out.num_emitted.min() >= 1


@pytest.mark.parametrize("dtype, vocab", [(torch.float16, 256), (torch.bfloat16, 256), (torch.float16, 150_000),
                                          (torch.bfloat16, 150_000)])
def test_rounded_softmax_rows_pass_and_the_tolerance_is_derived(dtype, vocab):
    # a normalised float32 softmax rounded to half precision: the tolerance must admit it
    gen = torch.Generator().manual_seed(13)
    target = torch.softmax(torch.randn(2, 2, vocab, generator=gen) * 4, -1).to(dtype)
    draft = torch.softmax(torch.randn(2, 1, vocab, generator=gen) * 4, -1).to(dtype)
    drafts = torch.multinomial(draft[:, 0].float(), 1, generator=gen)
    worst = max((t.double().sum(-1) - 1).abs().max().item() for t in (target, draft))
    assert worst <= sum_tolerance(dtype, vocab)
    rejection_sample(drafts, draft, target, gen)


def test_a_bfloat16_row_summing_to_1_04_is_refused():
    drafts, draft, target = _valid(vocab=50)
    target = (target * 1.04).to(torch.bfloat16)
    with pytest.raises(ValueError, match="target_probs rows must sum to 1"):
        rejection_sample(drafts, draft.to(torch.bfloat16), target, torch.Generator().manual_seed(0))


def test_an_empty_batch_returns_an_empty_result():
    out = rejection_sample(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 3, 7), torch.zeros(0, 4, 7),
                           torch.Generator().manual_seed(0))
    assert out.tokens.shape == (0, 4) and out.num_accepted.shape == (0,) and out.rows() == []


def test_uniforms_at_the_edges_never_pick_a_token_of_zero_weight():
    # weights with trailing zeros and tiny entries: u = 0 and u just below 1 must land on w > 0
    weights = torch.tensor([[0.0, 1e-30, 0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 1e-300, 0.0, 0.0]], dtype=torch.float64)
    for u in (0.0, math.nextafter(1.0, 0.0)):
        token = categorical(weights, torch.full((2,), u, dtype=torch.float64))
        assert (weights.gather(1, token.unsqueeze(1)) > 0).all(), (u, token)
    # and through the sampler: p <= q everywhere but rounding, a rejection forced (u = 1 - ulp): no NaN, no p = 0
    q = torch.tensor([[[0.5, 0.5, 0.0]]], dtype=torch.float32)
    p = torch.tensor([[[0.5, 0.5 - 2 ** -24, 2 ** -24], [0.0, 0.0, 1.0]]], dtype=torch.float32)
    for u in (0.0, math.nextafter(1.0, 0.0)):
        uniforms = torch.tensor([[math.nextafter(1.0, 0.0), u]], dtype=torch.float64)
        out = rejection_sample(torch.tensor([[1]]), q, p, randomness=Randomness(uniforms))
        assert out.num_accepted.item() == 0 and out.tokens[0, 0].item() == 2  # the only token with p > q
