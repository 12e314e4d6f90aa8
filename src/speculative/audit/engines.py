"""Real engines in the engine audit's ``"models"`` convention: this library's decoder and transformers'
assisted generation.

Explained in: notebooks/12_audit_engine.

:func:`library_engine` wraps this library's :func:`decode.speculative_decode` (a fixed draft length or a
draft-length policy, token-wise or block verification); :func:`hf_engine` wraps transformers'
``generate()`` with an assistant model or prompt lookup, in each configuration of
:data:`HF_CONFIGURATIONS`. The cases they run on are :mod:`engine_cases`'.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from speculative.sampling.transforms import SamplingConfig

__all__ = ["library_engine", "LIBRARY_FORMS", "hf_engine", "HF_CONFIGURATIONS"]

#: The forms of this library's engine that the audit runs (:func:`library_engine`'s options): a fixed
#: length under each rule and in a batch of mixed prompt lengths (chapter 12 audits these three), then
#: every draft-length policy with each row's own length under both rules, and the policies whose length
#: can differ from row to row with a length the batch shares (``tests/test_engine_audit.py`` audits all).
LIBRARY_FORMS = ({}, {"rule": "block"}, {"mixed": True}) + tuple(
    {"policy": policy, "rule": rule, "per_row": per_row} for policy, rule, per_row in [
        ("heuristic", "token", True), ("confidence", "token", True), ("auto", "token", True),
        ("heuristic", "block", True), ("confidence", "block", True), ("auto", "block", True),
        ("confidence", "token", False), ("auto", "token", False), ("confidence", "block", False)])


def library_engine(gamma=2, rule: str = "token", per_row: bool = False, mixed: bool = False,
                   policy: Optional[str] = None, max_gamma: int = 3) -> Callable:
    """This library's :func:`decode.speculative_decode` in the ``"models"`` convention.

    ``gamma`` is a fixed length, or ``policy`` names a draft-length policy (:func:`policy.make_policy`,
    started at ``gamma``, at most ``max_gamma`` drafts; ``auto`` gets a fixed made-up calibration: the law
    holds for any). ``mixed=True`` decodes the n rows in one batch with n rows of a prompt two tokens
    shorter, interleaved, so that rows of different lengths share every block (only the case's rows are
    returned)."""
    from speculative.engine.decode import speculative_decode
    from speculative.engine.policy import make_policy

    def engine(target, draft, prompt, max_new_tokens, config, generator, n):
        length = gamma
        if policy is not None:
            length = make_policy(policy, gamma=gamma, calibration={"c": 0.1, "v": {1: 1.3, 4: 1.4, 8: 1.6}},
                                 max_gamma=max_gamma)
        rows = [list(prompt)] * n
        if mixed:
            rows = [row for pair in zip(rows, [list(prompt[:-2]) or list(prompt)] * n) for row in pair]
        out = speculative_decode(target, draft, rows, max_new_tokens, length, config, generator, rule=rule,
                                 per_row=per_row)
        return torch.tensor(out.tokens[::2] if mixed else out.tokens)

    bits = [f"{policy} policy" if policy else f"fixed γ = {gamma}", f"{rule} verification"]
    bits += ["per-row lengths"] * per_row + ["rows of two lengths in one batch"] * mixed
    engine.__qualname__ = "speculative_decode (" + ", ".join(bits) + ")"
    return engine


# --------------------------------------------------------------------------- transformers' assisted generation


#: The transformers configurations ``audit-engine hf`` audits: a label, generate() settings, and the
#: battery cases (by name) they run on; ``None`` for the assistant means prompt-lookup decoding.
_CONSTANT = {"num_assistant_tokens": 3, "num_assistant_tokens_schedule": "constant",
             "assistant_confidence_threshold": 0.0}
HF_CONFIGURATIONS = {
    "T = 1, constant γ = 3": (dict(_CONSTANT), ["V = 3, T = 1"]),
    "T = 0.7, top-k 4, top-p 0.9": (dict(_CONSTANT), ["V = 6, T = 0.7, top-k 4, top-p 0.9"]),
    "repetition penalty 1.5": (dict(_CONSTANT), ["V = 3, repetition penalty 1.5"]),
    "heuristic schedule": ({**_CONSTANT, "num_assistant_tokens_schedule": "heuristic"}, ["V = 4, top-k 3"]),
    "confidence threshold 0.4": ({**_CONSTANT, "num_assistant_tokens": 5, "assistant_confidence_threshold": 0.4},
                                 ["V = 3, T = 1"]),
    "prompt lookup": ({"prompt_lookup_num_tokens": 3}, ["V = 3, T = 1"]),
}


def _hf_sampling(config: SamplingConfig) -> dict:
    return {"do_sample": True, "temperature": float(config.temperature), "top_k": config.top_k or 0,
            "top_p": float(config.top_p) if config.top_p is not None else 1.0,
            "repetition_penalty": float(getattr(config, "repetition_penalty", 1.0))}


def hf_engine(settings: dict) -> Callable:
    """transformers' ``generate()`` in the ``"models"`` convention: the case's models exported with
    :func:`hf.export`, ``do_sample`` with the case's processors, and ``settings`` (the assistant's
    generation-config fields, or ``prompt_lookup_num_tokens`` for prompt-lookup decoding, which has no
    assistant). One row per call; its randomness is the global torch RNG, seeded from ``generator``."""
    from transformers import GenerationConfig

    from speculative.engine.hf import _quiet, export

    exported: dict = {}
    lookup = "prompt_lookup_num_tokens" in settings

    def engine(target, draft, prompt, max_new_tokens, config, generator, n):
        for model in (target, draft):
            if id(model) not in exported:
                exported[id(model)] = (model, export(model))  # keep the model alive: ids are reused
        hf_target, hf_draft = exported[id(target)][1], exported[id(draft)][1]
        ids = torch.tensor([list(prompt)])
        kwargs = {"prompt_lookup_num_tokens": settings["prompt_lookup_num_tokens"]} if lookup else \
            {"assistant_model": hf_draft}
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
        rows = []
        with _quiet():
            for _ in range(n):
                if not lookup:  # each call starts from the settings: the heuristic schedule writes its state back
                    hf_draft.generation_config = GenerationConfig(**settings)
                out = hf_target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                         min_new_tokens=max_new_tokens, pad_token_id=0, **kwargs,
                                         **_hf_sampling(config))
                rows.append(out[0, ids.shape[1]:])
        return torch.stack(rows)

    engine.__qualname__ = "transformers generate(" + ", ".join(f"{k}={v}" for k, v in settings.items()) + ")"
    return engine

