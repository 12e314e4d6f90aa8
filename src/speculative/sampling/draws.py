"""Tokens drawn from uniforms the caller supplies, by inverse CDF.

An engine that keys its randomness by seed and position (:mod:`audit.seeds`) and the one-step samplers of
the pitfall gallery (:mod:`audit.pitfalls`) both turn a uniform number into a token themselves;
:func:`inverse_cdf` is that step, written once.
"""

from __future__ import annotations

import torch

__all__ = ["inverse_cdf"]


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor, *, normalise: bool = True,
                clamp: bool = True) -> torch.Tensor:
    """Return, for each uniform u, the first token whose running sum of ``weights`` (float64) exceeds u times
    their total; with ``normalise=False``, exceeds u itself (weights that do not sum to 1 are taken as they
    are).

    ``weights`` is one distribution (V,), and then every uniform (any shape) draws from it, or one row per
    uniform, (B, V) with ``uniforms`` (B,). With non-negative weights a positive total and u < 1, the token
    has a positive weight. Where the running sum never exceeds the threshold (a total short of u without
    ``normalise``, weights that are all 0 or NaN) the result is V, one past the last id, unless ``clamp``
    keeps it at V - 1.
    """
    cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)
    rows = weights.dim() > 1
    threshold = uniforms.double().unsqueeze(-1) if rows else uniforms.double()
    if normalise:
        threshold = threshold * cdf[..., -1:]
    token = torch.searchsorted(cdf, threshold, right=True)
    token = token.squeeze(-1) if rows else token
    return token.clamp(max=weights.shape[-1] - 1) if clamp else token
