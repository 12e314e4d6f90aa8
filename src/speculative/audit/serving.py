"""What serving adds, exactly: sampling settings as serving engines apply them, a battery of cases that any
engine loads from disk, and the axes a server adds to a generate() call.

Explained in: notebooks/13_audit_serving.

- **Settings** (:class:`transforms.ServingConfig`, re-exported here): temperature, top-k and top-p, plus the
  fields an OpenAI-compatible request carries: ``min_p``, presence, frequency and repetition penalties and
  ``logit_bias``. They are applied in vLLM's order (``vllm/v1/sample/sampler.py``): the bias is added to the
  logits; then the repetition penalty over the prompt and the output so far (a positive logit divided by it,
  a negative one multiplied), the frequency penalty times each token's count in the output and the presence
  penalty once per token present in the output; then the temperature; then ``min_p`` (a token is dropped
  when its probability is below ``min_p`` times the largest); then top-k and top-p (:mod:`transforms`).
  Penalties depend on the output *so far*: under speculation, each drafted position must see the drafts
  before it, which is the axis SGLang #33643 got wrong.
- **The battery** (:func:`serving_battery`): every case's target and draft are Llama checkpoints with a
  head size of 32, saved as ordinary Hugging Face folders (``config.json`` and ``model.safetensors``),
  so transformers, vLLM and any server that loads such a folder run the same weights. Prompts are token
  ids; no tokenizer exists. The exact law is computed from the folders as loaded (:mod:`engine_cases`).
- **Independence across requests** (:func:`paired`): a case whose outcome is the tokens of two requests
  decoded side by side; its exact law is the product of the single-request law. An engine that shares a
  random stream between side-by-side requests keeps each request's marginal law; the pair's law shows
  the dependence directly.
- **The serving gallery** (:data:`SERVING_GALLERY`): the reference engine with each bug class serving
  adds. A wrong engine's power comes from its exact law where :func:`wrong_law` enumerates it (a bug that
  changes one drafted position's rule, :func:`positional_law`; a shared stream; a dropped bias), else
  from a sample.
- **Seeds** are in :mod:`speculative.audit.seeds`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from speculative.audit.engine_cases import CONTEXT, EngineCase, processed_probs
from speculative.audit.engine_gallery import EngineEntry, bf16_probs
from speculative.sampling.transforms import ServingConfig, as_serving, min_p_margin, serving_logits, serving_probs  # noqa: F401

__all__ = ["ServingConfig", "serving_logits", "serving_probs", "llama_model", "save_folder", "load_folder",
           "serving_battery", "PairedCase", "paired", "SERVING_TV", "HEAD_SIZE", "SERVING_GALLERY",
           "serving_gallery", "SERVING_CASES", "offset_draft", "offset_case", "BF16_OFFSET", "positional_law",
           "wrong_law", "save_eagle_head"]

#: The total variation distance each serving case's sample is sized to detect at power 0.99.
SERVING_TV = 0.03
#: The head size of every battery model: vLLM's CPU attention refuses less than 32.
HEAD_SIZE = 32


# --------------------------------------------------------------------------- the battery, on disk


def llama_model(vocab: int, seed: int, spread: float = 1.0, layers: int = 1, init: float = 0.3):
    """A randomly initialised transformers ``LlamaForCausalLM`` (two heads of size 32, context 64) whose
    logits have a standard deviation of about ``spread`` over random contexts (its output layer is scaled
    until they do). ``init`` is the weights' standard deviation: large enough that the next token depends
    on the context, which the rollback bugs need to show."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=2 * HEAD_SIZE, intermediate_size=4 * HEAD_SIZE,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                         head_dim=HEAD_SIZE, max_position_embeddings=CONTEXT, initializer_range=init,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                         dtype="float32")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).float().eval()
        probe = torch.randint(vocab, (64, 16))
    with torch.no_grad():
        scale = spread / float(model(probe).logits.std())
        model.lm_head.weight.mul_(scale)
    return model


def nudged_llama(model, noise: float, seed: int):
    """A copy of ``model`` with Gaussian noise of ``noise`` times each weight matrix's spread added."""
    import copy

    out = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in out.parameters():
            if weight.ndim > 1:
                weight.add_(torch.randn(weight.shape, generator=generator) * (noise * float(weight.std())))
    return out.eval()


