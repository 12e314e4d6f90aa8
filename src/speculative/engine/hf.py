"""Hugging Face transformers: the shipped models exported, any causal LM in the engine, transformers' generation.

Explained in: notebooks/08_decoding_demo (the race with transformers' assisted generation, and the GPU
section for public pairs).

The book's GPT is GPT-2 in all but name: pre-norm LayerNorm (eps 1e-5), exact-erf GELU MLP of width 4d,
learned positions, tied embeddings, biased linears, no head bias. :func:`export` copies its weights into a
``transformers.GPT2LMHeadModel`` whose logits equal the library model's (within float rounding; a test
holds them to 1e-4 in float32). GPT-2 stores its linear layers as ``Conv1D`` with the weight transposed
(in, out), which is the one transformation needed.

:func:`wrap` puts any transformers causal LM (GPT-2, Llama, Qwen2, ...) behind the interface the engine
calls, with transformers' own KV cache rolled back by cropping; :func:`pair` aligns a target and a draft
(same tokenizer, padded vocabularies cut to it). :func:`assisted_generate` and :func:`plain_generate`
run transformers' own generation, instrumented, for the race in :func:`speculative.measure.bench_peer.bench_peer`.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from speculative.engine.model import GPT

with warnings.catch_warnings():  # transformers imports tqdm.auto, which warns in a notebook without ipywidgets
    warnings.filterwarnings("ignore", message="IProgress not found")
    try:
        import transformers  # noqa: F401  (imported here, quietly, so that later imports find it loaded)
    except ImportError:  # the library runs without transformers; only this module's functions need it
        pass

__all__ = ["export", "gpt2_config", "wrap", "pair", "load_pair", "same_tokenizer", "HFModel", "HFPair", "HFCache",
           "HF_SCHEDULES", "plain_generate", "assisted_generate", "AssistedRun", "PUBLIC_PAIR", "public_pair_names"]


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
        raise TypeError(f"export takes the library's GPT (speculative.engine.model.GPT), got {type(model).__name__}")
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


# ---------------------------------------------------------------------------------------------------------
# Any transformers causal LM in the engine


@dataclass(frozen=True)
class HFShape:
    """What the engine reads from a model's config: the vocabulary it decodes over and the context."""

    vocab_size: int
    context: int
    name: str = ""


class HFCache:
    """One transformers ``DynamicCache`` per row, so that every row keeps its own length.

    The engine writes a call's keys and values at positions ``start[b] ..`` and attends up to them; a
    transformers cache instead appends. Rolling back is cropping: before each call, row b's cache is cut
    to ``start[b]`` positions (dropping the stale tail of rejected drafts), and the model appends from
    there, so its default positions are the engine's. Rows that start a call at the same position run as
    one batch: their caches are stacked for the call and split again after it (:func:`_stack`), where the
    installed transformers keeps a cache as plain per-layer key and value tensors (4.56 and later); other
    rows, and other versions, run one after another.
    """

    def __init__(self, rows: list, context: int):
        self.rows = rows
        self.batch = len(rows)
        self.context = context

    def broadcast(self, batch: int) -> "HFCache":
        if self.batch != 1:
            raise ValueError(f"broadcast needs a cache of one row, this one has {self.batch}")
        return HFCache([copy.deepcopy(self.rows[0]) for _ in range(batch)], self.context)

    def select(self, rows: torch.Tensor) -> "HFCache":
        return HFCache([copy.deepcopy(self.rows[int(i)]) for i in rows.tolist()], self.context)


