"""The batched rejection sampler: verify k drafted tokens per row against the target, in one pass.

Explained in: notebooks/04_transforms and notebooks/05_pitfalls.

Inputs, for a batch of B rows and k drafted tokens per row over a vocabulary of V tokens:

- ``draft_tokens``  ``(B, k)`` int64: the drafted tokens, x_1..x_k;
- ``draft_probs``   ``(B, k, V)``: q at each drafted position, the distribution each x_i was sampled from;
- ``target_probs``  ``(B, k+1, V)``: p at the same positions, plus one more for the bonus token;
- a ``torch.Generator`` (or pre-drawn randomness, see :func:`draw_randomness`).

Both probability tensors must already be the distributions sampled from (see ``transforms``).

Output per row: the number of accepted drafts n, and the emitted tokens x_1..x_n followed by one more:
a token of the normalised residual max(p - q, 0) at position n+1 if x_{n+1} was rejected, or the bonus
token from p at position k+1 if all k were accepted.

Rows of one call may verify fewer drafts than it holds: with ``lengths`` (B,), row b is verified as a
block of its own ``lengths[b]`` = L drafts, draw for draw as a call on its first L drafts alone (its first
L uniforms test them, the next one draws its last token, which is the bonus token from p at position L+1
when all L pass); the drafts after L are padding, never tested. Both rules take it, so a decoding loop
whose rows drafted different lengths verifies them in one call.

Numerics. Acceptance is tested as ``u * q(x) < p(x)``: no division, so q(x) = 0 cannot produce inf or NaN.
The final token is drawn by inverse-CDF sampling on the *unnormalised* weights w = max(p - q, 0): find the
first token whose running sum of w exceeds t = min(u * sum(w), the float just below sum(w)). No division
happens, and the chosen token always has w > 0: its running sum is above t while the one before it is
not. When the residual has no positive mass (p = q up to rounding) the weights fall back to p itself,
so no row ever samples from an all-zero or NaN vector (the failure behind vLLM advisory
GHSA-8wr5-jm2h-8r4f). The acceptance test runs in float64; the residual weights are formed in float32
(float64 for float64 inputs; half-precision inputs are upcast first) and summed in float64. The result
depends only on the input values and the uniforms, never on the batch it was computed in.

Host synchronisation. With ``check_values=False`` the sampler reads no tensor value back to the host:
every branch is a ``torch.where``, so on a GPU a call is queued without waiting. The checks that
``check_values=True`` runs (ids in range, NaN, negative entries, row sums, uniforms in [0, 1), drafted
tokens the draft could have sampled) each read a value back, once per call.
"""

from __future__ import annotations

import array
import itertools
import math
from dataclasses import dataclass
from typing import Optional

import torch

from speculative.exact.multi_draft import SCHEMES

__all__ = ["sum_tolerance", "categorical", "greedy_verify", "SamplerOutput", "Randomness", "draw_randomness",
           "rejection_sample",
           "reference_rejection_sample", "block_verify_sample", "RULES", "rule_sampler", "draw_candidates",
           "MultiDraftOutput", "multi_draft_sample"]

_FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
#: The slack every row sum gets: a float32 softmax, normalised, sums to 1 within far less than this.
FLOAT32_SUM_SLACK = 1e-4


def sum_tolerance(dtype: torch.dtype, vocab: int) -> float:
    """Return the largest |row sum - 1| accepted for ``vocab`` probabilities stored in ``dtype``.

    Derived from rounding, not picked: rounding a normalised float32 row to ``dtype`` moves each entry x
    by at most eps/2 * x, or by half the smallest subnormal when x is that small, so the sum moves by at
    most eps/2 + vocab * smallest_subnormal / 2; :data:`FLOAT32_SUM_SLACK` covers the float32 row itself.
    Float16 at V = 256: 6.0e-4; bfloat16: 4.0e-3 (a bfloat16 row summing to 1.04 is refused).
    """
    info = torch.finfo(dtype)
    return FLOAT32_SUM_SLACK + info.eps / 2 + vocab * info.smallest_normal * info.eps / 2


