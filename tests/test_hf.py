"""speculative.hf: the shipped models exported to transformers' GPT-2 (issue 13, first step)."""

import pytest
import torch

from speculative.decode import plain_decode
from speculative.hf import export
from speculative.pair import load_pair
from speculative.transforms import SamplingConfig


@pytest.fixture(scope="module")
def pair():
    return load_pair()


@pytest.mark.parametrize("name", ["target", "draft"])
def test_exported_logits_equal_the_library_models(pair, name):
    model = getattr(pair, name)
    hf = export(model)
    tokens = torch.randint(0, 256, (3, model.config.context), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    assert theirs.shape == ours.shape
    assert (ours - theirs).abs().max().item() < 1e-4  # float32, every position of the context
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied, as ours


def test_the_check_can_fail_a_misplaced_layer_is_seen(pair):
    hf = export(pair.draft)
    layer = hf.transformer.h[0].mlp.c_fc
    with torch.no_grad():  # scramble one exported layer (its input rows reversed): the logits must move
        layer.weight.copy_(layer.weight.flip(0))
        tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(2))
        assert (pair.draft(tokens) - hf(tokens).logits).abs().max().item() > 1e-2


def test_transformers_greedy_generation_equals_the_engines(pair):
    hf = export(pair.target)
    prompt = pair.prompts[5]
    ids = torch.tensor([list(prompt)])
    generated = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    ours = plain_decode(pair.target, [prompt], 24, SamplingConfig(temperature=0.0))
    assert generated[0, ids.shape[1]:].tolist() == ours.tokens[0]


def test_export_refuses_anything_but_the_library_gpt():
    with pytest.raises(TypeError, match="library's GPT"):
        export(torch.nn.Linear(2, 2))
