"""decode.py on the shipped pair: greedy equality, the exact law of two bytes, a planted rollback bug.

The distribution tests compare the first two bytes speculative decoding emits after a fixed prompt with
their exact law, computed from the target itself (`exact_two_byte_law`), on conftest's cheaper `law_pair`
(the shipped draft as the target, a nudged copy as the draft). They reject at p < 1e-6
(stats.FALSE_ALARM_RATE), so each raises a false alarm with probability 1e-6; seeds are fixed.
"""

import pytest
import torch

from conftest import planted_rollback_bug
from speculative.engine import evaluate
from speculative.engine.decode import plain_decode, reuse_prefills, speculative_decode
from speculative.engine.evaluate import exact_two_byte_law
from speculative.engine.model import GPT, GPTConfig
from speculative.engine.pair import load_pair
from speculative.sampling import stats
from speculative.sampling.transforms import SamplingConfig

GREEDY = SamplingConfig(temperature=0)
ROWS = 12_000  # samples per distribution test
CHUNK = 1_500  # rows decoded per call, to bound the KV cache memory


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_speculative_equals_greedy_plain(pair, gamma):
    prompts = pair.prompts[:6]
    plain = plain_decode(pair.target, prompts, 48, GREEDY)
    fast = speculative_decode(pair.target, pair.draft, prompts, 48, gamma, GREEDY)
    assert fast.tokens == plain.tokens
    assert fast.target_forwards < plain.target_forwards  # the drafts did save target calls


def test_batch_rows_are_independent(pair):
    prompts = pair.prompts[:3]
    together = speculative_decode(pair.target, pair.draft, prompts, 32, 4, GREEDY)
    alone = [speculative_decode(pair.target, pair.draft, [p], 32, 4, GREEDY).tokens[0] for p in prompts]
    assert together.tokens == alone


def test_a_fixed_gamma_is_the_fixed_policy(pair):
    # one engine path: gamma = 3 runs as FixedLength(3), draw for draw, and records each block's lengths
    from speculative.engine.policy import FixedLength

    prompts = [p[: 40 + 9 * i] for i, p in enumerate(pair.prompts[:3])]  # rows finish at different blocks
    runs = [speculative_decode(pair.target, pair.draft, prompts, 24, gamma, SamplingConfig(temperature=1.0),
                               torch.Generator().manual_seed(0)) for gamma in (3, FixedLength(3))]
    assert runs[0].tokens == runs[1].tokens and runs[0].gamma == 3
    for a, b in zip(runs[0].accepted + runs[0].lengths, runs[1].accepted + runs[1].lengths):
        assert torch.equal(a, b)
    accepted, lengths = torch.stack(runs[0].accepted), torch.stack(runs[0].lengths)
    assert bool(((lengths == 3) == (accepted >= 0)).all()) and bool((lengths[accepted < 0] == -1).all())
    assert (accepted < 0).any()  # a finished row's -1 was seen


def test_reused_prefills_change_no_token_and_are_recomputed_when_the_weights_change(pair, monkeypatch):
    from speculative.engine import decode

    prompts, sampled = [p[:30 + 7 * i] for i, p in enumerate(pair.prompts[:4])], SamplingConfig(temperature=1.0)

    def runs():
        return [plain_decode(pair.target, prompts, 8, sampled, torch.Generator().manual_seed(1)).tokens,
                speculative_decode(pair.target, pair.draft, prompts, 8, 3, sampled,
                                   torch.Generator().manual_seed(2)).tokens,
                plain_decode(pair.target, prompts * 2, 8, sampled, torch.Generator().manual_seed(3)).tokens]

    fresh = runs()
    computed = []
    real = decode.GPT.forward
    monkeypatch.setattr(decode.GPT, "forward", lambda self, tokens, *a, **k: (
        computed.append(tuple(tokens.shape)) if tokens.shape[1] > 20 else None, real(self, tokens, *a, **k))[1])
    with reuse_prefills():
        assert runs() == fresh
        assert len(computed) == 2  # one prefill of the target, one of the draft, for three decodes
        with torch.no_grad():
            pair.target.head.weight.add_(0.0)  # an in-place write: the stored prefill is stale
        plain_decode(pair.target, prompts, 2, sampled)
        assert len(computed) == 3
    plain_decode(pair.target, prompts, 2, sampled)  # outside the block nothing is kept
    assert len(computed) == 4