@dataclass
class SamplerOutput:
    """What the sampler returns for a batch."""

    tokens: torch.Tensor  # (B, k+1) int64: emitted tokens, then -1 padding after num_emitted
    num_accepted: torch.Tensor  # (B,) int64: accepted drafts n, 0..k
    num_emitted: torch.Tensor  # (B,) int64: n + 1, always >= 1

    def rows(self) -> list[list[int]]:
        """Return the emitted tokens of each row as Python lists, without padding."""
        return [row[:n].tolist() for row, n in zip(self.tokens, self.num_emitted.tolist())]


@dataclass
class Randomness:
    """The random numbers one call consumes, drawn up front so that two implementations can share them."""

    uniforms: torch.Tensor  # (B, k+1) float64 in [0, 1): k acceptance tests, then one for the final token


def draw_randomness(batch: int, k: int, generator: torch.Generator, device=None) -> Randomness:
    """Return the uniforms for one sampler call over ``batch`` rows of ``k`` drafts, drawn from ``generator``."""
    device = device if device is not None else generator.device
    return Randomness(torch.rand((batch, k + 1), generator=generator, dtype=torch.float64, device=device))


def _check_inputs(draft_tokens, draft_probs, target_probs):
    """Check types and shapes (no value is read back from the device); return (batch, k, vocab)."""
    for name, tensor in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float64, float32, float16 or bfloat16, got {tensor.dtype}")
        if tensor.ndim != 3:
            raise ValueError(f"{name} must have shape (batch, positions, vocab), got {tuple(tensor.shape)}")
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError("draft_tokens must be an int64 or int32 tensor of shape (batch, k)")
    if draft_tokens.ndim != 2:
        raise ValueError(f"draft_tokens must have shape (batch, k), got {tuple(draft_tokens.shape)}")
    batch, k = draft_tokens.shape
    if k < 1:
        raise ValueError(f"need k >= 1 drafted tokens, got draft_tokens of shape {(batch, k)}")
    if tuple(draft_probs.shape[:2]) != (batch, k):
        raise ValueError(f"draft_probs has shape {tuple(draft_probs.shape)}; expected ({batch}, {k}, V)")
    if tuple(target_probs.shape[:2]) != (batch, k + 1):
        raise ValueError(f"target_probs has shape {tuple(target_probs.shape)}; expected ({batch}, {k + 1}, V): "
                         "k drafted positions plus one for the bonus token")
    if draft_probs.shape[2] != target_probs.shape[2]:
        raise ValueError(f"vocabulary mismatch: draft_probs has V = {draft_probs.shape[2]}, "
                         f"target_probs has V = {target_probs.shape[2]}")
    if draft_probs.device != target_probs.device or draft_tokens.device != target_probs.device:
        raise ValueError("draft_tokens, draft_probs and target_probs must be on one device")
    return batch, k, target_probs.shape[2]


def _check_values(draft_tokens, draft_probs, target_probs, uniforms, allow_zero_draft_prob: bool) -> None:
    """Raise ValueError, naming the argument, on values no valid call can hold (each check syncs once)."""
    vocab = target_probs.shape[2]
    low, high = draft_tokens.aminmax()
    if low < 0 or high >= vocab:
        raise ValueError(f"draft_tokens has ids outside [0, {vocab})")
    for name, tensor in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        row_sums = tensor.sum(dim=-1, dtype=torch.float64)  # (B, positions); one pass over the tensor
        if not torch.isfinite(row_sums).all():  # any NaN or inf entry makes its row's sum NaN or inf
            raise ValueError(f"{name} contains NaN or inf")
        if tensor.amin() < 0:
            raise ValueError(f"{name} contains negative entries")
        worst, tolerance = (row_sums - 1).abs().max().item(), sum_tolerance(tensor.dtype, vocab)
        if worst > tolerance:
            raise ValueError(f"{name} rows must sum to 1: worst |sum - 1| = {worst:.3g} "
                             f"> {tolerance:.2g} for {tensor.dtype} at V = {vocab}")
    if not bool(((uniforms >= 0) & (uniforms < 1)).all()):  # NaN fails both comparisons
        raise ValueError(f"randomness.uniforms must lie in [0, 1) with no NaN; got min {uniforms.min().item():g}, "
                         f"max {uniforms.max().item():g}")
    if not allow_zero_draft_prob:
        q_drafted = draft_probs.gather(-1, draft_tokens.long().unsqueeze(-1)).squeeze(-1)  # (B, k)
        zero = (q_drafted == 0).nonzero()
        if len(zero):
            b, i = zero[0].tolist()
            raise ValueError(f"draft_tokens[{b}, {i}] = {int(draft_tokens[b, i])} has draft probability 0 in "
                             "draft_probs: the draft cannot have sampled it (is the verifier given the q it sampled "
                             "from?); pass allow_zero_draft_prob=True if that is intended")