def offset_draft(draft, offset: float = 64.0, probe_seed: int = 0):
    """A copy of ``draft`` (a wrapped Llama, :func:`load_folder`) whose next-token logits all carry a common
    offset of about ``offset`` in every context. Each row of the output layer gains the same vector, along
    the mean of the last hidden state over random contexts; a common offset leaves a float32 softmax
    (almost) where it was, and the copy's law is computed from the copy anyway. What it changes is how
    coarsely bfloat16 rounds the logits: its spacing is 2^-8 of their size."""
    import copy

    from speculative.engine.hf import wrap

    inner = copy.deepcopy(draft.model)
    vocab = draft.config.vocab_size
    probe = torch.randint(vocab, (256, 12), generator=torch.Generator().manual_seed(probe_seed))
    with torch.no_grad():
        hidden = inner.model(probe).last_hidden_state.reshape(-1, inner.config.hidden_size)
        direction = hidden.mean(0)
        inner.lm_head.weight.add_(offset * direction / float(direction @ direction))
    return wrap(inner.eval(), name=f"{draft.config.name}, logits offset by {offset:g}")


def save_folder(model, folder: Path) -> Path:
    """Save ``model`` as a Hugging Face folder (``config.json``, ``model.safetensors``); return it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def save_eagle_head(target, folder: Path, seed: int) -> Path:
    """Save an untrained EAGLE head for ``target`` (a transformers Llama) in the layout vLLM's
    ``EagleLlamaForCausalLM`` loads (``method: "eagle"``): ``fc`` maps the token's embedding and the
    target's last hidden state to one decoder layer without its input norm, and the head shares the
    target's embedding and output layer. Its weights are random (a nudged copy of the target's layer), so
    it proposes poorly; the law an engine must keep does not depend on the draft."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    layer = nudged_llama(target, 1.0, seed).state_dict()
    generator = torch.Generator().manual_seed(seed)
    hidden = target.config.hidden_size
    weights = {"fc.weight": torch.randn(hidden, 2 * hidden, generator=generator) * 0.1}
    weights.update({name[len("model."):]: value.contiguous() for name, value in layer.items()
                    if name.startswith("model.layers.0.") and "input_layernorm" not in name})
    save_file(weights, str(folder / "model.safetensors"))
    target.config.to_json_file(str(folder / "config.json"))
    return folder


def load_folder(folder: Path):
    """The model of a saved folder behind the engine interface (:func:`hf.wrap`), float32, on the CPU,
    with ``.folder`` set to where it was loaded from."""
    from transformers import AutoModelForCausalLM

    from speculative.engine.hf import _quiet, wrap

    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    wrapped = wrap(model.eval(), name=str(folder))
    wrapped.folder = str(Path(folder).resolve())
    return wrapped


#: The battery: name, vocabulary, seed, spread, draft noise, prompt length, k, config.
_SPECS = [
    ("V = 3, T = 1", 3, 11, 1.2, 1.0, 5, 4, ServingConfig()),
    ("V = 4, T = 0.7, top-k 3", 4, 12, 1.2, 1.0, 23, 4, ServingConfig(0.7, top_k=3)),
    ("V = 6, T = 0.8, top-p 0.8", 6, 13, 1.0, 1.0, 40, 3, ServingConfig(0.8, top_p=0.8)),
    ("V = 3, penalties", 3, 14, 1.2, 1.0, 7, 4,
     ServingConfig(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.3)),
    ("V = 4, logit_bias and min_p", 4, 15, 1.2, 1.0, 9, 4,
     ServingConfig(min_p=0.12, logit_bias=((1, 1.0), (3, -0.5)))),
]
#: The battery's case names, in order.
SERVING_CASES = [spec[0] for spec in _SPECS]


