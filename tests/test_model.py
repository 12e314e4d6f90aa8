"""model.py: logits computed through the KV cache equal those of a full forward without it."""

import pytest
import torch

from speculative.engine.model import GPT, GPTConfig

CONFIG = GPTConfig(context=64, n_layer=2, n_head=2, d_model=32)
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(CONFIG).eval()


def _full(model, tokens):
    with torch.no_grad():
        return model(tokens)


@torch.no_grad()
def test_prefill_and_single_steps_match_the_full_forward(model):
    tokens = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(1))
    reference = _full(model, tokens)
    cache = model.new_cache(3)
    prefill = model(tokens[:, :20], torch.zeros(3, dtype=torch.long), cache)
    assert torch.allclose(prefill, reference[:, :20], **TOL)
    for t in range(20, 40):
        step = model(tokens[:, t:t + 1], torch.full((3,), t), cache)
        assert torch.allclose(step[:, 0], reference[:, t], **TOL), t


@torch.no_grad()
def test_multi_token_verification_matches(model):
    tokens = torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(2))
    reference = _full(model, tokens)
    cache = model.new_cache(2)
    model(tokens[:, :22], torch.zeros(2, dtype=torch.long), cache)
    verify = model(tokens[:, 22:27], torch.full((2,), 22), cache)  # five positions at once
    assert torch.allclose(verify, reference[:, 22:27], **TOL)


@torch.no_grad()
def test_rollback_then_new_tokens(model):
    generator = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 256, (2, 25), generator=generator)
    rejected = torch.randint(0, 256, (2, 6), generator=generator)
    accepted = torch.randint(0, 256, (2, 4), generator=generator)
    cache = model.new_cache(2)
    model(prefix, torch.zeros(2, dtype=torch.long), cache)
    model(rejected, torch.full((2,), 25), cache)  # written, then rolled back by moving the position back
    after = model(accepted, torch.full((2,), 25), cache)
    reference = _full(model, torch.cat([prefix, accepted], 1))[:, 25:]
    assert torch.allclose(after, reference, **TOL)


@torch.no_grad()
def test_rows_at_different_positions(model):
    generator = torch.Generator().manual_seed(4)
    a, b = torch.randint(0, 256, (1, 30), generator=generator), torch.randint(0, 256, (1, 30), generator=generator)
    cache = model.new_cache(2)
    model(torch.cat([a[:, :12], b[:, :12]]), torch.zeros(2, dtype=torch.long), cache)
    # row 0 has 12 cached positions, row 1 has 17 after this write; step both in one call
    model(torch.cat([a[:, 12:17], b[:, 12:17]]), torch.tensor([12, 12]), cache)
    step = model(torch.cat([a[:, 17:18], b[:, 17:18]]), torch.tensor([17, 17]), cache)
    assert torch.allclose(step[0, 0], _full(model, a[:, :18])[0, 17], **TOL)
    assert torch.allclose(step[1, 0], _full(model, b[:, :18])[0, 17], **TOL)
    # now move row 0 back to position 13 while row 1 goes on at 18
    step = model(torch.cat([b[:, 0:1], b[:, 18:19]]), torch.tensor([13, 18]), cache)
    row0 = torch.cat([a[:, :13], b[:, 0:1]], 1)
    assert torch.allclose(step[0, 0], _full(model, row0)[0, 13], **TOL)
    assert torch.allclose(step[1, 0], _full(model, b[:, :19])[0, 18], **TOL)


@torch.no_grad()
def test_bad_calls(model):
    with pytest.raises(ValueError, match="integer ids"):
        model(torch.tensor([[300]]))
    with pytest.raises(ValueError, match="exceed the context"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="start must be an int or have shape"):
        model(torch.zeros(2, 3, dtype=torch.long), torch.zeros(1, dtype=torch.long), model.new_cache(2))
    with pytest.raises(ValueError, match="outside"):
        model(torch.zeros(1, 3, dtype=torch.long), torch.tensor([62]), model.new_cache(1))
    with pytest.raises(ValueError, match="span 2 does not cover position 3"):
        model(torch.zeros(1, 4, dtype=torch.long), 0, model.new_cache(1), span=2)
    with pytest.raises(ValueError, match="start must be an int or have shape"):
        model(torch.zeros(1, 2, dtype=torch.long), True, model.new_cache(1))
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(d_model=30, n_head=4)


def test_broadcast_copies_one_row_like_select(model):
    cache = model.new_cache(1, length=16)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), 0, cache)
    wide, picked = cache.broadcast(4), cache.select(torch.zeros(4, dtype=torch.long))
    assert torch.equal(wide.keys, picked.keys) and torch.equal(wide.values, picked.values) and wide.batch == 4
    wide.keys[:, 1] += 1  # rows are copies, not views of one another
    assert torch.equal(wide.keys[:, 0], cache.keys[:, 0])
    with pytest.raises(ValueError, match="one row"):
        wide.broadcast(2)