def test_dropping_finished_rows_changes_no_row(pair, monkeypatch):
    from speculative.engine.model import KVCache

    selections = []
    original = KVCache.select
    monkeypatch.setattr(KVCache, "select", lambda self, rows: selections.append(len(rows)) or original(self, rows))
    prompts = [p[: 40 + 9 * i] for i, p in enumerate(pair.prompts[:6])]  # distinct prompts, distinct lengths
    together = speculative_decode(pair.target, pair.draft, prompts, 40, 3, GREEDY)
    # (the prefill may also select, to put prompts back in order: all rows)
    assert any(count < len(prompts) for count in selections), "no rows were dropped: this checked nothing"
    assert together.tokens == plain_decode(pair.target, prompts, 40, GREEDY).tokens
    # the acceptance log keeps one entry per prompt and marks rows that were no longer decoding with -1
    log = torch.stack(together.accepted)
    assert log.shape[1] == len(prompts) and (log[-1] == -1).any() and (log[0] >= 0).all()


def _two_bytes(decoder, pair, config, seed, gamma=4):
    prompt = pair.prompts[0]
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(ROWS // CHUNK):
        result = decoder(pair.target, pair.draft, [prompt] * CHUNK, 2, gamma, config, generator)
        pairs += [row[0] * 256 + row[1] for row in result.tokens]
    return stats.counts_of(pairs, 256 * 256)


def _law(pair, config):
    return exact_two_byte_law(pair.target, pair.prompts[0], config).reshape(-1).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("config", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.9)],
                         ids=lambda c: c.describe())
def test_first_two_bytes_follow_the_exact_law(law_pair, config):
    law = _law(law_pair, config)
    result = stats.goodness_of_fit(_two_bytes(speculative_decode, law_pair, config, seed=7), law)
    assert not result.rejects(), result
    # what this sample size can see: any law whose TV from this one, on the pooled cells, is this large
    detectable = stats.detectable_tv(ROWS, stats.pooled(law, ROWS))
    assert detectable < 0.1


def test_the_distribution_test_catches_an_off_by_one_rollback(law_pair):
    broken = planted_rollback_bug()
    config = SamplingConfig(temperature=1.0)
    result = stats.goodness_of_fit(_two_bytes(broken.speculative_decode, law_pair, config, seed=8),
                                   _law(law_pair, config))
    assert result.rejects(), result


def test_exact_two_byte_law_matches_plain_sampling_marginal(law_pair):
    law = exact_two_byte_law(law_pair.target, law_pair.prompts[1])
    logits = law_pair.target(torch.tensor([list(law_pair.prompts[1])]))[0, -1]
    assert torch.allclose(law.sum(1).float(), torch.softmax(logits, -1), atol=1e-5)


def _tiny():
    torch.manual_seed(0)
    return GPT(GPTConfig(context=32, n_layer=1, n_head=2, d_model=16)).eval()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, d: speculative_decode(m, d, [b""], 4, 2), "empty"),
        (lambda m, d: speculative_decode(m, d, [], 4, 2), "non-empty list"),
        (lambda m, d: speculative_decode(m, d, [b"x" * 40], 4, 2), "longer than the model.s context"),
        (lambda m, d: speculative_decode(m, d, [b"x" * 20], 12, 2), "exceeds the model.s context"),
        (lambda m, d: speculative_decode(m, d, [b"ab"], 4, 0), "gamma"),
        (lambda m, d: speculative_decode(m, d, [b"ab"], 0, 2), "max_new_tokens"),
        (lambda m, d: plain_decode(m, [b""], 4), "empty"),
    ],
)
def test_bad_input(call, message):
    model = _tiny()
    with pytest.raises(ValueError, match=message):
        call(model, model)


def test_mismatched_vocabularies():
    target = _tiny()
    draft = GPT(GPTConfig(vocab_size=128, context=32, n_layer=1, n_head=2, d_model=16))
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        speculative_decode(target, draft, [b"ab"], 4, 2)