class HFModel:
    """A transformers causal LM behind the interface the engine calls (see :func:`wrap`)."""

    def __init__(self, model, vocab_size: Optional[int] = None, tokenizer=None, name: str = ""):
        config = model.config
        produced = model.get_output_embeddings().weight.shape[0]  # logits per position, padding included
        vocab_size = produced if vocab_size is None else vocab_size
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= produced:
            raise ValueError(f"vocab_size must be an integer in [1, {produced}] (the model's logits), "
                             f"got {vocab_size!r}")
        context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        if not context:
            raise ValueError(f"{type(model).__name__}'s config names no context length "
                             "(max_position_embeddings or n_positions)")
        self.model = model.eval()
        self.tokenizer = tokenizer
        # transformers 5 names the cache argument ``cache``; 4.x named it ``past_key_values``
        self._cache_argument = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.config = HFShape(vocab_size=vocab_size, context=int(context),
                              name=name or getattr(config, "_name_or_path", "") or type(model).__name__)

    def __repr__(self) -> str:
        return f"HFModel({self.config.name!r}, vocab_size={self.config.vocab_size}, context={self.config.context})"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def new_cache(self, batch: int, device=None, dtype=None, length: Optional[int] = None) -> HFCache:
        from transformers import DynamicCache

        length = self.config.context if length is None else length
        if not 1 <= length <= self.config.context:
            raise ValueError(f"cache length must be in [1, {self.config.context}], got {length}")
        try:
            rows = [DynamicCache(config=self.model.config) for _ in range(batch)]
        except TypeError:  # older transformers: a DynamicCache takes no config
            rows = [DynamicCache() for _ in range(batch)]
        return HFCache(rows, length)

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, start=None, cache: Optional[HFCache] = None, *,
                 span: Optional[int] = None, check: bool = True) -> torch.Tensor:
        """Return logits (B, T, vocab_size) for ``tokens`` placed at positions start[b] .. start[b] + T - 1,
        as :meth:`model.GPT.forward` does; ``span`` is not needed (a cropped cache holds no stale tail)."""
        batch, steps = tokens.shape
        vocab = self.config.vocab_size
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be integer ids in [0, {vocab})")
        if check:
            low, high = tokens.aminmax()
            if low < 0 or high >= vocab:
                raise ValueError(f"tokens must be integer ids in [0, {vocab})")
        if cache is None:
            if start is not None:
                raise ValueError("start positions need a cache")
            return self.model(tokens).logits[..., :vocab]
        if cache.batch != batch:
            raise ValueError(f"the cache holds {cache.batch} rows but tokens have {batch}")
        if isinstance(start, int) and not isinstance(start, bool):
            starts = [start] * batch
        elif isinstance(start, torch.Tensor) and start.shape == (batch,):
            starts = start.tolist()  # a host read per call: transformers' caches keep lengths on the host
        else:
            raise ValueError(f"with a cache, start must be an int or have shape ({batch},)")
        groups = {}  # start position -> the rows that start there
        for row, (begin, past) in enumerate(zip(starts, cache.rows)):
            held = past.get_seq_length()
            if not 0 <= begin <= held or begin + steps > cache.context:
                raise ValueError(f"row {row}: positions {begin}..{begin + steps - 1} do not follow its cache of "
                                 f"{held} positions (room for {cache.context})")
            if begin < held:
                past.crop(begin - held)  # drop the stale tail: rejected drafts, padding
            groups.setdefault(begin, []).append(row)
        out = [None] * batch
        for rows in groups.values():
            pasts = [cache.rows[row] for row in rows]
            merged = _stack(pasts, self.model.config) if len(rows) > 1 else None
            if merged is None:  # one row, or a cache that cannot be stacked: row by row
                for row, past in zip(rows, pasts):
                    step = self.model(tokens[row:row + 1], use_cache=True, **{self._cache_argument: past})
                    out[row] = step.logits[0, :, :vocab]
                continue
            step = self.model(tokens[rows], use_cache=True, **{self._cache_argument: merged})
            for i, (row, split) in enumerate(zip(rows, _split(merged, len(rows), self.model.config))):
                cache.rows[row] = split
                out[row] = step.logits[i, :, :vocab]
        return torch.stack(out, 0)


def _plain_layers(past) -> Optional[list]:
    """The per-layer (keys, values) of a transformers cache, or None where it is not plain full attention
    stored as tensors (an older transformers, a sliding window, an offloaded or quantised cache)."""
    from transformers import cache_utils

    layers = getattr(past, "layers", None)
    plain = getattr(cache_utils, "DynamicLayer", None)
    if type(past) is not cache_utils.DynamicCache or not layers or plain is None:
        return None
    if any(type(layer) is not plain for layer in layers):
        return None
    return layers


def _new_cache(config):
    from transformers import DynamicCache

    return DynamicCache(config=config)


