"""The peer race (``bench peer``): this engine against transformers' assisted generation on the same
models, prompts and seeds, side by side in one run.

Explained in: notebooks/08_decoding_demo (the race, and the public pair for GPU readers).

:func:`bench_peer` returns a record (:mod:`speculative.measure.records`) of whole timed calls, one per
prompt and :class:`Decoder`; :func:`bench_peer_runs` keeps several independent races in one record; and
:func:`race_public_pair` runs the decode benchmark and this race on a public pair of transformers
checkpoints. transformers itself is imported only when a race runs, so that this module loads without it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

from speculative import defaults
from speculative.engine.decode import check_room, encode_prompts, plain_decode, speculative_decode
from speculative.engine.hf import assisted_generate, export, load_pair, plain_generate, wrap
from speculative.engine.model import GPT
from speculative.engine.policy import make_policy
from speculative.engine.timing import environment, synchronize
from speculative.measure.analysis import analyse
from speculative.measure.analysis_peer import peer_decoder
from speculative.measure.bench_decode import _independent_runs, bench_decode
from speculative.measure.calibration import calibrate_steps
from speculative.measure.records import SCHEMA_VERSION
from speculative.measure.settings import PeerSettings, _settings, split_policy
from speculative.measure.shared import prompts_hash, tokens_hash
from speculative.sampling.transforms import SamplingConfig

__all__ = ["Decoder", "bench_peer", "bench_peer_runs", "race_public_pair"]


@dataclass(frozen=True)
class Decoder:
    """One decoder of the race: its ``name`` in the record, how to ``run`` it on one prompt (ids, new
    tokens), and how its result ``counts`` (blocks, drafted, accepted); None for a plain decoder."""

    name: str
    run: Callable
    counts: Optional[Callable] = None


def _engine_counts(result) -> tuple[int, int, int]:
    """(target calls that emitted tokens, drafted, accepted) of this engine's run of one row."""
    accepted = [a for block in result.accepted for a in block.reshape(-1).tolist() if a >= 0]
    if result.lengths:  # a policy: each block's own length
        drafted = sum(n for block in result.lengths for n in block.reshape(-1).tolist() if n >= 0)
    else:
        drafted = result.gamma * len(accepted)
    return len(accepted), drafted, sum(accepted)


def _assisted_counts(result) -> tuple[int, int, int]:
    return len(result.drafted), sum(result.drafted), sum(result.accepted)


def _tokens(result) -> list[int]:
    tokens = result if isinstance(result, list) else result.tokens
    return tokens[0] if tokens and isinstance(tokens[0], list) else tokens


def _peer_decoders(pair, s: PeerSettings, config, seed: int, policies: dict, models: dict) -> list[Decoder]:
    """The race's decoders at one temperature and seed, in the order each prompt meets them."""
    device, t = pair.target.device, config.temperature

    def generator():
        return torch.Generator(device=device).manual_seed(seed)

    def ours(policy, rule):
        return lambda row, n: speculative_decode(pair.target, pair.draft, [row], n, policy, config, generator(),
                                                 rule=rule)

    def assisted(schedule):
        return lambda row, n: assisted_generate(models["hf_target"], models["hf_draft"], row, n, t, schedule,
                                                s.gamma, seed)

    out = [Decoder(peer_decoder(p), ours(policies[p], split_policy(p)[1]), _engine_counts) for p in s.policies]
    out.append(Decoder("ours_plain", lambda row, n: plain_decode(pair.target, [row], n, config, generator())))
    if "wrapped" in models:
        out.append(Decoder("ours_on_hf_models", lambda row, n: speculative_decode(
            *models["wrapped"], [row], n, s.gamma, config, generator()), _engine_counts))
    out.append(Decoder("hf_plain", lambda row, n: plain_generate(models["hf_target"], row, n, t, seed)))
    out += [Decoder(f"hf_{schedule}", assisted(schedule), _assisted_counts) for schedule in s.schedules]
    return out


