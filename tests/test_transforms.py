"""transforms.py: temperature, greedy, top-k, top-p, their boundary rules and their errors."""

from fractions import Fraction as F

import pytest
import torch

from speculative.sampling.transforms import SamplingConfig, exact_transform, logits_to_probs


def test_temperature_one_is_softmax():
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    assert torch.allclose(logits_to_probs(logits), torch.softmax(logits, -1))


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 0.5])
    assert torch.allclose(logits_to_probs(logits, SamplingConfig(temperature=0.5)), torch.softmax(logits * 2, -1))


def test_greedy_is_one_hot_with_lowest_id_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 1.0, 5.0, 5.0]])
    out = logits_to_probs(logits, SamplingConfig(temperature=0))
    assert torch.equal(out, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))


def test_greedy_is_the_limit_of_low_temperature():
    logits = torch.tensor([0.3, 1.7, 1.2, -0.5])
    cold = logits_to_probs(logits, SamplingConfig(temperature=0.01))
    assert torch.allclose(cold, logits_to_probs(logits, SamplingConfig(temperature=0)), atol=1e-15)


def test_top_k_keeps_ties_at_the_boundary():
    logits = torch.tensor([3.0, 2.0, 2.0, 1.0])
    out = logits_to_probs(logits, SamplingConfig(top_k=2))
    assert (out > 0).tolist() == [True, True, True, False]  # the k-th value is tied: both kept
    assert torch.isclose(out.sum(), torch.tensor(1.0))


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    out = logits_to_probs(logits, SamplingConfig(top_p=0.7))
    # mass before each sorted token: 0, 0.5, 0.8, ... -> keep the first two (0.5 < 0.7), drop the rest
    assert (out > 0).tolist() == [True, True, False, False]
    assert torch.allclose(out, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_top_p_boundary_is_strict():
    probs = [F(1, 2), F(1, 4), F(1, 4)]
    # mass before the second token is exactly 1/2 = top_p: it is dropped (kept only if strictly below)
    assert exact_transform(probs, SamplingConfig(top_p=F(1, 2))) == [1, 0, 0]
    assert exact_transform(probs, SamplingConfig(top_p=F(1, 2) + F(1, 100))) == [F(2, 3), F(1, 3), 0]


def test_top_p_one_keeps_everything():
    logits = torch.tensor([1.0, -20.0, 0.0])
    assert torch.allclose(logits_to_probs(logits, SamplingConfig(top_p=1.0)), torch.softmax(logits, -1))


def test_torch_and_exact_transforms_agree():
    probs = [F(4, 10), F(3, 10), F(2, 10), F(1, 10)]
    logits = torch.tensor([float(p) for p in probs], dtype=torch.float64).log()
    for config in [SamplingConfig(), SamplingConfig(temperature=F(1, 2)), SamplingConfig(top_k=3),
                   SamplingConfig(top_p=0.6), SamplingConfig(temperature=0), SamplingConfig(top_k=2, top_p=0.9)]:
        exact = [float(v) for v in exact_transform(probs, config)]
        assert torch.allclose(logits_to_probs(logits, config).double(), torch.tensor(exact, dtype=torch.float64),
                              atol=1e-6), config


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_give_float32_probs(dtype):
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)).to(dtype)
    out = logits_to_probs(logits, SamplingConfig(temperature=0.7, top_p=0.9))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert torch.allclose(out.sum(-1), torch.ones(3))


@pytest.mark.parametrize(
    "kwargs, message",
    [({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
     ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": 0}, "top_k"), ({"top_k": 2.5}, "top_k")],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def test_bad_logits():
    with pytest.raises(ValueError, match="NaN"):
        logits_to_probs(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="entirely -inf"):
        logits_to_probs(torch.full((2, 3), float("-inf")))
    with pytest.raises(ValueError, match="floating-point"):
        logits_to_probs(torch.tensor([1, 2]))


def test_exact_transform_needs_a_whole_inverse_temperature():
    with pytest.raises(ValueError, match="whole number"):
        exact_transform([F(1, 2), F(1, 2)], SamplingConfig(temperature=0.7))


def test_describe():
    assert SamplingConfig(temperature=0).describe() == "greedy"
    assert SamplingConfig(temperature=0.7, top_p=0.9).describe() == "T=0.7, top-p=0.9"