def _prompt(vocab: int, length: int, seed: int) -> list:
    return torch.randint(vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def write_battery(root: Path) -> Path:
    """Write every case's target and draft folder under ``root`` (``<case>/target``, ``<case>/draft``), an
    EAGLE head for its target (``<case>/eagle``, :func:`save_eagle_head`) and ``battery.json`` (prompts,
    settings, k); deterministic for a given torch and transformers."""
    from speculative.engine.hf import _quiet

    root = Path(root)
    index = []
    for number, (name, vocab, seed, spread, noise, prompt_length, k, config) in enumerate(_SPECS):
        target = llama_model(vocab, seed, spread)
        with _quiet():
            save_folder(target, root / f"case{number}" / "target")
            save_folder(nudged_llama(target, noise, seed + 100), root / f"case{number}" / "draft")
            save_eagle_head(target, root / f"case{number}" / "eagle", seed + 200)
        index.append({"name": name, "folder": f"case{number}", "prompt": _prompt(vocab, prompt_length, seed),
                      "length": k, "config": dataclasses.asdict(config)})
    (root / "battery.json").write_text(json.dumps(index, indent=1))
    return root


def _config_from(fields: dict) -> ServingConfig:
    fields = dict(fields)
    fields["logit_bias"] = tuple(tuple(pair) for pair in fields.get("logit_bias", ()))
    return ServingConfig(**fields)


def serving_battery(root: Path, names: Optional[list] = None, write: bool = True) -> list[EngineCase]:
    """The serving cases, loaded from the folders under ``root`` (written first when ``write`` and
    missing). Each case's ``target`` and ``draft`` carry ``.folder``; ``tv`` is :data:`SERVING_TV`.
    ``names`` picks cases by name (an unknown one raises ``ValueError``)."""
    root = Path(root)
    if not (root / "battery.json").exists():
        if not write:
            raise ValueError(f"{root} holds no serving battery (battery.json); run write_battery first")
        write_battery(root)
    index = json.loads((root / "battery.json").read_text())
    known = [entry["name"] for entry in index]
    for name in names or ():
        if name not in known:
            raise ValueError(f"no serving case named {name!r}; known: {', '.join(known)}")
    cases = []
    for entry in index:
        if names and entry["name"] not in names:
            continue
        target = load_folder(root / entry["folder"] / "target")
        draft = load_folder(root / entry["folder"] / "draft")
        cases.append(EngineCase(entry["name"], target, draft, entry["prompt"], _config_from(entry["config"]),
                                length=entry["length"], tv=SERVING_TV))
    return cases


# --------------------------------------------------------------------------- independence across requests


class PairedCase(EngineCase):
    """Two requests of ``base`` decoded side by side: the engine is asked for 2n rows at once, and rows
    2i and 2i + 1 form outcome i, a sequence of 2k tokens. Its exact law is the product of ``base``'s.
    ``length`` audits fewer tokens of each request than ``base`` does (the product law's cells are
    squared)."""

    def __init__(self, base: EngineCase, tv: Optional[float] = None, length: Optional[int] = None):
        if length is not None:
            base = EngineCase(base.name, base.target, base.draft, base.prompt, base.config, length, base.tv)
        super().__init__(f"{base.name}, two requests side by side", base.target, base.draft, base.prompt,
                         base.config, length=2 * base.length, tv=base.tv if tv is None else tv)
        self.base = base

    def law(self):
        if self._law is None:
            codes, probs = self.base.law()
            shift = self.vocab ** self.base.length
            joint_codes = (codes[:, None] * shift + codes[None, :]).ravel()
            joint = np.outer(probs, probs).ravel()
            order = np.argsort(joint_codes)
            self._law = (joint_codes[order], joint[order], self.base.entropy_bits, self.base.acceptance,
                         self.base.margin)
        return self._law[0], self._law[1]

    def run(self, engine, generator: torch.Generator, n: int):
        result = engine(self.target, self.draft, list(self.prompt), self.base.length, self.config, generator, 2 * n)
        tokens = torch.as_tensor(getattr(result, "tokens", result))
        if tuple(tokens.shape) != (2 * n, self.base.length):
            raise ValueError(f"returned shape {tuple(tokens.shape)} for {2 * n} requests, expected "
                             f"({2 * n}, {self.base.length})")
        return tokens.reshape(n, self.length)


def paired(case: EngineCase, tv: Optional[float] = None, length: Optional[int] = 2) -> PairedCase:
    """The independence case of ``case`` (:class:`PairedCase`), two tokens of each request by default."""
    return PairedCase(case, tv, length)


# --------------------------------------------------------------------------- the serving gallery

_T1, _TOPK, _TOPP, _PENALTIES, _BIAS = SERVING_CASES
#: Engines built on :func:`engine_gallery.reference_engine` with the bug classes serving adds, and the serving
#: cases each runs on (``"paired"``: the first case's two requests side by side).
SERVING_GALLERY = [
    EngineEntry("reference", "the reference engine", True, "a correct engine: both contexts are the emitted tokens",
                needs=(_PENALTIES, _BIAS, "paired")),
    EngineEntry("settings_not_expanded", "settings not expanded to the drafted positions", False,
                "verifies the drafted positions at temperature 1 with no top-k or top-p; only the last position "
                "gets the request's settings (vLLM 0.32.0 on CPU reads them from memory it never wrote)",
                "vllm55005", "https://github.com/vllm-project/vllm/issues/55005", "settings_not_expanded",
                needs=(_TOPK, _TOPP)),
    EngineEntry("shared_stream", "side-by-side requests share one random stream", False,
                "two requests decoded side by side draw the same uniforms, so they emit the same tokens; each "
                "request alone keeps the law", "tensorrtllm19487",
                "https://github.com/NVIDIA/TensorRT-LLM/issues/19487", "shared_stream", needs=("paired",)),
    EngineEntry("penalty_per_step", "penalties updated once per block", False,
                "applies presence, frequency and repetition penalties from the output as it stood when the block "
                "began, so a drafted position does not see the drafts before it",
                "sglang33643", "https://github.com/sgl-project/sglang/pull/33643", "penalty_per_step",
                needs=(_PENALTIES,)),
    EngineEntry("logit_bias_ignored", "logit_bias dropped under speculation", False,
                "decodes, drafts and verifies as if the request carried no logit_bias",
                "vllm38202", "https://github.com/vllm-project/vllm/issues/38202", "logit_bias_ignored",
                needs=(_BIAS,)),
    EngineEntry("point_residual", "a residual lowered at the drafted token only", False,
                "after a rejection of x, samples from p with only p(x) lowered by q(x), instead of from "
                "max(p - q, 0) over the whole vocabulary", "xllm2175", "https://github.com/xLLM-AI/xllm/pull/2175",
                "point_residual", needs=(_T1, _TOPK)),
    EngineEntry("bf16_draft", "drafts drawn from bfloat16 logits", False,
                "draws each draft from the softmax of its logits rounded to bfloat16 and hands the rule the "
                "float32 q; it shows on a draft whose logits sit far from zero (:func:`offset_draft`)",
                "deepspec31", "https://github.com/deepseek-ai/DeepSpec/issues/31", "bf16_draft",
                needs=("offset",)),
    EngineEntry("block_hybrid", "block verification with the token-wise residual", False,
                "keeps each drafted position by the token-wise test on its own, cuts the block after the last "
                "kept one and draws the next token from max(p - q, 0)", "vllmascend7807",
                "https://github.com/vllm-project/vllm-ascend/issues/7807", "block_hybrid", needs=(_T1, _TOPK)),
    EngineEntry("deterministic_draft", "a deterministic draft", True,
                "proposes the draft's arg-max and hands the rule that one-hot q, as n-gram and greedy draft heads "
                "do: fewer acceptances, the same law (the class of vLLM #40149, read as a bias)",
                "vllm40149", "https://github.com/vllm-project/vllm/issues/40149", "deterministic_draft",
                needs=(_T1, _PENALTIES)),
]


#: The common logit offset of the draft in the case that shows bfloat16 drafts (:func:`offset_draft`).
BF16_OFFSET = 64.0


def offset_case(case: EngineCase, offset: float = BF16_OFFSET) -> EngineCase:
    """``case`` with its draft's logits offset by ``offset`` (:func:`offset_draft`)."""
    return EngineCase(f"{case.name}, draft logits near {offset:g}", case.target, offset_draft(case.draft, offset),
                      case.prompt, case.config, case.length, case.tv)


def _entry_cases(entry: EngineEntry, cases: list) -> list:
    by_name = {case.name: case for case in cases}
    made = {"paired": lambda: paired(by_name[_T1]), "offset": lambda: offset_case(by_name[_T1])}
    return [made[name]() if name in made else by_name[name] for name in entry.needs]


# --------------------------------------------------------------------------- wrong laws, enumerated


def _rule_step(p, q_sampled, q_judged):
    """One drafted position of a token-wise rule handed q_judged while the draft was drawn from
    q_sampled: (the chance of each token as the accepted draft, as the correction)."""
    accept = torch.where(q_judged > 0, torch.clamp(p / q_judged.clamp(min=1e-300), max=1), 0)
    accepted = q_sampled * accept
    residual = torch.clamp(p - q_judged, min=0)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp(min=1e-300), p)
    return accepted, (1 - accepted.sum(-1, keepdim=True)).clamp(min=0) * residual