def test_completion_bits_per_byte_matches_a_direct_computation():
    model = _tiny()
    prompt, completion = list(b"abc"), list(b"de")
    bits = evaluate.completion_bits_per_byte(model, [bytes(prompt)], [completion])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([prompt + completion])).double(), -1)[0]
    expected = -(logprobs[2, completion[0]] + logprobs[3, completion[1]]) / 2 / torch.log(torch.tensor(2.0)).double()
    assert torch.isclose(bits[0], expected)
    with pytest.raises(ValueError, match="completions"):
        evaluate.completion_bits_per_byte(model, [b"a", b"b"], [[1]])


def test_identifier_tasks_cut_inside_an_identifier_and_score_exact_completions():
    text = b"".join(b"value_%03d = %d\n" % (i, i) for i in range(60))  # 60 distinct 9-byte identifiers
    tasks = evaluate.identifier_tasks(text, 5, context=40, typed=2, seed=1)
    assert len({t.prompt for t in tasks}) == len(tasks) == 5  # no identifier drawn twice
    for task in tasks:
        assert len(task.prompt) == 40 and task.prompt.endswith(b"\nva")
        whole = task.prompt[-2:] + task.answer  # the two typed bytes, then the rest
        assert len(whole) == 9 and whole.startswith(b"value_") and whole + b" = " in text
    task = evaluate.IdentifierTask(b"def co", b"mpute_total")
    score = evaluate.identifier_exact_match
    assert score([task], [list(b"mpute_total(x")]).tolist() == [True]
    assert score([task], [list(b"mpute_totals")]).tolist() == [False]  # went past the identifier
    assert score([task], [list(b"mpute_tot")]).tolist() == [False]  # stopped inside it: no verdict is a miss
    assert score([task], [list(b"mpute_total")]).tolist() == [False]  # no byte after it: may go on
    assert score([task], [list(b"mpute")]).tolist() == [False]
    with pytest.raises(ValueError, match="completions"):
        score([task, task], [[1]])
    with pytest.raises(ValueError, match="identifiers"):
        evaluate.identifier_tasks(text, 10_000, context=40)


def test_demo_scale_is_read_in_one_place(monkeypatch):
    from speculative.book.glue import demo_settings

    monkeypatch.delenv("SPECULATIVE_SCALE", raising=False)
    assert demo_settings("cpu")["scale"] == "small"
    assert demo_settings("cuda")["scale"] == "small"  # a GPU runs the small sizes too (chapter 08's budget)
    monkeypatch.setenv("SPECULATIVE_SCALE", "full")
    assert demo_settings("cpu")["scale"] == "full"


def test_measured_acceptance_rate_counts_only_tested_drafts():
    # gamma = 4: a block accepting 2 tested 3 drafts; one accepting all 4 tested 4; -1 is an inactive row
    blocks = [torch.tensor([2, 4]), torch.tensor([0, -1])]
    assert stats.measured_acceptance_rate(blocks, 4) == pytest.approx((2 + 4 + 0) / (3 + 4 + 1))
    # i.i.d. acceptances with probability 0.7: the estimate recovers 0.7 whatever gamma is. The seed is
    # fixed, so the run is deterministic; with another seed the estimate's standard error is at most
    # sqrt(0.21 / 20000) = 0.0032 (gamma = 1), so the 0.01 tolerance is 3.1 standard errors: a false alarm
    # about 2 in 1000 per gamma. The old estimator (accepted / gamma) gives 0.44 at gamma = 4 and fails.
    generator = torch.Generator().manual_seed(0)
    for gamma in (1, 4, 8):
        coins = torch.rand(20_000, gamma, generator=generator) < 0.7
        counts = coins.long().cumprod(1).sum(1)
        assert stats.measured_acceptance_rate([counts], gamma) == pytest.approx(0.7, abs=0.01)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_weights_decode_in_range_without_nan(dtype):
    # what --dtype does: weights and caches in half precision, probabilities in float32
    half = load_pair(dtype=dtype)
    assert half.target.token_embedding.weight.dtype == dtype
    for config in (SamplingConfig(temperature=1.0), SamplingConfig(temperature=0)):
        out = speculative_decode(half.target, half.draft, half.prompts[:3], 24, 4, config,
                                 torch.Generator().manual_seed(0))
        flat = [t for row in out.tokens for t in row]
        assert len(flat) == 3 * 24 and all(0 <= t < 256 for t in flat)
        assert 0 < out.acceptance_rate() <= 1
    greedy = SamplingConfig(temperature=0)
    plain = plain_decode(half.target, half.prompts[:3], 24, greedy)
    spec = speculative_decode(half.target, half.draft, half.prompts[:3], 24, 4, greedy)
    # in half precision a block forward and a one-position forward may round differently, so greedy
    # texts can part at a near tie; they must at least start alike
    assert all(a[:4] == b[:4] for a, b in zip(plain.tokens, spec.tokens))


