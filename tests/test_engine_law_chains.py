"""The multi-draft engine's law, past the first block: test_engine_law.py's test, for k chains per block.

``multi_draft.multi_draft_decode`` takes one prompt per call (its chains are the batch), so its rows cannot be
batched as test_engine_law.py's are: each row is a call, and these two cases are the slowest of the suite.
They live in a file of their own so that ``make test``'s two workers (``--dist loadfile``) can run them
beside the other law tests rather than after them. The test, its rejection threshold (p < 1e-6,
``stats.FALSE_ALARM_RATE``) and its stated power are test_engine_law.py's; the power is asserted below.
"""

from collections import Counter

import pytest
import torch

from speculative.sampling import stats
from test_engine_law import TOP2, _fit, _law

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scheme", ["with_replacement", "without_replacement"])
def test_multi_draft_decoding_follows_the_exact_law(law_pair, scheme):
    # chapter 10: two chains per block as two rows, root verified by the scheme, chosen chain token-wise.
    # One prompt per call (its chains are the batch), so fewer rows: the detectable TV is asserted below.
    from speculative.engine.multi_draft import multi_draft_decode

    # the last 24 bytes of a shipped prompt: each call prefills both models again, and a short prompt makes
    # that prefill cheaper than a whole 96-byte one. After it the root is still rejected often: in 39 to 90
    # of 300 calls, by scheme, when probed
    prompt, length, rows, gamma = law_pair.prompts[1][-24:], 6, 1_500, 2
    law = _law(law_pair, prompt, TOP2, length)
    generator = torch.Generator().manual_seed(71)
    counts, roots_rejected, chains_used = Counter(), 0, 0
    for _ in range(rows):
        out = multi_draft_decode(law_pair.target, law_pair.draft, prompt, length, gamma, 2, TOP2, generator,
                                 scheme=scheme)
        counts[tuple(out.tokens[0])] += 1
        blocks = [int(a) for a in out.accepted]
        roots_rejected += blocks.count(0)
        chains_used += sum(a == gamma for a in blocks)
    result, probs = _fit(counts, law)
    assert not result.rejects(), result
    assert stats.detectable_tv(rows, stats.pooled(probs, rows)) < 0.15
    assert roots_rejected > 50 and chains_used > 50  # both paths of the root were exercised