def _prepare(draft_tokens, draft_probs, target_probs, generator, randomness, check_values, allow_zero_draft_prob):
    """Return the call's randomness after checking it (and, with ``check_values``, the inputs' values)."""
    batch, k = draft_tokens.shape
    if randomness is None:
        if generator is None:
            raise ValueError("pass a torch.Generator (the library never uses the global RNG) or randomness")
        randomness = draw_randomness(batch, k, generator, device=target_probs.device)
    if tuple(randomness.uniforms.shape) != (batch, k + 1):
        raise ValueError(f"randomness.uniforms must have shape ({batch}, {k + 1}), "
                         f"got {tuple(randomness.uniforms.shape)}")
    if batch and check_values:
        _check_values(draft_tokens, draft_probs, target_probs, randomness.uniforms, allow_zero_draft_prob)
    return randomness


def _empty(k: int, device) -> SamplerOutput:
    empty = torch.empty(0, dtype=torch.long, device=device)
    return SamplerOutput(tokens=empty.reshape(0, k + 1), num_accepted=empty, num_emitted=empty.clone())


def _emit(tokens: torch.Tensor, num_accepted: torch.Tensor, final: torch.Tensor) -> SamplerOutput:
    """Return the accepted prefix of ``tokens`` (B, k), then ``final``, padded with -1 to k + 1 columns."""
    batch, k = tokens.shape
    positions = torch.arange(k + 1, device=tokens.device).unsqueeze(0)  # (1, k+1)
    padded = torch.cat([tokens, torch.full((batch, 1), -1, dtype=torch.long, device=tokens.device)], dim=1)
    out = torch.where(positions < num_accepted.unsqueeze(1), padded, torch.full_like(padded, -1))
    out.scatter_(1, num_accepted.unsqueeze(1), final.unsqueeze(1))
    return SamplerOutput(tokens=out, num_accepted=num_accepted, num_emitted=num_accepted + 1)