def _point_step(p, q):
    """xLLM #2175's residual, per drafted position: after a rejection of x, p with only p(x) lowered by q(x)."""
    accept = torch.where(q > 0, torch.clamp(p / q.clamp(min=1e-300), max=1), 0)
    corrected = torch.zeros_like(p)
    for x in range(p.shape[-1]):
        lowered = p.clone()
        lowered[:, x] = (p[:, x] - q[:, x]).clamp(min=0)
        total = lowered.sum(-1, keepdim=True)
        lowered = torch.where(total > 0, lowered / total.clamp(min=1e-300), p)
        corrected += (q[:, x] * (1 - accept[:, x]))[:, None] * lowered
    return q * accept, corrected


def _step(bug: Optional[str], case: EngineCase, target_logits, draft_logits, tokens, lengths):
    """The (accepted, corrected) laws of one drafted position of the reference engine with ``bug``."""
    config, start = case.config, len(case.prompt)
    p = processed_probs(target_logits, config, tokens, lengths, start).double()
    q = processed_probs(draft_logits, config, tokens, lengths, start).double()
    if bug == "bf16_draft":
        return _rule_step(p, bf16_probs(draft_logits, config, tokens, lengths, start).double(), q)
    if bug == "settings_not_expanded":
        plain = dataclasses.replace(config, temperature=1, top_k=None, top_p=None)
        return _rule_step(processed_probs(target_logits, plain, tokens, lengths, start).double(), q, q)
    if bug == "point_residual":
        return _point_step(p, q)
    return _rule_step(p, q, q)


