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

from speculative.exact.rule import validate_distribution

__all__ = ["SamplingConfig", "PenalizedConfig", "penalized_logits", "refuse_penalty", "logits_to_probs",
           "logits_problem", "exact_transform", "ServingConfig", "as_serving", "serving_logits", "serving_probs",
           "min_p_margin"]


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
    engine audit (:mod:`engine_cases`) uses it for engines that claim to apply one."""

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


# --------------------------------------------------------------------------- what a server request adds


def _number(value, name: str, low: float, high: float = float("inf"), closed_low: bool = True) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and value == value
    ok = ok and (low <= value if closed_low else low < value) and value < high
    if not ok:
        raise ValueError(f"{name} must be a number in {'[' if closed_low else '('}{low:g}, {high:g}), got {value!r}")


@dataclass(frozen=True)
class ServingConfig(SamplingConfig):
    """A :class:`transforms.SamplingConfig` with the sampling fields of an OpenAI-compatible request."""

    min_p: float = 0.0  # drop tokens whose probability is below min_p times the largest; 0: off
    presence_penalty: float = 0.0  # subtracted once from each token already in the output
    frequency_penalty: float = 0.0  # subtracted once per occurrence in the output
    repetition_penalty: float = 1.0  # over prompt and output: positive logits divided, negative multiplied
    logit_bias: tuple = ()  # ((token id, bias), ...), added to the logits first

    def __post_init__(self):
        super().__post_init__()
        _number(self.min_p, "min_p", 0, 1)
        _number(self.presence_penalty, "presence_penalty", -2, 2.000001)
        _number(self.frequency_penalty, "frequency_penalty", -2, 2.000001)
        _number(self.repetition_penalty, "repetition_penalty", 0, closed_low=False)
        for pair in self.logit_bias:
            if (not isinstance(pair, tuple) or len(pair) != 2 or isinstance(pair[0], bool)
                    or not isinstance(pair[0], int) or pair[0] < 0):
                raise ValueError(f"logit_bias must hold (token id >= 0, bias) pairs, got {pair!r}")
            _number(pair[1], "a logit bias", -100, 100.000001)

    @property
    def penalised(self) -> bool:
        return (self.presence_penalty, self.frequency_penalty, self.repetition_penalty) != (0, 0, 1)

    def describe(self) -> str:
        bits = [super().describe()]
        names = [("min_p", "min-p"), ("presence_penalty", "presence"), ("frequency_penalty", "frequency")]
        bits += [f"{label} {getattr(self, key):g}" for key, label in names if getattr(self, key)]
        if self.repetition_penalty != 1:
            bits.append(f"repetition {self.repetition_penalty:g}")
        if self.logit_bias:
            bits.append("logit_bias " + ",".join(f"{t}:{b:+g}" for t, b in self.logit_bias))
        return ", ".join(bits)

    def request_fields(self) -> dict:
        """The fields of an OpenAI-compatible request (and of vLLM's ``SamplingParams``) for this config."""
        fields = {"temperature": float(self.temperature), "top_p": float(self.top_p or 1.0),
                  "top_k": int(self.top_k or -1), "min_p": float(self.min_p),
                  "presence_penalty": float(self.presence_penalty),
                  "frequency_penalty": float(self.frequency_penalty),
                  "repetition_penalty": float(self.repetition_penalty)}
        if self.logit_bias:
            fields["logit_bias"] = {int(t): float(b) for t, b in self.logit_bias}
        return fields


def as_serving(config: SamplingConfig) -> ServingConfig:
    """``config`` as a :class:`ServingConfig` (a plain config has no penalty, bias or min_p)."""
    if isinstance(config, ServingConfig):
        return config
    extra = {"repetition_penalty": float(config.repetition_penalty)} if hasattr(config, "repetition_penalty") else {}
    return ServingConfig(config.temperature, config.top_k, config.top_p, **extra)


def serving_logits(logits: torch.Tensor, config: ServingConfig, tokens: torch.Tensor, lengths: torch.Tensor,
                   prompt_length: int) -> torch.Tensor:
    """Return ``logits`` (B, V) after the bias and the penalties, for rows whose context is
    ``tokens[b, :lengths[b]]`` and whose first ``prompt_length`` tokens are the prompt."""
    x = logits.float()
    vocab = x.shape[-1]
    if config.logit_bias:
        bias = torch.zeros(vocab)
        for token, value in config.logit_bias:
            if token >= vocab:
                raise ValueError(f"logit_bias names token {token}, outside the vocabulary of {vocab}")
            bias[token] += value
        x = x + bias
    if not config.penalised:
        return x
    positions = torch.arange(tokens.shape[1])
    valid = positions < lengths.unsqueeze(1)
    output = valid & (positions >= prompt_length)
    safe = torch.where(valid, tokens, 0)
    counts = torch.zeros(len(x), vocab).scatter_add_(1, safe, output.float())
    seen = torch.zeros(len(x), vocab).scatter_add_(1, safe, valid.float()) > 0
    if config.repetition_penalty != 1:
        penalty = float(config.repetition_penalty)
        x = torch.where(seen, torch.where(x > 0, x / penalty, x * penalty), x)
    return x - config.frequency_penalty * counts - config.presence_penalty * (counts > 0).float()


def serving_probs(logits: torch.Tensor, config: ServingConfig, tokens: torch.Tensor, lengths: torch.Tensor,
                  prompt_length: int) -> torch.Tensor:
    """The distribution sampled from (B, V), in vLLM's order (see the module docstring)."""
    x = serving_logits(logits, config, tokens, lengths, prompt_length)
    if config.greedy:
        return logits_to_probs(x, SamplingConfig(0), check=False)
    x = x / float(config.temperature)
    if config.min_p > 0:
        probs = torch.softmax(x, -1)
        x = x.masked_fill(probs < config.min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return logits_to_probs(x, SamplingConfig(1.0, config.top_k, config.top_p), check=False)


def min_p_margin(logits: torch.Tensor, config: ServingConfig) -> float:
    """How far every token's probability is from min_p times the largest (relative), over rows (B, V)."""
    if not config.min_p or config.greedy:
        return float("inf")
    probs = torch.softmax(logits.float() / float(config.temperature), -1)
    ratio = probs / probs.amax(-1, keepdim=True)
    return float((ratio - config.min_p).abs().min())
