"""The distribution actually sampled from: temperature, greedy, top-k and top-p.

Explained in: notebooks/04_transforms.

Speculative sampling is exact only when p and q in the rule are the distributions the target and the
draft *actually sample from*. So the same :func:`logits_to_probs` must produce both, with the same
:class:`SamplingConfig`, and the sampler must be handed its output, never raw softmax probabilities.

Order of operations (as in Hugging Face transformers and vLLM): temperature, then top-k, then top-p.

Rules at the boundaries, stated once:

- **Greedy** (``temperature == 0``): a one-hot on the arg-max; among tied maxima, the lowest token id.
- **Top-k**: keep every token whose logit is at least the k-th largest logit; tokens tied with the k-th
  are all kept, so more than k tokens survive on a tie.
- **Top-p**: sort tokens by probability, largest first (ties: lower token id first) and keep the shortest
  prefix whose mass reaches ``top_p``, i.e. keep a token when the mass strictly before it is < ``top_p``.
  The token that crosses the threshold is kept. ``top_p = 1`` keeps every token.

:func:`exact_transform` applies the same rules to exact ``Fraction`` distributions, so chapters and tests
can compute what a transform does without rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence

import torch

from .rule import validate_distribution

__all__ = ["SamplingConfig", "PenalizedConfig", "penalized_logits", "refuse_penalty", "logits_to_probs",
           "logits_problem", "exact_transform"]


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become the distribution that is sampled from; used alike for draft and target."""

    temperature: float = 1.0  # > 0 divides the logits; 0 means greedy (one-hot on the arg-max)
    top_k: Optional[int] = None  # keep the k most likely tokens (ties at the k-th kept); None: no limit
    top_p: Optional[float] = None  # keep the smallest head of mass >= top_p, in (0, 1]; None: no limit

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float, Fraction)) or t != t or t < 0 or t == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float, Fraction)) or not 0 < p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> str:
        """Return a short label such as ``T=0.7, top-p=0.9`` for tables and plots."""
        parts = ["greedy" if self.greedy else f"T={self.temperature:g}"]
        if self.top_k is not None:
            parts.append(f"top-k={self.top_k}")
        if self.top_p is not None and self.top_p < 1:
            parts.append(f"top-p={self.top_p:g}")
        return ", ".join(parts)


@dataclass(frozen=True)
class PenalizedConfig(SamplingConfig):
    """A :class:`SamplingConfig` with a repetition penalty, as transformers applies it
    (``RepetitionPenaltyLogitsProcessor``, after Keskar et al.): before the temperature, every token already
    in the context (prompt included) has its logit divided by the penalty when positive and multiplied by
    it when negative. It depends on the context, so :func:`logits_to_probs` alone cannot apply it: apply
    :func:`penalized_logits` first. The library's decoding loops refuse it (:func:`refuse_penalty`); the
    engine audit (:mod:`engines`) uses it for engines that claim to apply one."""

    repetition_penalty: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        r = self.repetition_penalty
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r < float("inf"):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {r!r}")

    def describe(self) -> str:
        text = super().describe()
        return text + (f", repetition penalty {self.repetition_penalty:g}" if self.repetition_penalty != 1 else "")


def penalized_logits(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Return ``logits`` (B, V) with transformers' repetition penalty applied where ``seen`` (B, V, bool)
    marks a token already in the row's context."""
    if penalty == 1:
        return logits
    x = logits.float()
    return torch.where(seen, torch.where(x > 0, x / penalty, x * penalty), x)


def refuse_penalty(config: SamplingConfig) -> None:
    """Raise ``ValueError`` for a config with a repetition penalty: a loop that cannot apply it must not
    silently ignore it (the bug of TensorRT-LLM #17701)."""
    if getattr(config, "repetition_penalty", 1) != 1:
        raise ValueError("this decoding loop does not apply a repetition penalty; use a config without one")


def logits_problem(logits: torch.Tensor) -> torch.Tensor:
    """Return a 0-d bool tensor, True when some row of ``logits`` holds NaN or +inf or is entirely -inf.

    It stays on the device: a decoding loop ORs it over every call and reads it once per block.
    """
    return ~torch.isfinite(logits.amax(dim=-1)).all()


def logits_to_probs(logits: torch.Tensor, config: SamplingConfig = SamplingConfig(), *,
                    check: bool = True) -> torch.Tensor:
    """Return the distribution sampled from, ``(..., V)`` float32, for logits ``(..., V)`` of any float dtype.

    Half-precision logits are upcast to float32 before any arithmetic, so float16 and bfloat16 inputs get
    the same rules as float32 ones. Rows are exactly normalised up to float32 rounding; masked tokens are
    exactly 0. ``check=False`` skips the NaN / inf check, which reads a value back to the host; a caller
    that does so checks :func:`logits_problem` itself.
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {type(logits).__name__}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have a vocabulary dimension of size >= 1, got shape {tuple(logits.shape)}")
    # one pass and one check: a row's maximum is NaN if the row holds a NaN, +inf if it holds +inf, and
    # -inf if every entry is -inf; the message is worked out only when something is wrong
    if check and bool(logits_problem(logits)):
        if not bool((logits < float("inf")).all()):  # NaN and +inf both fail the comparison
            raise ValueError("logits contain NaN or +inf (mask tokens with -inf instead)")
        raise ValueError("a row of logits is entirely -inf: no token can be sampled")
    x = logits.float()
    if config.greedy:
        return torch.nn.functional.one_hot(x.argmax(dim=-1), x.shape[-1]).float()  # argmax: first maximum
    if config.temperature != 1:
        x = x / float(config.temperature)
    if config.top_k is not None and config.top_k < x.shape[-1]:
        kth = torch.topk(x, config.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if config.top_p is not None and config.top_p < 1:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= float(config.top_p)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)  # the kept head has mass >= top_p > 0
    return probs


def exact_transform(probs: Sequence, config: SamplingConfig) -> list[Fraction]:
    """Return the exact distribution sampled from, for an exact distribution ``probs`` (temperature 1 logits).

    Temperature T acts on probabilities as p^(1/T), renormalised; to stay rational, 1/T must be a whole
    number (T = 1, 1/2, 1/3, ...) unless T = 0 (greedy). Top-k and top-p follow the module's rules.
    """
    values = [Fraction(v) for v in validate_distribution(probs, "probs")]
    if config.greedy:
        best = max(values)
        first = values.index(best)
        return [Fraction(int(i == first)) for i in range(len(values))]
    inverse = 1 / Fraction(config.temperature)
    if inverse.denominator != 1:
        raise ValueError(f"exact_transform needs 1/temperature to be a whole number, got T = {config.temperature}")
    powered = [v ** int(inverse) for v in values]
    total = sum(powered)
    values = [v / total for v in powered]
    if config.top_k is not None and config.top_k < len(values):
        kth = sorted(values, reverse=True)[config.top_k - 1]
        values = [v if v >= kth else Fraction(0) for v in values]
    if config.top_p is not None and config.top_p < 1:
        order = sorted(range(len(values)), key=lambda i: (-values[i], i))
        kept, mass_before = set(), Fraction(0)
        for i in order:
            if mass_before >= Fraction(config.top_p):
                break
            kept.add(i)
            mass_before += values[i]
        values = [v if i in kept else Fraction(0) for i, v in enumerate(values)]
    total = sum(values)
    return [v / total for v in values]
