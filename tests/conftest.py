"""Shared fixtures and helpers."""

import importlib.util
import inspect
import os
import sys

import pytest
import torch

from speculative.engine import decode
from speculative.engine.model import GPT, GPTConfig
from speculative.engine.pair import save_pair
from speculative.sampling import sampler
from speculative.training.train import make_prompts

if os.environ.get("PYTEST_XDIST_WORKER"):
    # make test runs two pytest workers on two cores: one thread each, so that they do not fight over the cores
    torch.set_num_threads(1)

#: the test files that take longest (worker-seconds under ``pytest -n 2 --durations``, 2026-12-01), heaviest
#: first. ``make test`` hands whole files to its two workers in collection order (``--dist loadfile
#: --no-loadscope-reorder``); starting the long ones first keeps one worker from finishing minutes before
#: the other. The order changes how long the run takes, never what it tests.
HEAVY_FIRST = ("test_engine_law.py", "test_serving.py", "test_engine_law_chains.py", "test_hf.py", "test_policy.py",
               "test_audit.py", "test_decode.py", "test_cli.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(HEAVY_FIRST)))  # stable: the rest keep their order


TINY = GPTConfig(context=32, n_layer=1, n_head=2, d_model=16)


def save_tiny_pair(folder, seed: int = 0) -> str:
    """Write a small random pair (context 32) with four 10-byte prompts into ``folder``; return its sha256
    (another ``seed``, other weights)."""
    torch.manual_seed(seed)
    target, draft = GPT(TINY), GPT(GPTConfig(context=32, n_layer=1, n_head=1, d_model=8))
    prompts = make_prompts(b"line one\nline two\nline three\nline four\n" * 20, count=4, length=10)
    return save_pair(folder, target, draft, {"note": "test"}, {"log": []}, prompts)


def one_step_by_branches(target_probs, draft_probs):
    """Return (P(emitted = x) per token, P(x drafted and accepted) per token, P(a rejection)) for one step,
    by walking the algorithm's event tree: draft x with q(x), accept with min(1, p(x)/q(x)), else draw from
    the normalised residual. Written apart from rule.py (only the residual is taken from it), so that the
    rule's closed form min(p, q) + (1 - alpha) r has something independent to be checked against."""
    from speculative.exact.rule import normalized_residual

    accepted = [0 * p for p in target_probs]
    rejected = 0 * target_probs[0]
    for token, q in enumerate(draft_probs):
        if q == 0:
            continue  # never drafted
        accept = min(1, target_probs[token] / q)
        accepted[token] += q * accept
        rejected += q * (1 - accept)
    r = normalized_residual(target_probs, draft_probs)
    return [a + rejected * r_x for a, r_x in zip(accepted, r)], accepted, rejected


@pytest.fixture(scope="session")
def pair():
    """The shipped pair, loaded once per test session (tests only read it: none may train or edit it)."""
    from speculative.engine.pair import load_pair

    return load_pair()


@pytest.fixture(scope="session")
def law_pair(pair):
    """A pair for the engine's law tests, about ten times cheaper per row than the shipped one: the shipped
    draft (2 layers, d_model 128) is the target, and a copy of it with every weight nudged by Gaussian noise
    of 10% of that tensor's spread is the draft. The engine's law does not depend on the models' size, only
    on the target's forwards, which ``exact_sequence_law`` enumerates for whatever target it is given; the two
    agree often enough (about 2.8 of 4 drafts accepted at gamma = 4, T = 1, top-k 2, over the first 8
    prompts) that blocks end both after a full acceptance (about half of them) and after a rejection in
    mid-block. (With the draft shipped since chapter 14's race as the target, 3% of noise left 3.7 of 4
    accepted, too few rejections for the multi-draft law test to reach both of its root's paths.)"""
    import copy
    from types import SimpleNamespace

    target, draft = pair.draft, copy.deepcopy(pair.draft)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in draft.parameters():
            if weight.numel() > 1:
                weight.add_(torch.randn(weight.shape, generator=noise) * (0.1 * float(weight.std())))
    return SimpleNamespace(target=target, draft=draft.eval(), prompts=pair.prompts)


@pytest.fixture(scope="session")
def battery():
    """The audit's default battery, built once (about two seconds: its large tables are exact Fractions).
    Tests only read it; its cases cache their probability tensors, so sharing them saves that work too."""
    from speculative.audit.battery import default_battery

    return default_battery()


@pytest.fixture
def tiny_pair_dir(tmp_path):
    folder = tmp_path / "pair"
    save_tiny_pair(folder)
    return folder


def planted_rollback_bug():
    """A copy of decode.py whose target cache bookkeeping is off by one (one position too few rolled back)."""
    correct = "target_logits = target_call(torch.cat([last, drafts], 1), start - 1, target_cache"
    return _planted(correct, correct.replace("start - 1", "start"))


def planted_cut_bug():
    """A copy of sampler.py in which a row verified at its own length k (``lengths=``), shorter than the
    block it sits in, draws its bonus token from the target one position too far (k + 2 instead of k + 1),
    under the token-wise rule (``rejection_sample``)."""
    correct = "p_index = rows * (k + 1) + num_accepted"
    return _planted(correct, correct + " + (bonus & (ends < k)).long()", sampler)


def _planted(correct: str, wrong: str, module=decode):
    """Return a copy of ``module`` (decode.py by default) with its one ``correct`` string made ``wrong``."""
    source = inspect.getsource(module)
    assert source.count(correct) == 1
    name = f"{module.__name__}_with_planted_bug"
    copy = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    copy.__package__ = "speculative"
    sys.modules[name] = copy  # dataclasses look their module up while the class is created
    try:
        exec(compile(source.replace(correct, wrong), name, "exec"), copy.__dict__)
    finally:
        del sys.modules[name]
    return copy