def _peer_policies(pair, s: PeerSettings, config, rows) -> tuple[dict, list]:
    """Each raced policy's object at one temperature, and the raw calibrations of the cost-model ones
    (calibrated at this temperature and rule, before any timed run)."""
    policies, calibrations = {}, []
    for p in s.policies:
        base, rule = split_policy(p)
        if base == "fixed":
            policies[p] = s.gamma
        elif base == "auto":
            raw = calibrate_steps(pair, rows[:1], list(range(1, defaults.AUTO_MAX_GAMMA + 1)), config,
                                  s.max_new_tokens, repeats=s.calibration_repeats, seed=s.seed, rule=rule)
            policies[p] = make_policy("auto", calibration=raw, max_gamma=defaults.AUTO_MAX_GAMMA)
            calibrations.append({"temperature": config.temperature, "policy": p,
                                 **{key: raw[key] for key in ("seconds", "rounds", "repeats")}})
        else:
            policies[p] = make_policy(base, s.gamma, max_gamma=defaults.PEER_MAX_GAMMA)
    return policies, calibrations


def bench_peer(pair, settings: Optional[PeerSettings] = None, *, progress: bool = True, **overrides) -> dict:
    """Return a record of this engine against transformers' assisted generation on the same models, side by side.

    The shipped pair is exported to transformers' GPT-2 (:func:`hf.export`: equal logits), so both sides
    decode the same models, prompts and number of new tokens at batch 1 (the batch transformers'
    assisted generation supports), on one machine, in one run. For each temperature, every prompt is
    decoded in turn by every :class:`Decoder`: this engine under each raced policy (``fixed`` at
    ``gamma`` is ``ours``; ``heuristic`` and ``confidence`` may draft up to
    :data:`defaults.PEER_MAX_GAMMA`, as transformers' default does; ``auto``, the cost model, is
    calibrated at this temperature first; ``+block`` runs a policy under block verification), its plain
    decoding (``ours_plain``), this engine on the exported models through :func:`hf.wrap`
    (``ours_on_hf_models``: the same loop with transformers' forwards, at the fixed ``gamma``),
    ``generate`` without an assistant (``hf_plain``) and ``generate(assistant_model=...)`` under each
    schedule (:data:`hf.HF_SCHEDULES`). Each call is timed whole (prefill included); the round repeats
    ``repeats`` times after a warm-up. The summary (:func:`analysis.analyse`) has one row per
    (temperature, schedule, policy), and at temperature 0 says whether every decoder emitted the same
    tokens as the first.

    ``pair`` may also be a wrapped transformers pair (:func:`hf.pair`, :func:`hf.load_pair`): then
    ``ours`` runs this engine on the wrapped models, transformers runs the models themselves, and there
    is no ``ours_on_hf_models``. transformers stops at an end-of-sequence token unless told otherwise;
    every call here asks for exactly ``max_new_tokens`` (``min_new_tokens``), which masks that token on
    transformers' side only, so greedy outputs can differ where a model would end its text.
    """
    import transformers  # lazy: optional, not among the package's dependencies; only a race needs it

    s = _settings(PeerSettings, settings, overrides)
    if s.prompts > len(pair.prompts):
        raise ValueError(f"{s.prompts} prompts asked for, but the pair ships {len(pair.prompts)}")
    rows = encode_prompts(pair.prompts[:s.prompts], pair.target.config.vocab_size)
    for model in (pair.target, pair.draft):  # transformers' default schedule drafts up to 20 tokens
        check_room(model, rows, s.max_new_tokens, lookahead=max(s.gamma, 20, defaults.PEER_MAX_GAMMA) + 2)
    device = pair.target.device
    if isinstance(pair.target, GPT):  # the library's models: export them; ours also runs on the exports
        models = {"hf_target": export(pair.target), "hf_draft": export(pair.draft)}
        if "fixed" in s.policies:
            models["wrapped"] = (wrap(models["hf_target"]), wrap(models["hf_draft"]))
    else:  # a wrapped transformers pair: ours already runs transformers' forwards
        models = {"hf_target": pair.target.model, "hf_draft": pair.draft.model}
    per_prompt = len(_peer_decoders(pair, s, SamplingConfig(), s.seed, {p: s.gamma for p in s.policies}, models))
    bar = tqdm(total=len(s.temperatures) * s.repeats * s.prompts * per_prompt, desc="peer race", disable=not progress,
               file=sys.stderr)
    observations, calibrations = [], []
    for temperature in s.temperatures:
        config = SamplingConfig(temperature=temperature)
        policies, calibrated = _peer_policies(pair, s, config, rows)
        calibrations += calibrated
        for decoder in _peer_decoders(pair, s, config, s.seed, policies, models):  # warm-up, not timed
            decoder.run(rows[0], 16)
        for repeat in range(s.repeats):
            decoders = _peer_decoders(pair, s, config, s.seed + repeat, policies, models)
            for index, row in enumerate(rows):
                for decoder in decoders:
                    synchronize(device)
                    began = time.perf_counter()
                    result = decoder.run(row, s.max_new_tokens)
                    synchronize(device)
                    seconds = time.perf_counter() - began
                    blocks, drafted, accepted = decoder.counts(result) if decoder.counts else (0, 0, 0)
                    observations.append({"temperature": config.temperature, "repeat": repeat, "prompt": index,
                                         "decoder": decoder.name, "seconds": seconds, "blocks": blocks,
                                         "drafted": drafted, "accepted": accepted,
                                         "tokens_sha256": tokens_hash(_tokens(result))})
                    bar.update()
    bar.close()
    sklearn = importlib.util.find_spec("sklearn") is not None
    record = {
        "schema": SCHEMA_VERSION, "benchmark": "peer",
        "what": "this engine vs transformers' assisted generation on the same exported models, batch 1, side by "
                "side, every prompt decoded by every decoder in turn; whole calls timed (prefill included)",
        "environment": {**environment(device, probe=True), "transformers": transformers.__version__,
                        "scikit_learn_installed": sklearn},
        "pair_sha256": pair.sha256, "prompts_sha256": prompts_hash(pair.prompts[:s.prompts]),
        "config": {**dataclasses.asdict(s), "peer_max_gamma": defaults.PEER_MAX_GAMMA,
                   "auto_max_gamma": defaults.AUTO_MAX_GAMMA, "auto_v_floor": defaults.AUTO_V_FLOOR,
                   "dtype": str(pair.target.dtype),
                   "hf_default": "transformers' GenerationConfig defaults: num_assistant_tokens 20, schedule "
                   f"constant, assistant_confidence_threshold {defaults.CONFIDENCE_THRESHOLD}"
                   + ("" if sklearn else " (not adapted: scikit-learn is not installed)")},
        "calibrations": calibrations, "observations": observations,
    }
    if "draft_from" in pair.info:  # a candidate draft (drafts.with_draft): name it, and its own hash
        record["draft"] = {"from": pair.info["draft_from"], "sha256": pair.info["draft_sha256"],
                           "base_pair_sha256": pair.info.get("base_pair_sha256")}
    record["results"] = analyse(record)
    return record