def _stack(pasts: list, config):
    """One cache holding ``pasts`` (each of one row, all of the same length) as a batch, or None."""
    layered = [_plain_layers(past) for past in pasts]
    if any(layers is None or len(layers) != len(layered[0]) for layers in layered):
        return None
    if pasts[0].get_seq_length() and any(layer.keys is None for layers in layered for layer in layers):
        return None  # a layer that holds nothing beside layers that do
    if len({past.get_seq_length() for past in pasts}) != 1:
        return None
    merged = _new_cache(config)
    if _plain_layers(merged) is None or len(merged.layers) != len(layered[0]):
        return None
    if pasts[0].get_seq_length() == 0:  # empty (a prefill): the call fills the merged cache itself
        return merged
    for index, layer in enumerate(merged.layers):
        keys = torch.cat([layers[index].keys for layers in layered], 0)
        values = torch.cat([layers[index].values for layers in layered], 0)
        layer.update(keys, values)
    return merged


def _split(merged, batch: int, config) -> list:
    """``merged``'s rows as ``batch`` caches of one row each."""
    caches = [_new_cache(config) for _ in range(batch)]
    for index, layer in enumerate(merged.layers):
        for row, past in enumerate(caches):  # update copies (it concatenates onto an empty tensor)
            past.layers[index].update(layer.keys[row:row + 1], layer.values[row:row + 1])
        layer.keys = layer.values = None  # the merged layer is no longer needed: free it as we go
    return caches


def wrap(model, vocab_size: Optional[int] = None, tokenizer=None, name: str = "") -> HFModel:
    """Return ``model`` (any transformers causal LM whose cache can be cropped: GPT-2, Llama, Qwen2, ...)
    in the form :func:`decode.plain_decode`, :func:`decode.speculative_decode` and
    :func:`speculative.measure.bench_decode.bench_decode` call.

    ``vocab_size`` keeps only the first that many logits (default: all the model produces). Checkpoints
    pad their embedding tables past the tokenizer, and one family's sizes pad differently (Qwen2.5's
    share a tokenizer but have 151,936 or 152,064 rows; vLLM pull request 13849): :func:`pair` cuts both
    to the tokenizer, so that both models decode over the same tokens. The tokenizer never produces the
    padding ids; the law decoded is the model's renormalised over real tokens. Batches of any size are
    correct (each row keeps its own cache and positions; see :class:`HFCache`); rows that start a call at
    the same position run as one batch.
    """
    if isinstance(model, GPT):
        raise TypeError("wrap takes a transformers model; the library's GPT runs in the engine as it is "
                        "(or export it first with speculative.engine.hf.export)")
    if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        raise TypeError(f"wrap takes a transformers causal LM (with an LM head), got {type(model).__name__}")
    return HFModel(model, vocab_size=vocab_size, tokenizer=tokenizer, name=name)


def same_tokenizer(first, second) -> Optional[str]:
    """Return None if the two tokenizers map the same strings to the same ids, else one line saying how
    they differ."""
    a, b = first.get_vocab(), second.get_vocab()
    if a == b:
        return None
    differ = len(set(a.items()) ^ set(b.items()))
    return f"{len(a)} vs {len(b)} entries, {differ} (token, id) pairs in one and not the other"


