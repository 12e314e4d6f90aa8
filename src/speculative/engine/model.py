"""A tiny byte-level GPT with a static KV cache written by position.

Explained in: notebooks/08_decoding_demo (the model pair) and notebooks/07_cost_model (what a forward costs).

The cache holds keys and values for every position up to ``context``; a forward pass over tokens that
start at position ``start[b]`` in row b writes its keys and values at ``start[b] .. start[b] + T - 1`` and
attends to every cached position up to its own. Rows may stand at different positions. Undoing tokens
after a rejection needs no copy: the caller moves its position back, and the stale slots are simply
overwritten by the next write (the attention mask never looks past a row's own position).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from speculative import defaults

__all__ = ["GPTConfig", "GPT", "KVCache"]


@dataclass(frozen=True)
class GPTConfig:
    """A model's shape; the defaults are the shipped target's (``defaults.TARGET_SHAPE``)."""

    vocab_size: int = defaults.VOCAB_SIZE  # bytes
    context: int = defaults.CONTEXT  # positions the model and its cache can hold
    n_layer: int = defaults.TARGET_SHAPE["n_layer"]  # transformer blocks
    n_head: int = defaults.TARGET_SHAPE["n_head"]  # attention heads per block
    d_model: int = defaults.TARGET_SHAPE["d_model"]  # width of the residual stream; divisible by n_head
    dropout: float = 0.0  # training only

    def __post_init__(self):
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        for name in ("vocab_size", "context", "n_layer", "n_head", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)


class KVCache:
    """Keys and values for every layer and position: tensors (n_layer, B, length, n_head, head_dim).

    ``length`` defaults to the model's context; a shorter cache saves memory when many rows decode a few
    tokens (the distribution tests run thousands of rows).
    """

    def __init__(self, config: GPTConfig, batch: int, device=None, dtype=torch.float32, length: int | None = None):
        length = config.context if length is None else length
        if not 1 <= length <= config.context:
            raise ValueError(f"cache length must be in [1, {config.context}], got {length}")
        shape = (config.n_layer, batch, length, config.n_head, config.d_model // config.n_head)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.batch = batch
        self.context = length

    def broadcast(self, batch: int) -> "KVCache":
        """Return a new cache of ``batch`` rows, each a copy of this one-row cache's row."""
        if self.batch != 1:
            raise ValueError(f"broadcast needs a cache of one row, this one has {self.batch}")
        out = object.__new__(KVCache)
        shape = (self.keys.shape[0], batch, *self.keys.shape[2:])
        out.keys, out.values = self.keys.expand(shape).contiguous(), self.values.expand(shape).contiguous()
        out.batch, out.context = batch, self.context
        return out

    def select(self, rows: torch.Tensor) -> "KVCache":
        """Return a new cache whose row i is a copy of this cache's row ``rows[i]``."""
        out = object.__new__(KVCache)
        out.keys, out.values = self.keys[:, rows], self.values[:, rows]  # indexing with a tensor copies
        out.batch, out.context = len(rows), self.context
        return out


