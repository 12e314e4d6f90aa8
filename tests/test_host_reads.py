"""The decoding loop reads back to the host once per block, a draft-length policy included, and the sampler never.

On a GPU each host read (``.item()``, ``.tolist()``, ``bool(tensor)``, ...) stalls until the device has
finished its queued work; a small model then spends its time waiting. These tests count the reads by
patching the Tensor methods that do them (``timing.count_host_reads``) and fail above the bounds the engine
promises: at most 2 per speculative block, at most 1 per plain token. A policy's outcome (each row's
accepted drafts, for its state) comes back in the next block's read, so it adds none; a confidence stop
adds one per draft step. They count calls, on a CPU; a read
made inside a C++ kernel (a boolean mask, say) is not counted, so the engine avoids those by
construction (every per-row decision is a ``torch.where``).
"""

import pytest
import torch

from speculative.engine.decode import DecodingError, plain_decode, speculative_decode
from speculative.engine.pair import load_pair
from speculative.engine.policy import make_policy
from speculative.engine.timing import count_host_reads
from speculative.sampling.sampler import rejection_sample
from speculative.sampling.transforms import SamplingConfig


@pytest.fixture(scope="module")
def pair():
    return load_pair()


CALIBRATION = {"c": 0.1, "v": {1: 1.3, 4: 1.4, 8: 1.6}}


@pytest.mark.parametrize("gamma, batch, per_row", [
    ("fixed", 1, False), ("fixed", 4, False), ("heuristic", 4, False), ("heuristic", 4, True), ("auto", 1, False),
    ("confidence", 4, False), ("confidence", 4, True)])
def test_speculative_decode_reads_once_per_block(pair, gamma, batch, per_row):
    # batch 4 with prompts of different lengths: rows finish at different blocks and are dropped
    prompts = [pair.prompts[i][:40 + 7 * i] for i in range(batch)]
    generator = torch.Generator().manual_seed(0)
    policy = 4 if gamma == "fixed" else make_policy(gamma, gamma=4, calibration=CALIBRATION)
    with count_host_reads() as counter:
        out = speculative_decode(pair.target, pair.draft, prompts, 64, policy, SamplingConfig(temperature=1.0),
                                 generator, per_row=per_row)
    blocks = len(out.accepted)
    assert blocks >= 64 // 9
    # a confidence stop reads once per draft step after a block's first (at most once per draft forward)
    steps = out.draft_forwards - 1 if gamma == "confidence" else 0  # (less the prefill's forward)
    assert counter["reads"] <= 2 * blocks + steps, (counter["reads"], blocks)  # the promise
    # what the loop really does: one read per block (with the last block's outcome for a policy), one
    # more for the check that finds every row done, and two after the loop (the tokens, and the accepted
    # counts with the lengths); a read that crept into the loop, even in some blocks only, exceeds this
    assert counter["reads"] <= blocks + 3 + steps, (counter["reads"], blocks)


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


@pytest.mark.parametrize("broken_model", ["target", "draft"])
def test_nan_logits_inside_the_loop_are_an_error_not_silent(pair, broken_model):
    # the loop's checks are deferred to the block's one read: a model that returns NaN is still caught,
    # the draft's included when only its later steps (one-token forwards, checked together) go wrong
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
            fine = logits.shape[1] > (90 if broken_model == "target" else 1)  # the draft: its first step fine
            return logits if fine else logits.fill_(float("nan"))  # prefill fine, then NaN

    models = {"target": pair.target, "draft": pair.draft}
    models[broken_model] = Broken(models[broken_model])
    with pytest.raises(DecodingError, match="NaN or \\+inf logits"):
        speculative_decode(models["target"], models["draft"], pair.prompts[:1], 8, 2,
                           generator=torch.Generator().manual_seed(0))
    with pytest.raises(DecodingError, match="NaN or \\+inf logits"):
        plain_decode(models[broken_model], pair.prompts[:1], 8, generator=torch.Generator().manual_seed(0))