#: The bugs whose law :func:`positional_law` enumerates: each changes one drafted position's rule only.
POSITIONAL_BUGS = (None, "bf16_draft", "settings_not_expanded", "point_residual")


@torch.no_grad()
def positional_law(case: EngineCase, bug: Optional[str] = None, gamma: int = 2) -> dict:
    """The exact law ({code: probability}) of the first k tokens the reference engine emits on ``case``
    with ``bug`` (one of :data:`POSITIONAL_BUGS`; None is the correct rule), at ``gamma`` drafts a block.

    Every drafted position j < gamma emits its token as the accepted draft or as the correction, with
    chances that depend on the context only (:func:`_step`); the token after gamma accepted drafts is the
    target's. So the state that matters is the context and j, and the law follows by carrying each
    prefix's weight on every j forward, one token at a time."""
    if bug not in POSITIONAL_BUGS:
        raise ValueError(f"positional_law enumerates {POSITIONAL_BUGS}, not {bug!r}")
    prompt = list(case.prompt)
    frontier = {(): {0: 1.0}}
    for _ in range(case.length):
        prefixes = list(frontier)
        tokens = torch.tensor([prompt + list(prefix) for prefix in prefixes])
        lengths = torch.full((len(tokens),), tokens.shape[1])
        target_logits, draft_logits = case.target(tokens)[:, -1], case.draft(tokens)[:, -1]
        p = processed_probs(target_logits, case.config, tokens, lengths, len(prompt)).double().numpy()
        accepted, corrected = (a.numpy() for a in _step(bug, case, target_logits, draft_logits, tokens, lengths))
        following = {}
        for i, prefix in enumerate(prefixes):
            for j, weight in frontier[prefix].items():
                moves = [(p[i], 0)] if j == gamma else [(accepted[i], j + 1), (corrected[i], 0)]
                for law, state in moves:
                    for x in np.flatnonzero(law > 0):
                        states = following.setdefault(prefix + (int(x),), {})
                        states[state] = states.get(state, 0.0) + weight * float(law[x])
        frontier = following
    powers = case.vocab ** np.arange(case.length - 1, -1, -1, dtype=np.int64)
    return {int(np.dot(prefix, powers)): sum(states.values()) for prefix, states in frontier.items()}