class _Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(),
                                 nn.Linear(4 * config.d_model, config.d_model))
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, layer: int, cache: KVCache | None, positions, mask, causal: bool, shared_start: int | None,
                span: int):
        batch, steps, width = x.shape  # (B, T, C)
        head_dim = width // self.n_head
        q, k, v = self.qkv(self.ln_1(x)).split(width, dim=-1)
        q = q.view(batch, steps, self.n_head, head_dim)  # (B, T, H, D)
        k = k.view(batch, steps, self.n_head, head_dim)
        v = v.view(batch, steps, self.n_head, head_dim)
        if cache is not None:
            if shared_start is not None:  # every row starts at the same position: a plain slice write
                cache.keys[layer][:, shared_start:shared_start + steps] = k.to(cache.keys.dtype)
                cache.values[layer][:, shared_start:shared_start + steps] = v.to(cache.values.dtype)
            else:
                rows = torch.arange(batch, device=x.device).unsqueeze(1)  # (B, 1)
                cache.keys[layer][rows, positions] = k.to(cache.keys.dtype)  # write at each row's positions
                cache.values[layer][rows, positions] = v.to(cache.values.dtype)
            k, v = cache.keys[layer][:, :span].to(q.dtype), cache.values[layer][:, :span].to(q.dtype)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask, is_causal=causal)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(batch, steps, width)
        x = x + self.dropout(self.proj(y))
        return x + self.dropout(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    """A byte-level decoder-only transformer (pre-norm, learned positions, tied embeddings)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.context, config.d_model)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # tied: fewer parameters for a tiny model
        self.apply(self._init)
        for name, parameter in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):  # GPT-2's scaled init
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def device(self) -> torch.device:
        """The device the weights are on: the one source of truth for where this model runs."""
        return self.token_embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.token_embedding.weight.dtype

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch: int, device=None, dtype=None, length: int | None = None) -> KVCache:
        """Return an empty cache for ``batch`` rows (``length`` positions), on the model's device and dtype."""
        reference = self.token_embedding.weight
        return KVCache(self.config, batch, device or reference.device, dtype or reference.dtype, length)

    def forward(self, tokens: torch.Tensor, start: torch.Tensor | int | None = None, cache: KVCache | None = None,
                *, span: int | None = None, check: bool = True):
        """Return logits (B, T, V) for ``tokens`` (B, T) placed at positions start[b] .. start[b] + T - 1.

        Without a cache, ``start`` must be None and the positions are 0 .. T - 1 (training). With a cache,
        ``start`` is an int (every row at the same position: a plain slice write) or a (B,) tensor (one
        position per row); the keys and values are written at those positions and each query attends to
        every cached position up to its own, so the cache must already hold positions 0 .. start[b] - 1.
        ``span`` bounds the cached positions attended to (0 .. span - 1); it must exceed every position
        written. ``check=False`` skips the checks that read tensor values (ids in range, positions inside
        the cache): each of those is a host-device synchronisation, so a decoding loop that made its own
        inputs turns them off; without ``span`` it then attends over the whole cache, masked. One token at
        an int position whose ``span`` ends right after it (plain decoding's step) attends to every key
        given, so no mask is built for it.
        """
        batch, steps = tokens.shape
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be integer ids in [0, {self.config.vocab_size})")
        if check:
            low, high = tokens.aminmax()
            if low < 0 or high >= self.config.vocab_size:
                raise ValueError(f"tokens must be integer ids in [0, {self.config.vocab_size})")
        device = tokens.device
        offsets = torch.arange(steps, device=device)
        if cache is None:
            if start is not None:
                raise ValueError("start positions need a cache")
            if steps > self.config.context:
                raise ValueError(f"{steps} tokens exceed the context of {self.config.context}")
            positions, mask, shared_start, span = offsets.expand(batch, steps), None, None, steps
            causal = True  # attention over the tokens alone, each to itself and those before it
        else:
            if cache.batch != batch:
                raise ValueError(f"the cache holds {cache.batch} rows but tokens have {batch}")
            if isinstance(start, int) and not isinstance(start, bool):
                first, last, shared_start = start, start + steps - 1, start
                positions = (start + offsets).expand(batch, steps)
            else:
                if not isinstance(start, torch.Tensor) or start.shape != (batch,):
                    raise ValueError(f"with a cache, start must be an int or have shape ({batch},)")
                positions = start.to(device).long().unsqueeze(1) + offsets  # (B, T)
                shared_start = None
                if check:
                    low, high = start.aminmax()
                    first, last = int(low), int(high) + steps - 1
                else:
                    first, last = 0, -1
            if check and (first < 0 or last >= cache.context):
                raise ValueError(f"positions {first}..{last} fall outside the cache's {cache.context} positions")
            if span is None:
                span = last + 1 if last >= 0 else cache.context
            if not 1 <= span <= cache.context:
                raise ValueError(f"span must be in [1, {cache.context}], got {span}")
            if check and span <= last:
                raise ValueError(f"span {span} does not cover position {last}, which this call writes")
            causal = False
            if steps == 1 and shared_start is not None and span == shared_start + 1:
                mask = None  # one query at the last position attended to: it sees every key, no mask needed
            else:
                keys = torch.arange(span, device=device)
                mask = (keys.view(1, 1, span) <= positions.unsqueeze(-1)).unsqueeze(1)  # (B, 1, T, span)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for layer, block in enumerate(self.blocks):
            x = block(x, layer, cache, positions, mask, causal, shared_start, span)
        return self.head(self.ln_f(x))