def bench_peer_runs(pair, settings: Optional[PeerSettings] = None, *, runs: int, progress: bool = True,
                    **overrides) -> dict:
    """Return a record of ``runs`` independent races of :func:`bench_peer` with the same settings, one after
    another, each warmed up and timed afresh and kept whole (its environment, calibrations, observations)
    in the record's ``runs`` list; the summary gives each run's row and the range over the runs of this
    engine's speed over transformers' (:func:`_independent_runs`)."""
    return _independent_runs(lambda: bench_peer(pair, settings, progress=progress, **overrides), runs,
                             ("environment", "calibrations", "observations"))


def race_public_pair(target: str, draft: str, device: str = "cuda", dtype=torch.bfloat16,
                     prompts=(), gammas=(2, 4, 6), max_new_tokens: int = 128, repeats: int = 1,
                     calibration_repeats: int = defaults.BENCH_DECODE["calibration_repeats"],
                     progress: bool = False) -> dict:
    """Load ``target`` and ``draft`` with :func:`hf.load_pair` and return two records measured on them:
    ``decode`` (:func:`bench_decode`: plain vs this engine at each gamma, T = 0 and 1, batch 1) and
    ``peer`` (:func:`bench_peer`: this engine at the middle gamma vs transformers' assisted generation,
    default and fixed schedules). What chapter 08 runs for GPU readers; tested offline on tiny
    checkpoints."""
    loaded = load_pair(target, draft, prompts, device=device, dtype=dtype)
    count = len(loaded.prompts)
    decode = bench_decode(loaded, gammas=tuple(gammas), temperatures=(0.0, 1.0), batches=(1,),
                          max_new_tokens=max_new_tokens, repeats=repeats, prompts=count,
                          calibration_repeats=calibration_repeats, progress=progress)
    peer = bench_peer(loaded, gamma=sorted(gammas)[len(gammas) // 2], prompts=count, max_new_tokens=max_new_tokens,
                      repeats=repeats, calibration_repeats=calibration_repeats, progress=progress)
    return {"decode": decode, "peer": peer}