def greedy_verify(draft_tokens: torch.Tensor, target_choice: torch.Tensor,
                  lengths: Optional[torch.Tensor] = None) -> SamplerOutput:
    """Return what :func:`rejection_sample` returns when both p and q are one-hot (greedy decoding), from
    the target's arg-max at each of the k + 1 positions ``target_choice`` (B, k+1), without building a
    distribution or drawing a uniform.

    With one-hot p and q a draft is accepted exactly when it is the target's arg-max (u q(x) < p(x) is
    u < 1 or u < 0), the residual max(p - q, 0) at the first mismatch is the one-hot of the target's
    arg-max, and so is the bonus token: the accepted prefix is the run of leading matches, and every
    emitted token is the target's arg-max at its position. ``lengths`` as in :func:`rejection_sample`.
    Reads nothing back to the host.
    """
    batch, k = draft_tokens.shape
    if tuple(target_choice.shape) != (batch, k + 1):
        raise ValueError(f"target_choice has shape {tuple(target_choice.shape)}; expected ({batch}, {k + 1})")
    match = draft_tokens.long() == target_choice[:, :k]  # (B, k)
    if lengths is not None:
        match &= torch.arange(k, device=match.device) < lengths.unsqueeze(1)
    num_accepted = match.long().cumprod(dim=-1).sum(dim=-1)  # (B,)
    final = target_choice.gather(1, num_accepted.unsqueeze(1)).squeeze(1)  # (B,)
    return _emit(draft_tokens.long(), num_accepted, final)


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    *,
    randomness: Optional[Randomness] = None,
    check_values: bool = True,
    allow_zero_draft_prob: bool = False,
    lengths: Optional[torch.Tensor] = None,
) -> SamplerOutput:
    """Return accepted counts and emitted tokens for a batch of drafted blocks (see the module docstring).

    ``lengths`` (B,), each in 1 .. k, verifies row b's first ``lengths[b]`` drafts only, as a block of that
    length (see the module docstring). Pass either ``generator`` or pre-drawn ``randomness``.
    ``check_values`` (the default) refuses, with a ``ValueError`` naming the argument: ids outside the
    vocabulary; NaN, inf or negative probabilities; rows whose sum is off by more than
    :func:`sum_tolerance` allows for their dtype; uniforms outside [0, 1) or NaN; lengths outside 1 .. k;
    and a drafted token whose q(x) is 0, which the draft cannot have sampled (the symptom of a verifier
    handed the wrong q) unless ``allow_zero_draft_prob=True``. ``check_values=False`` skips them all
    (shapes and dtypes are still checked) and reads nothing back from the device: for callers that made
    the inputs themselves. The sampler still never emits NaN or an out-of-range id,
    but garbage in then gives garbage out. An empty batch returns an empty result.
    """
    batch, k, vocab = _check_inputs(draft_tokens, draft_probs, target_probs)
    randomness = _prepare(draft_tokens, draft_probs, target_probs, generator, randomness, check_values,
                          allow_zero_draft_prob)
    if batch == 0:
        return _empty(k, target_probs.device)
    ends = _row_ends(lengths, batch, k, check_values, target_probs.device)  # (B,): each row's own length L
    tokens = draft_tokens.long()
    index = tokens.unsqueeze(-1)  # (B, k, 1)
    q_drafted = draft_probs.gather(-1, index).squeeze(-1).double()  # (B, k)
    p_drafted = target_probs[:, :k].gather(-1, index).squeeze(-1).double()  # (B, k)
    accepted = randomness.uniforms[:, :k] * q_drafted < p_drafted  # (B, k): u < p/q without dividing
    accepted &= torch.arange(k, device=tokens.device) < ends.unsqueeze(1)  # a row's padding is never accepted
    num_accepted = accepted.long().cumprod(dim=-1).sum(dim=-1)  # (B,): length of the accepted prefix

    # The final token comes from position n = num_accepted: the residual there, or at n = L the bonus
    # token. Treating q as 0 at position L makes max(p - 0, 0) = p, so one formula covers both.
    bonus = num_accepted == ends  # (B,)
    rows = torch.arange(batch, device=tokens.device)
    p_index = rows * (k + 1) + num_accepted
    p_final = target_probs.reshape(batch * (k + 1), vocab).index_select(0, p_index)  # (B, V)
    q_index = rows * k + num_accepted.clamp(max=k - 1)
    q_final = draft_probs.reshape(batch * k, vocab).index_select(0, q_index)  # (B, V)
    q_final = q_final * (~bonus).unsqueeze(1)  # rows with n = L: q = 0, so the weights are p
    # the uniform after a row's last draft, as a block of its own length would use it
    final = _inverse_cdf(p_final, q_final, randomness.uniforms.gather(1, ends.unsqueeze(1)).squeeze(1))
    return _emit(tokens, num_accepted, final)  # n <= L: a row's padding is never emitted