def test_block_rule_and_multi_draft_decoding_are_greedy_exact(pair):
    # at temperature 0 every rule must reproduce plain greedy decoding token for token
    from speculative.engine.multi_draft import multi_draft_decode

    greedy = SamplingConfig(temperature=0.0)
    prompts = [pair.prompts[3], pair.prompts[4]]
    plain = plain_decode(pair.target, prompts, 40, greedy)
    block = speculative_decode(pair.target, pair.draft, prompts, 40, 4, greedy, rule="block")
    assert block.tokens == plain.tokens
    for scheme in ("with_replacement", "without_replacement", "top_k"):
        for k in (1, 3):
            out = multi_draft_decode(pair.target, pair.draft, prompts[0], 40, 3, k, greedy, scheme=scheme)
            assert out.tokens[0] == plain.tokens[0], (scheme, k)
            assert out.target_forwards == len(out.accepted) + 1  # one forward per block, plus the prefill


def test_multi_draft_decoding_refuses_bad_input(pair):
    from speculative.engine.multi_draft import multi_draft_decode

    with pytest.raises(ValueError, match="one prompt"):
        multi_draft_decode(pair.target, pair.draft, [pair.prompts[0], pair.prompts[1]], 8, 2, 2)
    with pytest.raises(ValueError, match="drafts"):
        multi_draft_decode(pair.target, pair.draft, pair.prompts[0], 8, 2, 0)
    with pytest.raises(ValueError, match="unknown scheme"):
        multi_draft_decode(pair.target, pair.draft, pair.prompts[0], 8, 2, 2, scheme="tree")
    with pytest.raises(ValueError, match="either rule"):
        speculative_decode(pair.target, pair.draft, [pair.prompts[0]], 8, 2, sampler=lambda *a, **k: None,
                           rule="block")
    with pytest.raises(ValueError, match="unknown verification rule"):
        speculative_decode(pair.target, pair.draft, [pair.prompts[0]], 8, 2, rule="tree")


@pytest.mark.parametrize("policy", ["fixed", "confidence"])
def test_the_greedy_fast_path_gives_what_the_sampler_gives_on_one_hots(law_pair, policy, monkeypatch):
    """Greedily the loop compares arg-maxes (sampler.greedy_verify) instead of running the rejection sampler on
    one-hot p and q; passing the sampler explicitly takes the long way. Tokens and every block's accepted
    count must agree, shared blocks and per-row lengths alike, on rows of different prompts."""
    from speculative.engine import decode as decode_module
    from speculative.engine.policy import make_policy
    from speculative.sampling.sampler import greedy_verify, rejection_sample

    calls = []
    monkeypatch.setattr(decode_module, "greedy_verify", lambda *a: calls.append(1) or greedy_verify(*a))
    greedy = SamplingConfig(temperature=0.0)
    prompts = [p[:40] for p in law_pair.prompts[:3]]
    for per_row in (False, True):
        runs = []
        for sampler in (None, rejection_sample):
            gamma = 4 if policy == "fixed" else make_policy("confidence", max_gamma=6)
            runs.append(speculative_decode(law_pair.target, law_pair.draft, prompts, 24, gamma, greedy,
                                           sampler=sampler, per_row=per_row))
        fast, slow = runs
        assert len(calls) == fast.target_forwards - 1  # every block of the default path took the fast one
        calls.clear()
        assert fast.tokens == slow.tokens
        assert [a.tolist() for a in fast.accepted] == [a.tolist() for a in slow.accepted]
        assert fast.tokens == plain_decode(law_pair.target, prompts, 24, greedy).tokens