def pair(target, draft, target_tokenizer=None, draft_tokenizer=None, prompts: Sequence[str] = (),
         name: str = "") -> "HFPair":
    """Return a pair of wrapped transformers models ready for the engine and
    :func:`speculative.measure.bench_decode.bench_decode`.

    With both tokenizers: raise ValueError unless they are the same (a draft with another tokenizer
    proposes ids that mean other strings; this engine does not translate, unlike transformers'
    universal assisted generation), and cut both models' logits to the tokenizer's length, so that
    embedding tables padded to different sizes are aligned. Without tokenizers, the models must produce
    the same number of logits. ``prompts`` (strings) are encoded with the tokenizer for the benchmark.
    """
    if (target_tokenizer is None) != (draft_tokenizer is None):
        raise ValueError("pass both tokenizers or neither")
    sizes = [m.get_output_embeddings().weight.shape[0] for m in (target, draft)]
    if target_tokenizer is not None:
        problem = same_tokenizer(target_tokenizer, draft_tokenizer)
        if problem:
            raise ValueError(f"the draft's tokenizer is not the target's ({problem}): speculative decoding here "
                             "needs one vocabulary")
        vocab = len(target_tokenizer)
        if vocab > min(sizes):
            raise ValueError(f"the tokenizer has {vocab} tokens but a model produces only {min(sizes)} logits")
    elif sizes[0] != sizes[1]:
        raise ValueError(f"vocabulary mismatch: the target produces {sizes[0]} logits, the draft {sizes[1]}; "
                         "pass both tokenizers so that padding rows can be cut off")
    else:
        vocab = sizes[0]
    if prompts and target_tokenizer is None:
        raise ValueError("prompts are strings: pass the tokenizers to encode them")
    rows = [target_tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    names = [getattr(m.config, "_name_or_path", "") or type(m).__name__ for m in (target, draft)]
    return HFPair(target=wrap(target, vocab, target_tokenizer, names[0]),
                  draft=wrap(draft, vocab, draft_tokenizer, names[1]),
                  info={"target": names[0], "draft": names[1], "vocab_size": vocab,
                        "target_parameters": sum(p.numel() for p in target.parameters()),
                        "draft_parameters": sum(p.numel() for p in draft.parameters())},
                  prompts=rows, sha256=name or f"{names[0]} / {names[1]}", folder=None)


@dataclass
class HFPair:
    """A wrapped target and draft, with prompts as token ids: what :func:`speculative.measure.bench_decode.bench_decode`
    takes."""

    target: HFModel
    draft: HFModel
    info: dict
    prompts: list
    sha256: str  # no checksum of weights: the models' names stand in
    folder: Optional[str] = None


def load_pair(target: str, draft: str, prompts: Sequence[str] = (), device="cpu", dtype=torch.float32) -> HFPair:
    """Return :func:`pair` of two checkpoints loaded with ``AutoModelForCausalLM`` and ``AutoTokenizer``
    (hub names or local folders; nothing here downloads unless transformers can reach a hub)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = []
    for name in (target, draft):
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype).to(device)
        loaded += [model, AutoTokenizer.from_pretrained(name)]
    return pair(loaded[0], loaded[2], loaded[1], loaded[3], prompts=prompts)


def load_raced_pair(pair_folder: Optional[str] = None, hf_target: Optional[str] = None,
                    hf_draft: Optional[str] = None, device="cpu", dtype=torch.float32):
    """The pair a decoding benchmark races: the library pair in ``pair_folder`` (default: the shipped one), or
    two transformers checkpoints (``hf_target`` and ``hf_draft``) decoding that pair's prompts as text."""
    from speculative.engine.pair import load_pair as load_library_pair

    if (hf_target is None) != (hf_draft is None):
        raise ValueError("pass both --hf-target and --hf-draft, or neither")
    if hf_target and pair_folder:
        raise ValueError("--pair and --hf-target name two different pairs: pass one")
    library = load_library_pair(pair_folder, device=device, dtype=dtype)
    if not hf_target:
        return library
    text = [p.decode("utf-8", errors="replace") for p in library.prompts]
    return load_pair(hf_target, hf_draft, text, device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------------------
# transformers' own generation, instrumented: the peer in the race (speculative.measure.bench_peer.bench_peer)

#: Draft-length schedules of transformers' assisted generation that the race runs. "default" is what
#: ``generate(assistant_model=...)`` does when nothing is set (at transformers 5.24: up to 20 drafts, a
#: constant schedule, and drafting stops early once the draft's probability of the token it just
#: drafted falls below 0.4; that threshold adapts only when scikit-learn is installed). "fixed" drafts
#: exactly gamma tokens, with the confidence stop off. "heuristic" starts at gamma, adds 2 after a fully
#: accepted block and removes 1 otherwise.
HF_SCHEDULES = ("default", "fixed", "heuristic")


@contextlib.contextmanager
def _quiet():
    """Silence transformers' logged notices while it generates (its assisted generation logs a deprecation
    notice about its own internal call, which a reader can do nothing about); errors still show."""
    from transformers.utils import logging

    before, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()  # loading and saving a folder draw bars of their own
    try:
        yield
    finally:
        logging.set_verbosity(before)
        if bars:
            logging.enable_progress_bar()


def _sampling(temperature: float) -> dict:
    if temperature == 0:
        return {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
    return {"do_sample": True, "temperature": float(temperature), "top_k": 0, "top_p": 1.0}  # the whole law


def plain_generate(model, prompt: Sequence[int], max_new_tokens: int, temperature: float, seed: int = 0) -> list[int]:
    """Return the tokens ``model.generate`` (no assistant) emits after ``prompt``, sampled at ``temperature``
    (0: greedy) with no top-k or top-p; the generator is seeded with ``seed``."""
    ids = torch.tensor([list(prompt)], device=model.device)
    torch.manual_seed(seed)
    with _quiet():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, **_sampling(temperature))
    return out[0, ids.shape[1]:].tolist()


@dataclass
class AssistedRun:
    """What one ``generate(assistant_model=...)`` call did: its tokens, and per target call (after the
    first, which also reads the prompt) the drafts it verified and how many it accepted."""

    tokens: list
    drafted: list
    accepted: list

    def acceptance_rate(self) -> float:
        return sum(self.accepted) / sum(self.drafted) if sum(self.drafted) else float("nan")

    def tokens_per_call(self) -> float:
        return len(self.tokens) / len(self.drafted)


def assisted_generate(target, draft, prompt: Sequence[int], max_new_tokens: int, temperature: float,
                      schedule: str = "default", gamma: int = 4, seed: int = 0) -> AssistedRun:
    """Run transformers' assisted generation (``target.generate(assistant_model=draft)``) on ``prompt`` and
    return its tokens with the drafts verified and accepted per target call, read from the candidate
    generator's own update hook. ``schedule`` is one of :data:`HF_SCHEDULES`. At temperature > 0 it
    runs transformers' speculative sampling (``_speculative_sampling``), at 0 its greedy matching."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    if schedule not in HF_SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(HF_SCHEDULES)}, got {schedule!r}")
    settings = {"default": {},
                "fixed": {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
                          "assistant_confidence_threshold": 0.0},
                "heuristic": {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "heuristic_transient",
                              "assistant_confidence_threshold": 0.0}}[schedule]
    draft.generation_config = GenerationConfig(**settings)  # transformers' defaults, then the schedule's
    drafted, accepted = [], []
    original = AssistedCandidateGenerator.update_candidate_strategy

    def record(self, input_ids, scores, num_matches):
        drafted.append(scores.shape[1] - 1)  # the target's logits cover the drafts and one more
        accepted.append(int(num_matches))
        return original(self, input_ids, scores, num_matches)

    ids = torch.tensor([list(prompt)], device=target.device)
    torch.manual_seed(seed)
    AssistedCandidateGenerator.update_candidate_strategy = record
    try:
        with _quiet():
            out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                                  max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                  **_sampling(temperature))
    finally:
        AssistedCandidateGenerator.update_candidate_strategy = original
    return AssistedRun(tokens=out[0, ids.shape[1]:].tolist(), drafted=drafted, accepted=accepted)


#: The public pair chapter 08 races on a GPU: the pair of transformers' own assisted-decoding guide
#: (https://huggingface.co/docs/transformers/main/en/assisted_decoding), SmolLM 1.7B drafted by SmolLM
#: 135M, which share a tokenizer and fit a free Colab T4 in float16 (about 3.4 and 0.3 GB of weights).
#: The environment variables SPECULATIVE_HF_TARGET and SPECULATIVE_HF_DRAFT name others (hub names or
#: local folders).
PUBLIC_PAIR = {"target": "HuggingFaceTB/SmolLM-1.7B", "draft": "HuggingFaceTB/SmolLM-135M"}


def public_pair_names() -> dict:
    """Return the target and draft that chapter 08's GPU section loads (:data:`PUBLIC_PAIR`, or the
    environment's SPECULATIVE_HF_TARGET / SPECULATIVE_HF_DRAFT)."""
    import os

    return {"target": os.environ.get("SPECULATIVE_HF_TARGET", PUBLIC_PAIR["target"]),
            "draft": os.environ.get("SPECULATIVE_HF_DRAFT", PUBLIC_PAIR["draft"])}