def _inverse_cdf(p_final: torch.Tensor, q_final: torch.Tensor, uniform: torch.Tensor,
                 scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Return one token per row of weights max(p - q, 0) (falling back to p), by inverse-CDF sampling.

    The weights are computed in float32 (float64 for float64 inputs) and summed in float64. Every branch
    is a ``torch.where``, so nothing is read back to the host. At B x V this is bound by memory traffic.
    """
    compute = torch.float64 if p_final.dtype == torch.float64 else torch.float32
    p_weights = p_final.to(compute).nan_to_num(nan=0.0).clamp_(min=0.0)  # (B, V)
    if scale is not None:  # block verification: weights max(scale * p - q, 0), scale in [0, 1] per row
        p_weights = p_weights * scale.to(compute).unsqueeze(1)
    weights = (p_weights - q_final.to(compute).nan_to_num(nan=0.0)).clamp_(min=0.0)  # unnormalised residual
    empty = ~(weights.sum(dim=-1, dtype=torch.float64) > 0)  # p = q up to rounding: sample from p instead
    weights = torch.where(empty.unsqueeze(1), p_weights, weights)
    return categorical(weights, uniform)


def categorical(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Return one token per row of non-negative ``weights`` (B, V), by inverse-CDF sampling with ``uniform`` (B,).

    The token is the first whose running sum (float64) exceeds t = min(u * total, the float just below
    the total), so it always has a positive weight; no division, and nothing is read back to the host.
    A row with no positive weight (possible only for unchecked garbage) gets the last id, never one past it.
    """
    cumulative = torch.cumsum(weights, dim=-1, dtype=torch.float64)  # (B, V)
    total = cumulative[:, -1:]
    # u * total can round up to total when u is just below 1; the float just below total still selects
    # a token with w > 0 (the first whose running sum reaches the total)
    threshold = torch.minimum(uniform.unsqueeze(1).double() * total, torch.nextafter(total, torch.zeros_like(total)))
    token = torch.searchsorted(cumulative, threshold, right=True).squeeze(1)  # first running sum > threshold
    return token.clamp_(max=cumulative.shape[-1] - 1)


def reference_rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    randomness: Randomness,
    lengths: Optional[torch.Tensor] = None,
) -> SamplerOutput:
    """Return the same result as :func:`rejection_sample`, computed row by row in plain Python.

    The textbook loop, written for clarity rather than speed: for each row, walk its drafted tokens (the
    first ``lengths[b]`` of them, with ``lengths``) in order, accept while u * q(x) < p(x), then draw the
    final token from the residual (or the bonus token from p) by the same inverse-CDF rule. It consumes
    the same ``randomness``, so for valid inputs its output equals the vectorised sampler's token for token.
    Used as the test oracle and as the benchmark's per-row baseline.
    """
    batch, k = draft_tokens.shape
    vocab = target_probs.shape[-1]
    tokens = torch.full((batch, k + 1), -1, dtype=torch.long)
    num_accepted = torch.zeros(batch, dtype=torch.long)
    uniforms = randomness.uniforms.tolist()
    ends = [k] * batch if lengths is None else lengths.tolist()
    for b, end in enumerate(ends):
        n = 0
        for i, x in enumerate(draft_tokens[b, :end].tolist()):
            if uniforms[b][i] * float(draft_probs[b, i, x]) < float(target_probs[b, i, x]):
                tokens[b, i] = x
                n += 1
            else:
                break
        p_row = target_probs[b, n].double().tolist()
        q_row = draft_probs[b, n].double().tolist() if n < end else [0.0] * vocab
        weights = [p - q if p > q else 0.0 for p, q in zip(p_row, q_row)]
        if target_probs.dtype != torch.float64:
            weights = array.array("f", weights).tolist()  # the batched sampler forms weights in float32
        if not sum(weights) > 0:
            weights = [max(p, 0.0) for p in p_row]
        running = list(itertools.accumulate(weights))
        threshold = min(uniforms[b][end] * running[-1], math.nextafter(running[-1], 0.0))
        tokens[b, n] = next(t for t, c in enumerate(running) if c > threshold)
        num_accepted[b] = n
    return SamplerOutput(tokens=tokens, num_accepted=num_accepted, num_emitted=num_accepted + 1)