def test_greedy_verify_is_the_rejection_sampler_on_one_hots():
    from speculative.sampling.sampler import greedy_verify, rejection_sample

    generator = torch.Generator().manual_seed(0)
    batch, k, vocab = 64, 5, 4  # a small vocabulary, so that drafts often match
    drafts = torch.randint(0, vocab, (batch, k), generator=generator)
    choice = torch.randint(0, vocab, (batch, k + 1), generator=generator)
    lengths = torch.randint(1, k + 1, (batch,), generator=generator)
    one_hot = torch.nn.functional.one_hot
    for own in (None, lengths):
        fast = greedy_verify(drafts, choice, own)
        slow = rejection_sample(drafts, one_hot(drafts, vocab).float(), one_hot(choice, vocab).float(), generator,
                                lengths=own)
        assert torch.equal(fast.tokens, slow.tokens) and torch.equal(fast.num_accepted, slow.num_accepted)
    assert 0 < int(fast.num_accepted.sum()) < batch * k  # some blocks stop early, some accept drafts


@pytest.mark.parametrize("policy", ["fixed", "confidence"])
def test_rows_at_one_position_take_int_positions_and_draw_the_same(law_pair, policy, monkeypatch):
    """When every row's block starts at one position (batch 1, or prompts of one length), the loop passes
    the forwards host ints (the caches written by slices) instead of (R,) tensors. That is
    only faster: forced onto the tensor path, the same seeds give the same tokens and accepted counts, at
    T = 1 and greedily, and the int path was really taken."""
    from speculative.engine import decode as decode_module
    from speculative.engine.policy import make_policy

    shared = []
    original = decode_module._shared
    monkeypatch.setattr(decode_module, "_shared", lambda *a: shared.append(original(*a)) or shared[-1])
    prompts = [p[:40] for p in law_pair.prompts[:3]]  # one length: the rows share positions until one lags
    for config in (SamplingConfig(temperature=1.0), GREEDY):
        for rows in (prompts[:1], prompts):
            runs = []
            for force_tensors in (False, True):
                if force_tensors:
                    monkeypatch.setattr(decode_module, "_shared", lambda *a: None)
                gamma = 4 if policy == "fixed" else make_policy("confidence", max_gamma=6)
                runs.append(speculative_decode(law_pair.target, law_pair.draft, rows, 24, gamma, config,
                                               torch.Generator().manual_seed(5)))
                monkeypatch.setattr(decode_module, "_shared", lambda *a: shared.append(original(*a)) or shared[-1])
            fast, slow = runs
            assert fast.tokens == slow.tokens
            assert [a.tolist() for a in fast.accepted] == [a.tolist() for a in slow.accepted]
        assert any(s is not None for s in shared), "no block took int positions: this checked nothing"
        shared.clear()


def test_a_one_token_step_without_a_mask_gives_the_masked_logits(law_pair):
    # the model skips the mask for one token at an int position that attends to every cached key (plain
    # decoding's step); the same call with a tensor position builds an all-true mask and must give the
    # same logits bit for bit; a longer span (extra keys masked out) agrees up to rounding
    from speculative.engine.decode import prefill

    model, row = law_pair.target, law_pair.prompts[0][:30]
    cache = prefill(model, [list(row)], length=64)
    token = torch.tensor([[row[-1]]])
    with torch.no_grad():
        exact = model(token, 29, cache, span=30, check=False)
        masked = model(token, 29, cache, span=48, check=False)
        as_tensor = model(token, torch.tensor([29]), cache, span=30, check=False)
    assert torch.equal(exact, as_tensor) and torch.allclose(exact, masked, atol=1e-4)
    assert not torch.allclose(exact, model(token, 28, cache, span=29, check=False), atol=1e-3)  # positions matter