def wrong_law(entry: EngineEntry, case: EngineCase) -> Optional[dict]:
    """The exact law of ``entry``'s outcomes on ``case`` ({code: probability}) where it can be enumerated
    without running the engine: a shared stream emits one request's tokens twice; a dropped logit_bias
    emits the law of the case without it; a bug that changes one drafted position's rule has the law
    :func:`positional_law` carries forward. None for the others (penalties from the block's start and the
    block-wise mix depend on the whole block)."""
    if entry.bug in POSITIONAL_BUGS[1:] and not isinstance(case, PairedCase):
        return positional_law(case, entry.bug)
    if entry.bug == "shared_stream" and isinstance(case, PairedCase):
        base_codes, base_probs = case.base.law()
        return dict(zip((base_codes * case.vocab ** case.base.length + base_codes).tolist(), base_probs.tolist()))
    if entry.bug == "logit_bias_ignored":
        unbiased = EngineCase(case.name, case.target, case.draft, case.prompt,
                              dataclasses.replace(case.config, logit_bias=()), case.length, case.tv)
        return dict(zip(*(a.tolist() for a in unbiased.law())))
    return None


def _enumerated_power(entry: EngineEntry, case: EngineCase, n: int, per_case: float) -> Optional[float]:
    """The probability that the case's test at n rows rejects the entry, from :func:`wrong_law` (None
    where that law is not enumerated). Mass outside the null's support fails the case at once, so it
    counts through the chance that at least one of the n rows lands there."""
    from speculative.sampling import stats

    wrong = wrong_law(entry, case)
    if wrong is None:
        return None
    codes, probs = case.law()
    inside = np.array([wrong.get(code, 0.0) for code in codes.tolist()])
    outside = max(0.0, 1.0 - float(inside.sum()))
    hit_outside = 1.0 - (1.0 - outside) ** n
    if inside.sum() <= 0:
        return hit_outside
    fit_power = stats.power(n, list(probs), list(inside / inside.sum()), per_case)
    return 1.0 - (1.0 - hit_outside) * (1.0 - fit_power)


def serving_gallery(cases: list, family_false_alarm: Optional[float] = None, power_rows: int = 10_000,
                    max_rows: Optional[int] = None, seed: int = 0) -> list[dict]:
    """Audit every engine of :data:`SERVING_GALLERY` on the serving cases it needs; for each wrong one,
    the probability that its cases reject it: from its exact law where that can be enumerated
    (``power_from`` "law"), else from an independent sample of ``power_rows`` rows ("sample")."""
    from speculative.audit.engine_audit import audit_engine, engine_power
    from speculative.sampling import stats

    family_false_alarm = stats.FALSE_ALARM_RATE if family_false_alarm is None else family_false_alarm
    rows = []
    for entry in SERVING_GALLERY:
        chosen = _entry_cases(entry, cases)
        report = audit_engine(entry.engine(), cases=chosen, family_false_alarm=family_false_alarm, seed=seed,
                              max_rows=max_rows)
        row = {"key": entry.key, "name": entry.name, "lawful": entry.lawful, "cite": entry.cite, "url": entry.url,
               "passed": report.passed, "cases": [case.name for case in chosen],
               "failed": [r.name for r in report.results if not r.passed], "report": report, "power": None,
               "power_from": None}
        if not entry.lawful:
            per_case, miss, sources = family_false_alarm / len(chosen), 1.0, set()
            for result, case in zip(report.results, chosen):
                power = _enumerated_power(entry, case, result.n, per_case)
                sources.add("law" if power is not None else "sample")
                if power is None:
                    power = engine_power(entry.engine(), case, result.n, per_case, power_rows)
                miss *= 1 - power
            row["power"], row["power_from"] = 1 - miss, "+".join(sorted(sources))
        rows.append(row)
    return rows