# --------------------------------------------------------------------------- beyond token-wise verification


def block_verify_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    *,
    randomness: Optional[Randomness] = None,
    check_values: bool = True,
    allow_zero_draft_prob: bool = False,
    lengths: Optional[torch.Tensor] = None,
) -> SamplerOutput:
    """Verify the drafted blocks jointly (block verification, Sun et al., ICLR 2025): a drop-in for
    :func:`rejection_sample`, with its arguments, checks, randomness and output.

    ``lengths`` (B,), each in 1 .. k, verifies row b's first ``lengths[b]`` drafts only, as a block of
    that length (its last position is kept with probability p_L, the bonus token comes from p at L, and
    later drafts are padding, never accepted), draw for draw as a call on the row's first L drafts alone
    would, as in :func:`rejection_sample`.

    With p_0 = 1 and p_i = min(1, p_{i-1} * p(x_i) / q(x_i)), position i < k is kept when
    u_i * (m_i + 1 - p_i) < m_i, where m_i = sum_y max(p_i * p(y) - q(y), 0) at position i (always when
    p_i = 1), and position k when u_k < p_k. The row accepts tau drafts, tau the largest kept position
    (0 if none), and adds a token drawn from max(p_tau * p - q, 0) at position tau (p_0 = 1: the
    token-wise residual), or the bonus token from p when tau = k. The exact law is
    :func:`exact.block_verification_law`. As in :func:`rejection_sample`, nothing is read back to the
    host without ``check_values``, the final draw needs no division, and a row whose weights have no
    positive mass (p = q up to rounding) draws from p instead. Acceptance tests run in float64; the
    residual weights in float32 (float64 for float64 inputs).
    """
    batch, k, vocab = _check_inputs(draft_tokens, draft_probs, target_probs)
    randomness = _prepare(draft_tokens, draft_probs, target_probs, generator, randomness, check_values,
                          allow_zero_draft_prob)
    if batch == 0:
        return _empty(k, target_probs.device)
    tokens = draft_tokens.long()
    index = tokens.unsqueeze(-1)
    q_drafted = draft_probs.gather(-1, index).squeeze(-1).double()  # (B, k)
    p_drafted = target_probs[:, :k].gather(-1, index).squeeze(-1).double()
    # p(x)/q(x); q(x) = 0 only for unchecked inputs: any p(x) > 0 then counts as a ratio above 1
    ratio = torch.where(q_drafted > 0, p_drafted / torch.where(q_drafted > 0, q_drafted, 1.0),
                        (p_drafted > 0).double() * 2)
    running, current = [], torch.ones(batch, dtype=torch.float64, device=tokens.device)
    for i in range(k):  # k is small (the draft length): a loop of k elementwise steps
        current = torch.clamp(current * ratio[:, i], max=1.0)
        running.append(current)
    running = torch.stack(running, 1)  # (B, k): p_1 .. p_k
    uniforms = randomness.uniforms
    last = uniforms[:, :k] < running  # (B, k): the rule of a block's last position, kept with probability p_i
    kept = [last[:, k - 1]]  # position k
    if k > 1:
        compute = torch.float64 if target_probs.dtype == torch.float64 else torch.float32
        scaled = running[:, :k - 1].to(compute).unsqueeze(-1) * target_probs[:, 1:k].to(compute)
        mass = (scaled - draft_probs[:, 1:k].to(compute)).clamp_(min=0).sum(-1, dtype=torch.float64)  # (B, k-1)
        inner = (running[:, :k - 1] >= 1) | (uniforms[:, :k - 1] * (mass + 1 - running[:, :k - 1]) < mass)
        kept = list(inner.unbind(1)) + kept
    kept = torch.stack(kept, 1)  # (B, k): position i + 1 kept?
    positions = torch.arange(1, k + 1, device=tokens.device)
    ends = _row_ends(lengths, batch, k, check_values, tokens.device)  # (B,): each row's own length L
    kept = torch.where(positions < ends.unsqueeze(1), kept,
                       torch.where(positions == ends.unsqueeze(1), last, False))  # nothing past a row's end
    num_accepted = torch.where(kept, positions, 0).amax(dim=1)  # tau: the largest kept position, or 0
    rows = torch.arange(batch, device=tokens.device)
    bonus = num_accepted == ends  # every draft of the row kept: the extra token comes from p
    p_final = target_probs.reshape(batch * (k + 1), vocab).index_select(0, rows * (k + 1) + num_accepted)
    q_final = draft_probs.reshape(batch * k, vocab).index_select(0, rows * k + num_accepted.clamp(max=k - 1))
    q_final = q_final * (~bonus).unsqueeze(1)  # the bonus token: q = 0 and the weights are p
    scale = torch.cat([torch.ones(batch, 1, dtype=torch.float64, device=tokens.device), running], 1)
    scale = scale.gather(1, num_accepted.unsqueeze(1)).squeeze(1)  # p_tau, with p_0 = 1
    # the uniform after a row's last position, as a block of its own length would use it
    final = _inverse_cdf(p_final, q_final, uniforms.gather(1, ends.unsqueeze(1)).squeeze(1),
                         scale=torch.where(bonus, 1.0, scale))
    return _emit(tokens, num_accepted, final)  # tau <= a row's end: its padding is never emitted


