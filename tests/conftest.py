"""Shared fixtures."""

import pytest
import torch

from speculative.model import GPT, GPTConfig
from speculative.pair import save_pair
from speculative.train import make_prompts

TINY = GPTConfig(context=32, n_layer=1, n_head=2, d_model=16)


def save_tiny_pair(folder) -> str:
    """Write a small random pair (context 32) with four 10-byte prompts into ``folder``; return its sha256."""
    torch.manual_seed(0)
    target, draft = GPT(TINY), GPT(GPTConfig(context=32, n_layer=1, n_head=1, d_model=8))
    prompts = make_prompts(b"line one\nline two\nline three\nline four\n" * 20, count=4, length=10)
    return save_pair(folder, target, draft, {"note": "test"}, {"log": []}, prompts)


@pytest.fixture
def tiny_pair_dir(tmp_path):
    folder = tmp_path / "pair"
    save_tiny_pair(folder)
    return folder
