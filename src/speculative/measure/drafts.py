"""Which draft? Its price (a draft step c and a verification v, measured) and its agreement (alpha,
computed exactly from full forwards), and candidate drafts saved beside the shipped target.

Explained in: notebooks/14_which_draft.

What a draft gains is set by three numbers: alpha, the acceptance rate of its tested drafts; c, a draft
step in plain steps; and v(gamma), a verification over gamma + 1 positions in plain steps. This module
measures the last two for drafts of any shape (a forward's cost does not depend on the weights, so a
random model of the shape is timed) and computes the first for a trained draft on held-out contexts
before any decoding run, so that drafts can be ranked by the cost model's predicted speedup
(:func:`ranking.draft_ranking`). Measuring writes raw seconds and per-context rates; the figures come from
:mod:`analysis`.

A candidate draft is kept in a folder of its own (``draft.safetensors``, ``draft.json``, ``SHA256SUMS``),
tied to the pair whose target it was distilled from by that pair's hash; :func:`with_draft` returns the pair
with the draft swapped, under a hash of its own, for ``bench drafts`` and ``bench peer --draft``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

import torch

from speculative import defaults
from speculative.defaults import setting
from speculative.engine.model import GPT, GPTConfig
from speculative.engine.pair import Pair, _load_model, _weights, check_destination, sha256_file, write_checksummed
from speculative.engine.timing import environment, median_call_seconds
from speculative.sampling.transforms import SamplingConfig, logits_to_probs

__all__ = ["DistillSettings", "DRAFT_FILES", "save_draft", "load_draft", "with_draft", "raced_drafts", "ship_draft",
           "same_target",
           "draft_training",
           "measure_prices", "acceptance_from_forwards", "decode_contexts", "measure_agreement", "prices_record",
           "shape_name", "train_drafts"]
DRAFT_FILES = ("draft.safetensors", "draft.json")


def save_draft(folder: Path, draft: GPT, pair: Pair, info: dict, overwrite: bool = False) -> str:
    """Write ``draft`` (distilled from ``pair``'s target) into ``folder`` with checksums; return its sha256."""
    from safetensors.torch import save_file

    def write(staging: Path) -> None:
        save_file(_weights(draft), str(staging / "draft.safetensors"))
        record = dict(info, draft_config=draft.config.to_dict(), draft_parameters=draft.num_parameters(),
                      target_pair_sha256=pair.sha256)
        (staging / "draft.json").write_text(json.dumps(record, indent=2) + "\n")

    return write_checksummed(folder, DRAFT_FILES, write, overwrite)


def load_draft(folder: Path, device="cpu", dtype=torch.float32) -> tuple[GPT, dict, str]:
    """Return (draft, its draft.json, its sha256) from ``folder`` after verifying every checksum."""
    folder = Path(folder)
    sums_path = folder / "SHA256SUMS"
    if not sums_path.is_file():
        raise FileNotFoundError(f"no draft at {folder}: SHA256SUMS is missing")
    lines = [line.split(maxsplit=1) for line in sums_path.read_text().splitlines() if line.strip()]
    if any(len(parts) != 2 for parts in lines):
        raise ValueError(f"SHA256SUMS in {folder} is malformed: each line must be 'DIGEST  NAME'")
    expected = {name.strip(): digest for digest, name in lines}
    for name in DRAFT_FILES:
        if name not in expected or not (folder / name).is_file():
            raise FileNotFoundError(f"the draft in {folder} is missing {name} or its checksum")
        if sha256_file(folder / name) != expected[name]:
            raise ValueError(f"{name} in {folder} is corrupt: its sha256 does not match SHA256SUMS")
    info = json.loads((folder / "draft.json").read_text())
    draft = _load_model(folder / "draft.safetensors", GPTConfig(**info["draft_config"]), device, dtype)
    return draft, info, hashlib.sha256(sums_path.read_bytes()).hexdigest()


def with_draft(pair: Pair, folder: Path) -> Pair:
    """Return ``pair`` with its draft replaced by the one in ``folder``, which must have been distilled from
    this pair's target; the result's sha256 hashes both (the pair's and the draft's)."""
    draft, info, digest = load_draft(folder, device=pair.target.device, dtype=pair.target.dtype)
    if not same_target(pair, info["target_pair_sha256"]):
        raise ValueError(f"the draft in {folder} was distilled from pair {info['target_pair_sha256'][:12]}, "
                         f"not from this pair ({pair.sha256[:12]})")
    if draft.config.vocab_size != pair.target.config.vocab_size or draft.config.context < pair.target.config.context:
        raise ValueError(f"the draft in {folder} does not fit the target's vocabulary and context")
    combined = hashlib.sha256(f"{pair.sha256} {digest}".encode()).hexdigest()
    return replace(pair, draft=draft, info=dict(pair.info, draft_config=draft.config.to_dict(),
                                                  draft_from=str(folder), draft_sha256=digest,
                                                  draft_training=training_summary(info),
                                                  base_pair_sha256=pair.sha256), sha256=combined)


def raced_drafts(pair: Pair, folders: Sequence[str] = (), with_compiled: bool = False) -> dict[str, Pair]:
    """``{name: pair with that draft}`` for a race: the pair's own draft first, as ``shipped``, then the draft
    in each folder under the folder's name; with ``with_compiled``, each also as ``NAME+compiled``."""
    drafts = {"shipped": pair}
    for folder in folders:
        name = Path(folder).name
        if name in drafts:
            raise ValueError(f"two drafts are named {name!r}: give their folders different names")
        drafts[name] = with_draft(pair, folder)
    if with_compiled:
        drafts.update({f"{name}+compiled": compiled(other) for name, other in drafts.items()})
    return drafts


def same_target(pair: Pair, pair_sha256: str) -> bool:
    """Whether the pair ``pair_sha256`` has ``pair``'s target: it is ``pair`` itself, or a pair whose draft
    :func:`ship_draft` replaced (listed in pair.json's ``replaced``, target bytes unchanged)."""
    return pair_sha256 == pair.sha256 or any(r["pair_sha256"] == pair_sha256 for r in pair.info.get("replaced", []))


def ship_draft(pair: Pair, folder: Path, out: Path, keep_old: Optional[Path] = None,
               overwrite: bool = False) -> str:
    """Write into ``out`` the pair ``pair`` with its draft replaced by the candidate in ``folder``; return the
    new pair's sha256.

    The target, the prompts and the target's training log are copied byte for byte, so only the draft
    differs, and the candidates distilled from ``pair`` stay usable with the new pair (:func:`same_target`).
    pair.json describes the shipped draft (shape, parameters, validation bits per byte, where it came from
    and how it trained) and lists the pair it replaces under ``replaced``, with that pair's draft, so the old
    pair's figures can be traced. ``keep_old`` saves the replaced draft as a candidate folder
    (:func:`save_draft`), so the old pair can still be raced (``with_draft``). Running this twice on the same
    inputs writes the same bytes, so the same sha256.
    """
    import shutil

    from speculative.engine.pair import PAIR_FILES

    folder = Path(folder)
    _, info, digest = load_draft(folder)
    if not same_target(pair, info["target_pair_sha256"]):
        raise ValueError(f"the draft in {folder} was distilled from pair {info['target_pair_sha256'][:12]}, "
                         f"not from this pair ({pair.sha256[:12]})")
    if info["draft_config"]["vocab_size"] != pair.target.config.vocab_size or \
            info["draft_config"]["context"] < pair.target.config.context:
        raise ValueError(f"the draft in {folder} does not fit the target's vocabulary and context")
    check_destination(out, overwrite)
    if keep_old is not None:
        check_destination(keep_old, overwrite)
    old = {k: pair.info[k] for k in ("draft_config", "draft_parameters", "draft_validation_bpb", "distill_weight")
           if k in pair.info}
    replaced = {"pair_sha256": pair.sha256, "draft_sha256": sha256_file(pair.folder / "draft.safetensors"),
                "draft": old, "kept_as": str(keep_old) if keep_old is not None else None}
    described = {k: v for k, v in pair.info.items() if k not in ("distill_weight", "shipped_draft", "replaced")}
    described.update(draft_config=info["draft_config"], draft_parameters=info["draft_parameters"],
                     draft_validation_bpb=info.get("train_log", {}).get("final_validation_bpb"),
                     shipped_draft={"from": str(folder), "name": info.get("name"), "sha256": digest,
                                    "training": training_summary(info)},
                     replaced=[replaced] + list(pair.info.get("replaced", [])))
    log = json.loads((pair.folder / "train_log.json").read_text())
    log = dict(log, draft=info.get("train_log"), replaced_drafts=[log.get("draft")] + log.get("replaced_drafts", []))

    def write(staging: Path) -> None:
        for name in PAIR_FILES:
            if name not in ("draft.safetensors", "pair.json", "train_log.json"):
                shutil.copyfile(pair.folder / name, staging / name)
        shutil.copyfile(folder / "draft.safetensors", staging / "draft.safetensors")
        (staging / "pair.json").write_text(json.dumps(described, indent=2) + "\n")
        (staging / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")

    shipped = write_checksummed(out, PAIR_FILES, write, overwrite)
    if keep_old is not None:
        save_draft(keep_old, pair.draft, pair,
                   {"name": Path(keep_old).name, "candidate": None, "train_log": log["replaced_drafts"][0],
                    "trained_on": pair.info.get("trained_on"), "replaced_by": {"name": info.get("name"),
                                                                                "pair_sha256": shipped}},
                   overwrite=overwrite)
    return shipped


def compiled(pair: Pair) -> Pair:
    """Return ``pair`` with its draft wrapped in ``torch.compile`` (inductor, dynamic shapes): the same
    weights, so the same hash, with a draft step's many small operations fused. Only the draft is compiled:
    the target, and so the distribution verification restores, stay exactly as they were (the draft only
    sets q, which verification corrects for whatever it is). Compiling happens on the first calls, which
    take about a minute on a CPU; a decoding run should warm up before it is timed."""
    if pair.info.get("draft_compiled"):
        raise ValueError("this pair's draft is compiled already")
    return replace(pair, draft=torch.compile(pair.draft, dynamic=True),
                   info=dict(pair.info, draft_compiled="torch.compile(dynamic=True), inductor"))


def draft_training(pair: Pair) -> Optional[dict]:
    """Return how ``pair``'s draft trained, as a record keeps it (:func:`training_summary`): a candidate's
    (swapped in by :func:`with_draft`) or the shipped draft's (pair.json's ``shipped_draft``), else None."""
    return pair.info.get("draft_training") or (pair.info.get("shipped_draft") or {}).get("training")


def training_summary(info: dict) -> dict:
    """Return what a record keeps of a candidate draft's draft.json: its recipe and how far it trained."""
    log = info.get("train_log") or {}
    return {"candidate": info.get("candidate"), "initial_draft_sha256": info.get("initial_draft_sha256"),
            "steps": log.get("steps"), "seconds": log.get("train", {}).get("seconds"),
            "validation_bpb": log.get("final_validation_bpb"), "distillation_data": log.get("distillation_data")}


@torch.no_grad()
def measure_prices(target: GPT, shapes: Sequence[dict], widths: Sequence[int], rows: list[list[int]],
                   position: int = 160, repeats: int = 5, seed: int = 0, progress: bool = True) -> dict:
    """Return raw timings: the target's forward over each width (1 = a plain step's forward), and a
    one-token forward of a random draft of each shape, all with the cache filled to ``position``.

    Each round times every forward once (median of ``torch.utils.benchmark``'s blocked runs), in one
    interleaved order, and ``repeats`` rounds are kept, so that drift hits every entry alike. Only the
    forwards are timed: what a decoding step adds (sampling, the host read) is in ``bench``'s
    calibration. ``rows`` are prompts (token ids); every model sees their first ``position`` positions.
    """
    from tqdm import tqdm

    from speculative.engine.decode import call_positions, prefill

    if not widths or any(w < 1 for w in widths) or 1 not in widths or len(set(widths)) != len(widths):
        raise ValueError(f"widths must be distinct integers >= 1 and include 1 (every cost is relative to the "
                         f"one-position forward), got {list(widths)}")
    names = [shape_name(s) for s in shapes]
    if len(set(names)) != len(names):
        raise ValueError(f"shapes must be distinct, got {names}")
    device = target.device
    torch.manual_seed(seed)
    drafts = {shape_name(s): GPT(GPTConfig(vocab_size=target.config.vocab_size, context=target.config.context,
                                            **s)).to(device=device, dtype=target.dtype).eval() for s in shapes}
    held = [(list(r) * position)[:position] for r in rows]
    span = position + max(widths)
    if span > target.config.context:
        raise ValueError(f"position {position} + width {max(widths)} exceeds the context of {target.config.context}")
    start = call_positions([position - 1] * len(rows), device)  # an int, as the loop passes shared positions
    last = torch.tensor([[r[-1]] for r in held], device=device)

    def timer(model, width):
        cache = prefill(model, held, length=span)
        tokens = last.repeat(1, width)
        return lambda: median_call_seconds(lambda: model(tokens, start, cache, span=span, check=False),
                                           min_run_time=0.1)

    steps = {**{f"target_{w}": timer(target, w) for w in widths},
             **{f"draft_{name}": timer(model, 1) for name, model in drafts.items()}}
    rounds = {name: [] for name in steps}
    for _ in tqdm(range(repeats), desc="prices", disable=not progress):
        for name, step in steps.items():
            rounds[name].append(step())
    return {"rounds": rounds, "batch": len(rows), "position": position, "repeats": repeats,
            "shapes": {name: {**s, "parameters": model.num_parameters()} for (name, model), s in
                       zip(drafts.items(), shapes)},
            "target_parameters": target.num_parameters(), "widths": list(widths),
            "environment": environment(device, probe=True)}


def shape_name(shape: dict) -> str:
    return f"{shape['n_layer']}x{shape['d_model']}"


@torch.no_grad()
def decode_contexts(target: GPT, prompts: Sequence[bytes], new_tokens: int, config: SamplingConfig,
                    seed: int = 0) -> torch.Tensor:
    """Return (N, prompt + new_tokens) token ids: each prompt continued by the target under ``config``,
    the contexts a draft meets when speculative decoding emits the target's text. Prompts must share
    one length."""
    from speculative.engine.decode import plain_decode

    if len({len(p) for p in prompts}) != 1:
        raise ValueError("decode_contexts needs prompts of one length")
    generator = torch.Generator(device=target.device).manual_seed(seed)
    out = plain_decode(target, list(prompts), new_tokens, config, generator=generator)
    return torch.tensor([list(p) + t for p, t in zip(prompts, out.tokens)], device=target.device)


@torch.no_grad()
def acceptance_from_forwards(target: GPT, draft: GPT, contexts: torch.Tensor, first: int,
                             config: SamplingConfig, chunk: int = 16) -> list[float]:
    """Return, per context, the mean over positions ``first`` .. end - 1 of the exact acceptance rate
    sum_x min(p(x), q(x)) = 1 - TV(p, q) of the next token, from full forwards of both models.

    p and q are the distributions actually sampled from (:func:`transforms.logits_to_probs` under
    ``config``); when greedy both are one-hot and the rate is 1 where the arg-maxes agree, else 0.
    Speculative decoding tests a draft at position t with probability min(1, p/q) given the context, so
    this is the acceptance rate a decoding run measures, up to which positions it happens to test.
    """
    if not 1 <= first < contexts.shape[1]:
        raise ValueError(f"first must be in [1, {contexts.shape[1]}), got {first}")
    rates = []
    for part in contexts.split(chunk):
        inputs = part[:, :-1]
        p = logits_to_probs(target(inputs)[:, first - 1:], config)  # (b, L, V)
        q = logits_to_probs(draft(inputs)[:, first - 1:], config)
        rates.extend(torch.minimum(p, q).sum(-1).double().mean(-1).tolist())
    return rates


def measure_agreement(pair: Pair, drafts: dict, temperatures: Sequence[float] = (0.0, 1.0), contexts: int = 64,
                      prefix: int = 32, new_tokens: int = 96, seed: int = 7) -> dict:
    """Return a record (benchmark ``"agreement"``) of each draft's exact acceptance rate per held-out context.

    For each temperature, ``contexts`` prompts of ``prefix`` bytes from the corpus's validation files
    (line starts chosen by ``seed``) are continued by the target for ``new_tokens`` under that
    temperature, once, and every draft is scored on the same contexts over the generated positions
    (:func:`acceptance_from_forwards`). ``drafts`` maps a name to a pair sharing ``pair``'s target.
    Nothing is timed; the figures come from :func:`analysis.analyse`.
    """
    from speculative.measure.records import SCHEMA_VERSION
    from speculative.measure.shared import tokens_hash
    from speculative.training.corpus import load_corpus
    from speculative.training.train import make_prompts

    prompts = make_prompts(load_corpus().validation, count=contexts, length=prefix, seed=seed)
    observations = []
    for temperature in temperatures:
        config = SamplingConfig(temperature=temperature)
        made = decode_contexts(pair.target, prompts, new_tokens, config, seed=seed)
        for name, other in drafts.items():
            if other.target is not pair.target:
                raise ValueError(f"draft {name!r} comes with another target: build it with with_draft(pair, ...)")
            observations.append({"draft": name, "temperature": config.temperature,
                                 "contexts_sha256": tokens_hash(made.flatten().tolist()),
                                 "rates": acceptance_from_forwards(pair.target, other.draft, made, prefix, config)})
    return {
        "schema": SCHEMA_VERSION, "benchmark": "agreement",
        "what": "each draft's exact acceptance rate sum min(p, q) = 1 - TV from full forwards of both models, per "
                "held-out context, averaged over the positions the target generated; nothing timed",
        "environment": environment(pair.target.device), "pair_sha256": pair.sha256,
        "drafts": {name: {"sha256": other.sha256, "draft_config": other.draft.config.to_dict(),
                          "draft_parameters": other.draft.num_parameters(),
                          "from": other.info.get("draft_from", "the pair's own draft"),
                          "training": draft_training(other)}
                   for name, other in drafts.items()},
        "config": {"temperatures": [float(t) for t in temperatures], "contexts": contexts, "prefix": prefix,
                   "new_tokens": new_tokens, "seed": seed, "dtype": str(pair.target.dtype)},
        "observations": observations,
    }


def prices_record(target: GPT, shapes: Sequence[dict], widths: Sequence[int], rows: list[list[int]],
                  repeats: int = 5, progress: bool = True) -> dict:
    """Return a record (benchmark ``"prices"``) of :func:`measure_prices`: raw rounds, no figures."""
    from speculative.measure.records import SCHEMA_VERSION

    raw = measure_prices(target, shapes, widths, rows, repeats=repeats, progress=progress)
    return {"schema": SCHEMA_VERSION, "benchmark": "prices",
            "what": "forwards timed alone, interleaved, in rounds: the target over 1..9 positions and a random "
                    "draft of each shape over one, with the cache filled to the same position",
            "environment": raw.pop("environment"),
            "config": {"shapes": list(shapes), "widths": list(widths), "batch": raw["batch"],
                       "position": raw["position"], "repeats": repeats, "dtype": str(target.dtype)},
            "target_parameters": raw["target_parameters"], "shapes": raw["shapes"],
            "observations": raw["rounds"]}


@dataclass(frozen=True)
class DistillSettings:
    """The windows every candidate draft distils on (:func:`train_drafts`), and their seed."""

    sampled_windows: int = setting(defaults.DISTILL_WINDOWS["sampled"], "windows of the target's own samples")
    text_windows: int = setting(defaults.DISTILL_WINDOWS["text"], "windows of training text")
    seed: int = setting(defaults.TRAIN_SEED, "seed of the windows and weights")

    def __post_init__(self):
        for name in ("sampled_windows", "text_windows"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) \
                    or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")


def train_drafts(pair: Pair, out: Path, candidates: Sequence[dict],
                 sampled_windows: int = defaults.DISTILL_WINDOWS["sampled"],
                 text_windows: int = defaults.DISTILL_WINDOWS["text"], seed: int = defaults.TRAIN_SEED,
                 device: str = "cpu",
                 progress: bool = True, overwrite: bool = False) -> dict:
    """Train each candidate draft (:func:`train.parse_candidate`) by distillation from ``pair``'s target and
    save it under ``out/NAME`` (:func:`save_draft`); return {name: sha256}.

    Every candidate distils on the same windows, made once: ``sampled_windows`` of the target's own
    samples at temperature 1 after 32 bytes of training text, and ``text_windows`` of training text, with
    the target's log-probabilities at every position. Each trains for its own seconds, pure distillation
    (no cross-entropy term), from the pair's draft (``init``) or from a fresh initialisation.
    """
    if len({c["name"] for c in candidates}) != len(candidates):
        raise ValueError("two candidates share a name")
    from speculative.training.corpus import load_corpus
    from speculative.training.train import TrainConfig, joined, target_samples, train_model

    out = Path(out)
    context = pair.target.config.context
    starts = {}
    for c in candidates:  # every check before the windows are made (minutes of the target's sampling)
        check_destination(out / c["name"], overwrite)
        init, start_sha256 = (pair.draft, pair.sha256) if c["init"] else (None, None)
        if "from" in c:
            init, info, start_sha256 = load_draft(c["from"], device=device)
            if not same_target(pair, info["target_pair_sha256"]):  # another target's: not a start for this one
                raise ValueError(f"candidate {c['name']} starts from {c['from']}, which was distilled from pair "
                                 f"{info['target_pair_sha256'][:12]}, not from this pair ({pair.sha256[:12]})")
        heads = init.config.n_head if init is not None else c["n_head"]
        config = GPTConfig(vocab_size=pair.target.config.vocab_size, context=context, n_layer=c["n_layer"],
                           n_head=heads, d_model=c["d_model"])
        if init is not None and init.config != config:
            raise ValueError(f"candidate {c['name']} starts from a draft of shape "
                             f"{init.config.n_layer}x{init.config.d_model}, not {c['n_layer']}x{c['d_model']}")
        starts[c["name"]] = (config, init, start_sha256)
    corpus = load_corpus()
    data = joined([target_samples(pair.target, corpus.train, sampled_windows, seed=seed, progress=progress),
                   target_samples(pair.target, corpus.train, text_windows, prefix=context, seed=seed + 1,
                                  progress=progress)])
    digests = {}
    for c in candidates:
        config, init, start_sha256 = starts[c["name"]]
        settings = TrainConfig(seconds=c["seconds"], distill_weight=1.0, objective=c["objective"], seed=seed + 2,
                               device=device)
        draft, log = train_model(config, corpus.train, corpus.validation, settings, progress=progress,
                                 label=c["name"], init=init, data=data)
        info = {"name": c["name"], "candidate": c, "train_log": log,
                "trained_on": {"device": device, "torch": torch.__version__, "threads": torch.get_num_threads()},
                "initial_draft_sha256": start_sha256}
        digests[c["name"]] = save_draft(out / c["name"], draft, pair, info, overwrite=overwrite)
    return digests