def _row_ends(lengths: Optional[torch.Tensor], batch: int, k: int, check_values: bool, device) -> torch.Tensor:
    """Return (B,) int64 each row's own block length: ``lengths`` checked (the values only with
    ``check_values``: one host read), or k for every row."""
    if lengths is None:
        return torch.full((batch,), k, dtype=torch.long, device=device)
    if not isinstance(lengths, torch.Tensor) or lengths.shape != (batch,) or lengths.dtype not in (torch.int64,
                                                                                                   torch.int32):
        raise ValueError(f"lengths must be an integer tensor of shape ({batch},)")
    if check_values and bool(((lengths < 1) | (lengths > k)).any()):
        raise ValueError(f"lengths must lie in [1, {k}], the drafts of each row")
    return lengths.to(device).long()


#: The verification rules a decoding loop can use, by name (each with :func:`rejection_sample`'s signature).
RULES = {"token": rejection_sample, "block": block_verify_sample}


def rule_sampler(rule: str):
    """Return the sampler of verification rule ``rule`` ("token" or "block")."""
    if rule not in RULES:
        raise ValueError(f"unknown verification rule {rule!r}; known: {', '.join(RULES)}")
    return RULES[rule]


@dataclass
class MultiDraftOutput:
    """What :func:`multi_draft_sample` returns for a batch of positions with several candidates each."""

    token: torch.Tensor  # (B,) int64: the emitted token
    chosen: torch.Tensor  # (B,) int64: the index of the accepted candidate, or -1 when all were rejected


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:  # multi_draft.SCHEMES: one list of schemes, each with its exact law
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(SCHEMES)}")


def draw_candidates(draft_probs: torch.Tensor, drafts: int, scheme: str, generator: torch.Generator) -> torch.Tensor:
    """Return (B, drafts) candidate tokens from ``draft_probs`` (B, V) as ``scheme`` draws them.

    With replacement: i.i.d. from q. Without replacement: each from q renormalised over the tokens not
    yet drawn; a slot with nothing left to draw is -1. Top-k: the ``drafts`` most likely tokens of q,
    ties to the lower id (a slot beyond q's support is -1). Inverse-CDF draws, so no host read.
    """
    _check_scheme(scheme)
    batch, vocab = draft_probs.shape
    weights = draft_probs.double().clamp(min=0)
    if scheme.startswith("top_k"):
        order = torch.sort(weights, dim=1, descending=True, stable=True)
        top = order.indices[:, :drafts]
        return torch.where(order.values[:, :drafts] > 0, top, -1)
    out = []
    for _ in range(drafts):
        uniform = torch.rand(batch, generator=generator, dtype=torch.float64, device=draft_probs.device)
        left = weights.sum(1) > 0
        token = categorical(weights, uniform)
        out.append(torch.where(left, token, -1))
        if scheme != "with_replacement":
            weights = weights.scatter(1, token.unsqueeze(1), 0.0)
    return torch.stack(out, 1)


