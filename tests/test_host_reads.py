"""The decoding loop reads at most one pair of numbers back to the host per block, and the sampler none.

On a GPU each host read (``.item()``, ``.tolist()``, ``bool(tensor)``, ...) stalls until the device has
finished its queued work; a small model then spends its time waiting. These tests count the reads by
patching the Tensor methods that do them (``timing.count_host_reads``) and fail above the bounds the engine
promises: at most 2 per speculative block, at most 1 per plain token. They count calls, on a CPU; a read
made inside a C++ kernel (a boolean mask, say) is not counted, so the engine avoids those by
construction (every per-row decision is a ``torch.where``).
"""

import pytest
import torch

from speculative.decode import DecodingError, plain_decode, speculative_decode
from speculative.pair import load_pair
from speculative.sampler import rejection_sample
from speculative.timing import count_host_reads
from speculative.transforms import SamplingConfig


@pytest.fixture(scope="module")
def pair():
    return load_pair()


@pytest.mark.parametrize("batch", [1, 4])
def test_speculative_decode_reads_at_most_two_values_per_block(pair, batch):
    # batch 4 with prompts of different lengths: rows finish at different blocks and are dropped
    prompts = [pair.prompts[i][:40 + 7 * i] for i in range(batch)]
    generator = torch.Generator().manual_seed(0)
    with count_host_reads() as counter:
        out = speculative_decode(pair.target, pair.draft, prompts, 64, 4, SamplingConfig(temperature=1.0), generator)
    blocks = len(out.accepted)
    assert blocks >= 64 // 5
    assert counter["reads"] <= 2 * blocks, (counter["reads"], blocks)  # the promise
    # what the loop really does: one read per block, one more for the check that finds every row done,
    # and two after the loop (the tokens and the acceptance counts); a read that crept into the loop,
    # even in some blocks only, exceeds this
    assert counter["reads"] <= blocks + 3, (counter["reads"], blocks)


def test_plain_decode_reads_at_most_one_value_per_token(pair):
    generator = torch.Generator().manual_seed(0)
    with count_host_reads() as counter:
        plain_decode(pair.target, pair.prompts[:2], 64, SamplingConfig(temperature=1.0), generator)
    assert counter["reads"] <= 64, counter["reads"]  # the promise: at most one per token
    assert counter["reads"] <= 2, counter["reads"]  # what it does: the NaN check and the tokens, after the loop


def test_the_sampler_with_checks_off_reads_nothing_back():
    generator = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(8, 5, 50, generator=generator), -1)
    draft = torch.softmax(torch.randn(8, 4, 50, generator=generator), -1)
    drafts = torch.multinomial(draft.reshape(-1, 50), 1, generator=generator).reshape(8, 4)
    with count_host_reads() as counter:
        rejection_sample(drafts, draft, target, generator, check_values=False)
    assert counter["reads"] == 0
    with count_host_reads() as counter:  # the checks are host reads: the counter does see them
        rejection_sample(drafts, draft, target, generator)
    assert counter["reads"] > 0


def test_nan_logits_inside_the_loop_are_an_error_not_silent(pair):
    # the loop's checks are deferred to the block's one read: a model that returns NaN is still caught
    class Broken(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model, self.config = model, model.config

        @property
        def device(self):
            return self.model.device

        def new_cache(self, *args, **kwargs):
            return self.model.new_cache(*args, **kwargs)

        def forward(self, *args, **kwargs):
            logits = self.model(*args, **kwargs)
            return logits if logits.shape[1] > 90 else logits.fill_(float("nan"))  # prefill fine, then NaN

    broken = Broken(pair.target)
    with pytest.raises(DecodingError, match="NaN or \\+inf logits"):
        speculative_decode(broken, pair.draft, pair.prompts[:1], 8, 2, generator=torch.Generator().manual_seed(0))
    with pytest.raises(DecodingError, match="NaN or \\+inf logits"):
        plain_decode(broken, pair.prompts[:1], 8, generator=torch.Generator().manual_seed(0))
