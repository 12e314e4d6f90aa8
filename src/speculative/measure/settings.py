"""The benchmarks' settings: what each one runs, with its defaults and the checks that refuse a bad value.

Settings travel as frozen dataclasses (:class:`SamplerSettings` for ``bench sampler``, :class:`DecodeSettings`
for ``bench decode`` and ``bench drafts``, :class:`PeerSettings` for ``bench peer``; the last two share
:class:`RunSettings`) whose defaults come from :mod:`speculative.defaults` and which check themselves when
built, so a bad value fails before any run. Defaults and checks live here only. Each field carries a short
help text in its metadata (``dataclasses.fields(cls)[i].metadata["help"]``), what the command line shows.

Importing this module loads neither torch nor the analysis: the checks that need them import them when a
settings object is built.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from speculative import defaults
from speculative.defaults import setting
from speculative.engine.policy import POLICIES

__all__ = ["SamplerSettings", "RunSettings", "DecodeSettings", "PeerSettings", "DraftsSettings", "PricesSettings",
           "split_policy"]


def _positive_ints(name: str, values, allow_empty: bool = False) -> tuple:
    values = tuple(values)
    if (not values and not allow_empty) or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                               for v in values):
        raise ValueError(f"{name} must be integers >= 1, got {list(values)}")
    _distinct(name, values)
    return values


def _distinct(name: str, values) -> None:
    """A value listed twice would be measured twice and pooled by the analysis as one point: refuse it."""
    if len(set(values)) != len(values):
        raise ValueError(f"{name} must each be listed once, got {list(values)}")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _set(settings, **values) -> None:
    for name, value in values.items():
        object.__setattr__(settings, name, value)


def _settings(cls, settings, overrides: dict):
    """``settings`` (or the defaults) with ``overrides`` applied; an unknown name is a ValueError."""
    unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(sorted(unknown))}")
    return dataclasses.replace(settings or cls(), **overrides)


# ---------------------------------------------------------------- the sampler benchmark

@dataclass(frozen=True)
class SamplerSettings:
    """What ``bench sampler`` runs: batch sizes, vocabularies, drafted tokens per row, timed repeats, seed."""

    batches: tuple = setting(defaults.BENCH_SAMPLER["batches"], "batch sizes", flag="--batch", metavar="B[,B...]")
    vocabs: tuple = setting(defaults.BENCH_SAMPLER["vocabs"], "vocabularies", flag="--vocab", metavar="V[,V...]")
    k: int = setting(defaults.BENCH_SAMPLER["k"], "drafted tokens per row")
    repeats: int = setting(defaults.BENCH_SAMPLER["repeats"], "timed runs per point, after a warm-up")
    seed: int = setting(defaults.BENCH_SAMPLER["seed"], "seed of the inputs and the uniforms")
    device: str = setting("cpu", "cpu or cuda[:N]")

    def __post_init__(self):
        _set(self, batches=_positive_ints("batches", self.batches), vocabs=_positive_ints("vocabs", self.vocabs))
        _positive_int("k", self.k), _positive_int("repeats", self.repeats)
        # lazy: engine.pair loads torch, which this module leaves to whoever builds settings
        from speculative.engine.pair import check_device

        check_device(self.device)


@dataclass(frozen=True)
class PricesSettings:
    """What ``bench prices`` times: draft shapes (random weights), the target's widths (positions per
    forward), interleaved rounds (defaults: :data:`defaults.BENCH_PRICES`)."""

    shapes: tuple = setting(defaults.BENCH_PRICES["shapes"], "draft shapes: layers x width (heads: width / 64)",
                            metavar="LxW[,LxW...]", parse="shape")
    widths: tuple = setting(defaults.BENCH_PRICES["widths"], "target widths: positions per forward (a "
                            "verification of gamma drafts has gamma + 1)", metavar="W[,W...]")
    repeats: int = setting(defaults.BENCH_PRICES["repeats"], "interleaved rounds (medians kept)")

    def __post_init__(self):
        _set(self, widths=_positive_ints("widths", self.widths), shapes=tuple(self.shapes))
        _positive_int("repeats", self.repeats)
        if not self.shapes or len({tuple(sorted(s.items())) for s in self.shapes}) != len(self.shapes):
            raise ValueError(f"shapes must each be listed once, got {list(self.shapes)}")


# ---------------------------------------------------------------- plain vs speculative decoding

@dataclass(frozen=True)
class RunSettings:
    """What both decoding benchmarks fix: held-out prompts decoded, new tokens per row, timed repeats, seed,
    and the rounds of :func:`calibration.calibrate_steps` behind a cost model (defaults:
    :data:`defaults.BENCH_DECODE`, shared by ``bench peer``). The help texts are ``bench decode``'s;
    :class:`PeerSettings` words some of them for its race."""

    prompts: int = setting(defaults.BENCH_DECODE["prompts"],
                          "held-out prompts decoded per point, in groups of the batch size")
    max_new_tokens: int = setting(defaults.BENCH_DECODE["max_new_tokens"], "tokens generated per row")
    repeats: int = setting(defaults.BENCH_DECODE["repeats"], "timed runs per point, after a warm-up")
    seed: int = setting(defaults.BENCH_DECODE["seed"], "seed of the sampling generators")
    calibration_repeats: int = setting(defaults.BENCH_DECODE["calibration_repeats"],
                                      "rounds of the step timings the cost model is calibrated from (medians kept)")

    def __post_init__(self):
        for name in ("prompts", "max_new_tokens", "repeats", "calibration_repeats"):
            _positive_int(name, getattr(self, name))


@dataclass(frozen=True)
class DecodeSettings(RunSettings):
    """What ``bench decode`` runs (defaults: :data:`defaults.BENCH_DECODE`).

    ``gammas`` are draft lengths, or ``"auto"`` (the cost-model policy, calibrated at every length up to
    :data:`defaults.AUTO_MAX_GAMMA`); ``rules`` the verification rules ("token", "block"); ``drafts``
    above 1 adds multi-draft decoding with that many chains per block, the root drawn by ``scheme``.
    """

    gammas: tuple = setting(defaults.BENCH_DECODE["gammas"],
                           "draft lengths; auto = chosen per block by the calibrated cost model",
                           flag="--gamma", metavar="G[,G...]", words=("auto",))
    temperatures: tuple = setting(defaults.BENCH_DECODE["temperatures"], "temperatures, 0 = greedy",
                                 flag="--temperature", metavar="T[,T...]")
    batches: tuple = setting(defaults.BENCH_DECODE["batches"], "batch sizes", flag="--batch", metavar="B[,B...]")
    # None: all tokens kept
    top_k: Optional[int] = setting(None, "keep the k likeliest tokens (both models)")
    top_p: Optional[float] = setting(None, "keep the smallest head of mass >= p (both models)")
    rules: tuple = setting(defaults.BENCH_DECODE["rules"],
                          "verification rules, side by side: token (token-wise), block (block verification)",
                          flag="--rule", metavar="R[,R...]")
    drafts: tuple = setting(defaults.BENCH_DECODE["drafts"],
                           "draft chains per block; K > 1 runs multi-draft decoding (batch 1, token-wise chains)",
                           metavar="K[,K...]")
    scheme: str = setting(defaults.BENCH_DECODE["scheme"], "how the K chains' first tokens are drawn",
                         choices=("with_replacement", "without_replacement", "top_k"))

    def __post_init__(self):
        # lazy: the sampler loads torch, which this module leaves to whoever builds settings
        from speculative.sampling.sampler import _check_scheme, rule_sampler

        super().__post_init__()

        gammas = tuple(self.gammas)
        fixed = [g for g in gammas if g != "auto"]
        if not gammas or any(isinstance(g, bool) or not isinstance(g, int) for g in fixed) \
                or len(set(gammas)) != len(gammas):
            raise ValueError(f"gammas must be distinct integers >= 1 or 'auto', got {list(gammas)}")
        _positive_ints("gammas", fixed, allow_empty=True)
        rules = tuple(self.rules)
        for rule in rules:
            rule_sampler(rule)  # an unknown rule fails here, before any run
        if not rules or len(set(rules)) != len(rules):
            raise ValueError(f"rules must name each verification rule once, got {list(rules)}")
        drafts = tuple(sorted(set(self.drafts)))
        if not drafts or min(drafts) < 1:
            raise ValueError(f"drafts (chains per block) must be integers >= 1, got {list(self.drafts)}")
        _check_scheme(self.scheme)
        temperatures = tuple(self.temperatures)
        if not temperatures or not all(0 <= t < math.inf for t in temperatures):
            raise ValueError(f"temperatures must be finite numbers >= 0, got {list(temperatures)}")
        _distinct("temperatures", temperatures)
        if self.top_k is not None:
            _positive_int("top_k", self.top_k)
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        batches = _positive_ints("batch sizes", self.batches)
        if max(drafts) > 1 and max(batches) > 1:
            raise ValueError("multi-draft decoding runs one prompt at a time (its chains are the batch): use batch 1")
        if max(batches) > self.prompts:
            raise ValueError(f"batch {max(batches)} needs more prompts than the {self.prompts} decoded per point "
                             "(--prompts)")
        if any(self.prompts % b for b in batches):
            raise ValueError(f"the number of prompts ({self.prompts}) must be a multiple of every batch size "
                             f"{list(batches)}")
        _set(self, gammas=gammas, rules=rules, drafts=drafts, temperatures=temperatures, batches=batches)

    @property
    def fixed(self) -> list:
        return [g for g in self.gammas if g != "auto"]

    def variants(self) -> list[tuple]:
        # lazy: the analysis loads numpy and scipy, which a command line that only parses does not need
        from speculative.measure.analysis_decode import decode_variants

        return decode_variants(dataclasses.asdict(self))

    def check_pair(self, pair) -> None:
        """Raise a ValueError, before any run, if ``pair`` cannot run these settings."""
        # lazy: the model and the decoding loop load torch
        from speculative.engine.decode import check_room, encode_prompts
        from speculative.engine.model import GPT

        if max(self.drafts) > 1 and not isinstance(pair.target, GPT):
            raise ValueError("multi-draft decoding runs the library's GPT only, not wrapped transformers models")
        if self.prompts > len(pair.prompts):
            raise ValueError(f"{self.prompts} prompts asked for, but the pair ships {len(pair.prompts)}")
        longest_block = max(self.fixed + ([defaults.AUTO_MAX_GAMMA] if "auto" in self.gammas else []), default=1)
        rows = encode_prompts(pair.prompts[:self.prompts], pair.target.config.vocab_size)
        for model in (pair.target, pair.draft):  # the longest run first: fail now, not after an hour
            check_room(model, rows, self.max_new_tokens, lookahead=longest_block + 2)


# ---------------------------------------------------------------- this engine against transformers

def split_policy(name: str) -> tuple[str, str]:
    """Return (policy, verification rule) of a raced policy's name: ``auto`` -> (auto, token), ``auto+block``
    -> (auto, block). The token-wise rule is the default and is never spelled out, so each decoder has one
    name."""
    if not isinstance(name, str):
        raise ValueError(f"a policy name must be a string, got {name!r}")
    base, plus, rule = name.partition("+")
    if plus and rule != "block":
        raise ValueError(f"unknown verification rule {rule!r} in policy {name!r}; the only suffix is +block")
    return base, rule or "token"


@dataclass(frozen=True)
class PeerSettings(RunSettings):
    """What ``bench peer`` races (defaults: :data:`defaults.BENCH_PEER`): temperatures, this engine's fixed
    draft length (and the fixed schedule's), transformers' schedules, this engine's draft-length policies
    (``name`` or ``name+block``); prompts, new tokens, timed rounds and seed as :class:`RunSettings` (the
    fields below that repeat one of its names keep its default and place, and word its help for the race)."""

    prompts: int = setting(RunSettings.prompts, "held-out prompts, each decoded by every decoder")
    max_new_tokens: int = setting(RunSettings.max_new_tokens, "tokens generated per prompt")
    repeats: int = setting(RunSettings.repeats, "timed rounds over the prompts, after a warm-up")
    calibration_repeats: int = setting(RunSettings.calibration_repeats,
                                      "rounds of the step timings the auto policy is calibrated from (medians kept)")
    temperatures: tuple = setting(defaults.BENCH_PEER["temperatures"], "temperatures, 0 = greedy",
                                 flag="--temperature", metavar="T[,T...]")
    gamma: int = setting(defaults.BENCH_PEER["gamma"], "this engine's draft length, and the fixed schedule's")
    schedules: tuple = setting(defaults.BENCH_PEER["schedules"],
                              "transformers' draft-length schedules: default, fixed, heuristic", metavar="S[,S...]")
    policies: tuple = setting(defaults.BENCH_PEER["policies"],
                             "this engine's draft-length policies: fixed (at --gamma), heuristic, confidence, auto; "
                             "name+block verifies by block verification (e.g. auto+block)", metavar="P[,P...]")

    def __post_init__(self):
        # lazy: engine.hf loads torch, which this module leaves to whoever builds settings
        from speculative.engine.hf import HF_SCHEDULES

        super().__post_init__()

        policies, schedules, temperatures = tuple(self.policies), tuple(self.schedules), tuple(self.temperatures)
        if not policies or len({split_policy(p) for p in policies}) != len(policies) or any(
                split_policy(p)[0] not in POLICIES for p in policies):
            raise ValueError(f"policies must be distinct names among {', '.join(POLICIES)}, each optionally with "
                             f"+block, got {list(policies)}")
        _positive_int("gamma", self.gamma)
        if not temperatures or any(t < 0 for t in temperatures):
            raise ValueError(f"temperatures must be >= 0, got {list(temperatures)}")
        _distinct("temperatures", temperatures)
        _distinct("schedules", schedules)
        if not schedules or any(s not in HF_SCHEDULES for s in schedules):
            raise ValueError(f"schedules must be among {', '.join(HF_SCHEDULES)}, got {list(schedules)}")
        _set(self, policies=policies, schedules=schedules, temperatures=temperatures)


@dataclass(frozen=True)
class DraftsSettings(DecodeSettings):
    """What ``bench drafts`` races: :class:`DecodeSettings` at batch 1, with the defaults of
    :data:`defaults.BENCH_DRAFTS` (a race of drafts needs fewer lengths and repeats than a sweep)."""

    repeats: int = setting(defaults.BENCH_DRAFTS["repeats"], "timed rounds per run")
    gammas: tuple = setting(defaults.BENCH_DRAFTS["gammas"], "draft lengths", flag="--gamma", metavar="G[,G...]")
    temperatures: tuple = setting(defaults.BENCH_DRAFTS["temperatures"], "temperatures, 0 = greedy",
                                 flag="--temperature", metavar="T[,T...]")
    batches: tuple = (1,)
