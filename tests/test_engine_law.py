"""The whole engine's law, past the first block: exact sequence laws against real decoding.

The two-byte tests in test_decode.py see at most the start of a second block. Here the law of the first 8
emitted tokens (6 for the multi-draft engine, in test_engine_law_chains.py) is computed exactly from full
forwards of the target (``evaluate.exact_sequence_law``, enumerated over the support, which top-k / top-p
keep small), and the engine's outputs are tested against it. The models are conftest's ``law_pair`` (the
shipped draft as the target, a nudged copy of it as the draft), about ten times cheaper per row than the
shipped pair: the law holds or fails for any pair, and the cost of a test is its rows. At gamma = 4,
eight tokens always reach a second block, and the runs are checked to contain blocks that start after a
full acceptance (bonus token, draft two tokens behind) and after a rejection in mid-block. One batch
mixes two prompts of different lengths, so rows finish at different blocks and are dropped.

The engine's other forms (block verification, every draft-length policy, per-row and shared lengths,
gamma = 2 over three or more blocks) are audited end to end on tiny models with exact laws by chapter
12 (``audit.audit_engine``), and the planted rollback and cut bugs are caught by that audit in
test_engine_audit.py; these tests keep the law on the trained pair's 256-byte vocabulary.

Each test is Pearson's chi-square after pooling (``stats.goodness_of_fit``) and rejects at
p < 1e-6 (``stats.FALSE_ALARM_RATE``): a correct engine fails it with probability 1e-6 per test, and the
seeds are fixed, so the suite is deterministic. Its power is asserted: with probability 0.99 it rejects
any law whose total variation from the exact one, on the pooled cells, exceeds the figure
``stats.detectable_tv`` gives (under 0.11 for every case here). What these tests cannot see: differences
below that TV, and laws of positions past the window.
"""

from collections import Counter

import pytest
import torch

from speculative.engine.decode import plain_decode, speculative_decode
from speculative.engine.evaluate import exact_sequence_law
from speculative.sampling import stats
from speculative.sampling.transforms import SamplingConfig

pytestmark = pytest.mark.slow
CHUNK = 1_500  # rows per decoding call, to bound the KV cache memory
TOP2 = SamplingConfig(temperature=1.0, top_k=2)
NUCLEUS = SamplingConfig(temperature=0.7, top_k=3, top_p=0.9)


_LAWS = {}


def _law(law_pair, prompt, config, length):
    key = (prompt, config, length)
    if key not in _LAWS:  # several tests share a law; it costs a few seconds to enumerate
        _LAWS[key] = exact_sequence_law(law_pair.target, prompt, config, length)
    law, margin = _LAWS[key]
    # the engine's forwards round differently from full ones (about 1e-5 in a logit); a support decided
    # by a closer margin would make the test depend on rounding
    assert margin > 1e-4, margin
    return law


def _sample(decode, prompts, rows_each, length, seed):
    """Return (Counter of emitted sequences per prompt, list of per-block accepted logs)."""
    generator = torch.Generator().manual_seed(seed)
    per_call = CHUNK // len(prompts)  # rows of each prompt per call
    counts, logs = [Counter() for _ in prompts], []
    for _ in range(rows_each // per_call):
        out = decode([p for p in prompts for _ in range(per_call)], length, generator)
        for i in range(len(prompts)):
            counts[i].update(tuple(row) for row in out.tokens[i * per_call:(i + 1) * per_call])
        logs.append(out.accepted)
    return counts, logs


def _fit(counter, law):
    """Return (the test of ``counter`` against ``law``, the law's probabilities renormalised). The last cell
    counts sequences outside the law's support: any sample there makes the test reject."""
    outcomes = list(law)
    inside = [counter.get(seq, 0) for seq in outcomes]
    observed = inside + [sum(counter.values()) - sum(inside)]
    probs = [law[s] for s in outcomes]
    total = sum(probs)
    return stats.goodness_of_fit(observed, [p / total for p in probs] + [0.0]), [p / total for p in probs]


def _paths(logs, gamma):
    """Return (blocks that follow a full acceptance, blocks with a rejection after an accepted draft)."""
    after_full = mid_reject = 0
    for accepted in logs:
        table = torch.stack(accepted)  # (blocks, rows), -1 once a row is done
        active_next = table[1:] >= 0
        after_full += int(((table[:-1] == gamma) & active_next).sum())
        mid_reject += int(((table > 0) & (table < gamma)).sum())
    return after_full, mid_reject


def test_eight_tokens_follow_their_exact_law(law_pair):
    prompt, length, rows, gamma = law_pair.prompts[1], 8, 4_500, 4
    law = _law(law_pair, prompt, TOP2, length)

    def decode(prompts, n, generator):
        return speculative_decode(law_pair.target, law_pair.draft, prompts, n, gamma, TOP2, generator)

    (counts,), logs = _sample(decode, [prompt], rows, length, seed=21 + gamma)
    result, probs = _fit(counts, law)
    assert not result.rejects(), result
    assert stats.detectable_tv(rows, stats.pooled(probs, rows)) < 0.11
    after_full, mid_reject = _paths(logs, gamma)
    assert after_full > 100  # blocks that began with the draft two tokens behind
    assert mid_reject > 100  # blocks that began after a rejection in mid-block


def test_plain_decoding_follows_the_same_exact_law(law_pair):
    # the control: the law the engine is held to is the one plain decoding samples from
    prompt, length, rows = law_pair.prompts[1], 8, 3_000
    law = _law(law_pair, prompt, TOP2, length)
    (counts,), _ = _sample(lambda prompts, n, g: plain_decode(law_pair.target, prompts, n, TOP2, g), [prompt], rows,
                           length, seed=31)
    result, probs = _fit(counts, law)
    assert not result.rejects(), result
    assert stats.detectable_tv(rows, stats.pooled(probs, rows)) < 0.11


def test_a_batch_of_two_prompt_lengths_follows_each_prompts_law(law_pair):
    # rows of 96 and 60 bytes in one batch, temperature 0.7 with top-k and top-p: each row's six tokens
    # must follow its own prompt's law (two tests: a family-wise false-alarm rate of 2e-6)
    prompts, length, rows = [law_pair.prompts[11], law_pair.prompts[1][:60]], 6, 3_000
    laws = [_law(law_pair, p, NUCLEUS, length) for p in prompts]

    def decode(batch, n, generator):
        return speculative_decode(law_pair.target, law_pair.draft, batch, n, 4, NUCLEUS, generator)

    counts, logs = _sample(decode, prompts, rows, length, seed=41)
    for counter, law in zip(counts, laws):
        assert sum(counter.values()) == rows
        result, probs = _fit(counter, law)
        assert not result.rejects(), result
        assert stats.detectable_tv(rows, stats.pooled(probs, rows)) < 0.11
    after_full, mid_reject = _paths(logs, 4)
    assert after_full > 50 and mid_reject > 50