def multi_draft_sample(candidates: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                       generator: torch.Generator, *, scheme: str = "with_replacement", threshold: float = 1.0,
                       uniforms: Optional[torch.Tensor] = None) -> MultiDraftOutput:
    """Verify ``candidates`` (B, k) at one position against the target and return the emitted token.

    ``draft_probs`` and ``target_probs`` are q and p at that position, (B, V). The schemes are those of
    :func:`multi_draft.multi_draft_step` (exact laws there): recursive rejection sampling with i.i.d.
    candidates (``with_replacement``) or candidates drawn without replacement and judged against q
    renormalised over the untried tokens (``without_replacement``); the fixed top-k list verified with one
    uniform against the running sum of p (``top_k``); and two wrong variants kept for the gallery.
    Candidates of -1 (nothing left to draw) are skipped. ``uniforms`` (B, k + 1) may be given instead of
    drawing them. Float64 throughout; nothing is read back to the host.
    """
    _check_scheme(scheme)
    if candidates.ndim != 2 or draft_probs.ndim != 2 or target_probs.shape != draft_probs.shape:
        raise ValueError(f"need candidates (B, k), draft_probs and target_probs (B, V); got "
                         f"{tuple(candidates.shape)}, {tuple(draft_probs.shape)}, {tuple(target_probs.shape)}")
    batch, k = candidates.shape
    device = target_probs.device
    if uniforms is None:
        uniforms = torch.rand((batch, k + 1), generator=generator, dtype=torch.float64, device=device)
    p = target_probs.double().clamp(min=0)
    q = draft_probs.double().clamp(min=0)
    rows = torch.arange(batch, device=device)
    chosen = torch.full((batch,), -1, dtype=torch.long, device=device)
    if scheme.startswith("top_k"):
        limit = threshold if scheme == "top_k_threshold" else 1.0
        running = torch.zeros(batch, dtype=torch.float64, device=device)
        rest = p.clone()
        for j in range(k):
            token = candidates[:, j]
            valid = token >= 0
            p_token = torch.where(valid, p[rows, token.clamp(min=0)], 0.0)
            running = running + p_token
            hit = valid & (chosen < 0) & (uniforms[:, 0] * limit < running)
            chosen = torch.where(hit, j, chosen)
            rest = rest.scatter(1, token.clamp(min=0).unsqueeze(1),
                                torch.where(valid, 0.0, rest[rows, token.clamp(min=0)]).unsqueeze(1))
        empty = ~(rest.sum(1) > 0)
        final = categorical(torch.where(empty.unsqueeze(1), p, rest), uniforms[:, k])
    else:
        r = p.clone()
        proposal = q.clone()
        for j in range(k):
            token = candidates[:, j]
            valid = (token >= 0) & (chosen < 0)
            safe = token.clamp(min=0)
            judge = q if scheme == "without_replacement_unadjusted" else proposal
            judge = judge / judge.sum(1, keepdim=True).clamp(min=1e-300)
            hit = valid & (uniforms[:, j] * judge[rows, safe] < r[rows, safe])
            chosen = torch.where(hit, j, chosen)
            residual = (r - judge).clamp(min=0)
            mass = residual.sum(1, keepdim=True)
            update = (valid & ~hit).unsqueeze(1) & (mass > 0)
            r = torch.where(update, residual / mass.clamp(min=1e-300), r)
            if scheme != "with_replacement":
                proposal = torch.where(valid.unsqueeze(1), proposal.scatter(1, safe.unsqueeze(1), 0.0), proposal)
        final = categorical(r, uniforms[:, k])
    picked = candidates.gather(1, chosen.clamp(min=0).unsqueeze(1)).squeeze(1)
    return MultiDraftOutput(token=torch.where(chosen >= 0, picked, final), chosen=chosen)
