"""The shipped models as Hugging Face transformers models.

Explained in: no chapter yet (issue 13 will race it against transformers' assisted generation in
notebooks/08_decoding_demo).

The book's GPT is GPT-2 in all but name: pre-norm LayerNorm (eps 1e-5), exact-erf GELU MLP of width 4d,
learned positions, tied embeddings, biased linears, no head bias. :func:`export` copies its weights into a
``transformers.GPT2LMHeadModel`` whose logits equal the library model's (within float rounding; a test
holds them to 1e-4 in float32). GPT-2 stores its linear layers as ``Conv1D`` with the weight transposed
(in, out), which is the one transformation needed.

Status (issue 13): only the export exists so far. Wrapping any transformers causal LM for the engine
(``wrap``), the race against assisted generation and the GPU path are not built yet.
"""

from __future__ import annotations

import torch

from .model import GPT

__all__ = ["export", "gpt2_config"]


def gpt2_config(model: GPT):
    """Return the ``transformers.GPT2Config`` with ``model``'s shape (no dropout, no special tokens)."""
    from transformers import GPT2Config

    c = model.config
    return GPT2Config(vocab_size=c.vocab_size, n_positions=c.context, n_embd=c.d_model, n_layer=c.n_layer,
                      n_head=c.n_head, n_inner=4 * c.d_model, activation_function="gelu",
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)


@torch.no_grad()
def export(model: GPT):
    """Return a ``transformers.GPT2LMHeadModel`` (eval mode, ``model``'s device and dtype) with ``model``'s
    weights, so that both give the same logits for the same tokens.

    Raises ``TypeError`` for anything but the library's :class:`model.GPT`.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"export takes the library's GPT (speculative.model.GPT), got {type(model).__name__}")
    from transformers import GPT2LMHeadModel

    reference = model.token_embedding.weight
    out = GPT2LMHeadModel(gpt2_config(model)).to(device=reference.device, dtype=reference.dtype).eval()
    body = out.transformer
    body.wte.weight.copy_(model.token_embedding.weight)
    body.wpe.weight.copy_(model.position_embedding.weight)
    for block, layer in zip(model.blocks, body.h):
        pairs = [(layer.ln_1, block.ln_1), (layer.ln_2, block.ln_2)]
        for theirs, ours in pairs:
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)
        # Conv1D keeps its weight as (in, out): the transpose of nn.Linear's (out, in)
        for theirs, ours in [(layer.attn.c_attn, block.qkv), (layer.attn.c_proj, block.proj),
                             (layer.mlp.c_fc, block.mlp[0]), (layer.mlp.c_proj, block.mlp[2])]:
            theirs.weight.copy_(ours.weight.T)
            theirs.bias.copy_(ours.bias)
    body.ln_f.weight.copy_(model.ln_f.weight)
    body.ln_f.bias.copy_(model.ln_f.bias)
    out.tie_weights()  # the head shares wte, as the library's head shares its token embedding
    return out
