"""Summary rows: the schema of a record's ``results``, as code, and the check of a row read back against it.

Each kind of record (its ``benchmark`` field) has one row type here, a frozen dataclass whose fields are
the keys of that record's summary rows, in the order they are written: the analysis builds every row as one
of these and writes it with :func:`row_dict`, and :func:`row_problem` checks a row read from disk against
its type (every required field, no other, each value of its type). A field whose default is
:data:`ABSENT` is left out of the rows it does not apply to (``block_lengths`` only where the cost-model
policy chose the lengths, say). A record of several runs (``bench decode --runs N``) has one row of its
kind's ``*RunsRow`` per configuration, each run's own row under ``runs``.
"""

import dataclasses
import types
from dataclasses import dataclass, field
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

__all__ = ["ABSENT", "row_dict", "row_problem", "SamplerRow", "SyncsRow", "DecodeRow", "DraftsRow", "PeerRow",
           "PricesRow", "AgreementRow", "DecodeRunsRow", "DraftsRunsRow", "PeerRunsRow"]


class _Absent:
    """The value of a field a row leaves out: :func:`row_dict` writes no key for it."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __deepcopy__(self, memo) -> "_Absent":  # dataclasses.asdict deep-copies values: keep the one sentinel
        return self


#: the default of a field that some rows of its type leave out
ABSENT: Any = _Absent()
#: lists of counts and of figures, and a 95% interval [low, high] (a float field also takes a whole number)
Ints, Floats, Interval = list[int], list[float], list[float]


def row_dict(row) -> dict:
    """Return a row as the dict a record holds: :func:`dataclasses.asdict` in field order, absent fields left out."""
    return dataclasses.asdict(row, dict_factory=lambda items: {k: v for k, v in items if v is not ABSENT})


# ---------------------------------------------------------------- the row of each kind of record

@dataclass(frozen=True, kw_only=True)
class SamplerRow:
    """``bench sampler``: per (batch, vocabulary), the batched and the reference sampler's verified positions per
    second (median of interleaved runs) and each one's ``timings`` (median, min, max seconds, repeats)."""
    batch: int
    k: int
    vocab: int
    batched_positions_per_s: float
    reference_positions_per_s: float
    speedup: float
    timings: dict[str, dict]


@dataclass(frozen=True, kw_only=True)
class SyncsRow:
    """The GPU report's sync count: per (batch, temperature), the CUDA syncs (None on a CPU) and the host reads
    per block (target call)."""
    batch: int
    temperature: float
    gamma: int
    blocks: int
    cuda_syncs_per_block: Optional[float]
    host_reads_per_block: float


@dataclass(frozen=True, kw_only=True)
class DecodeRow:
    """``bench decode``: one speculative decoder (gamma, rule, drafts) against plain decoding at one (batch,
    temperature): the speedup (plain / speculative decode-phase seconds, pooled, with its interval over groups
    of prompts), the calibrated prediction and its efficiency, the in-situ decomposition (``c``, ``v``), and
    what the blocks accepted."""
    batch: int
    temperature: float
    gamma: Union[int, str]  # "auto": the cost-model policy chose each block's length
    rule: str
    drafts: int
    prompts: int
    groups: int
    repeats: int
    speedup: float
    speedup_ci95: Interval
    speedup_median: float
    speedup_per_group: Floats
    speedup_per_repeat: Floats
    predicted: float  # tokens per target call / (gamma c + v), from the steps' calibration
    efficiency: float  # speedup / predicted
    predicted_decoded: float = ABSENT  # from whole decoded blocks (a calibration that decoded held-out prompts)
    efficiency_decoded: float = ABSENT
    calibration: dict  # c, v, v_alone, v_from_alone (and v_fitted, for "auto")
    mean_gamma: float
    block_lengths: dict[Any, int] = ABSENT  # "auto": how many blocks drafted each length
    alpha: float
    tokens_per_target_forward: float
    tokens_per_active_block: float
    tokens_per_target_forward_per_group: Floats
    speculative_seconds_per_group: Floats
    target_calls_per_group: Ints
    plain_tokens_per_s: float
    speculative_tokens_per_s: float
    predicted_leviathan: float  # the i.i.d. cost model, verification priced as one plain step
    c: float  # in situ: the run's own forward timings, relative to a plain target call
    v: float
    decomposed_speedup: float
    in_situ_share: float
    plain_seconds: float
    speculative_seconds: float
    plain_forward_seconds: float
    speculative_forward_seconds: float
    plain_prefill_seconds: float
    speculative_prefill_seconds: float
    c_isolated: float  # the forwards timed alone, back to back
    v_isolated: Optional[float]
    forward_costs_s: dict[str, float]
    calibration_s: dict[str, float]
    repeat_share_median: float
    accepted_per_block: list[Ints]  # per prompt of the first repeat: accepted drafts per block, -1 once done


#: ``bench drafts``: a decode row per raced draft, named first
DraftsRow = dataclasses.make_dataclass(
    "DraftsRow", [("draft", str)] + [(f.name, f.type, field(default=f.default)) for f in dataclasses.fields(DecodeRow)],
    frozen=True, kw_only=True)
DraftsRow.__doc__ = "``bench drafts``: the :class:`DecodeRow` of one raced draft, its name first."


@dataclass(frozen=True, kw_only=True)
class PeerRow:
    """``bench peer``: this engine under one policy against transformers' assisted generation under one
    schedule, at one temperature: tokens per second of each decoder (whole calls), their ratios paired by
    prompt, acceptance and tokens per call; ``ours_on_hf_models*`` where the race also ran this engine on the
    exported models, and ``greedy_outputs_equal`` at temperature 0."""
    temperature: float
    batch: int
    policy: str
    rule: str
    gamma: int
    policy_described: str
    calibration: dict = ABSENT  # the cost-model policy's: rule, c, v, v_fitted, v_from_alone
    hf_schedule: str
    prompts: int
    repeats: int
    max_new_tokens: int
    ours_tokens_per_s: float
    ours_tokens_per_s_ci95: Interval
    ours_plain_tokens_per_s: float
    ours_plain_tokens_per_s_ci95: Interval
    hf_plain_tokens_per_s: float
    hf_plain_tokens_per_s_ci95: Interval
    ours_on_hf_models_tokens_per_s: float = ABSENT
    ours_on_hf_models_tokens_per_s_ci95: Interval = ABSENT
    hf_assisted_tokens_per_s: float
    hf_assisted_tokens_per_s_ci95: Interval
    ours_over_hf_assisted: float
    ours_over_hf_assisted_ci95: Interval
    ours_speedup: float
    ours_speedup_ci95: Interval
    hf_assisted_speedup: float
    hf_assisted_speedup_ci95: Interval
    ours_acceptance: float
    ours_acceptance_ci95: Interval
    ours_tokens_per_call: float
    ours_tokens_per_call_ci95: Interval
    ours_drafts_per_call: float
    hf_acceptance: float
    hf_acceptance_ci95: Interval
    hf_tokens_per_call: float
    hf_tokens_per_call_ci95: Interval
    hf_drafts_per_call: float
    ours_on_hf_models_acceptance: float = ABSENT
    ours_on_hf_models_acceptance_ci95: Interval = ABSENT
    ours_on_hf_models_tokens_per_call: float = ABSENT
    ours_on_hf_models_tokens_per_call_ci95: Interval = ABSENT
    ours_on_hf_models_drafts_per_call: float = ABSENT
    seconds_per_prompt: dict[str, Floats]
    ours_on_hf_models_over_hf_assisted: float = ABSENT
    ours_on_hf_models_over_hf_assisted_ci95: Interval = ABSENT
    ours_on_hf_models_over_ours_fixed: float = ABSENT
    ours_on_hf_models_over_ours_fixed_ci95: Interval = ABSENT
    greedy_outputs_equal: dict[str, bool] = ABSENT


@dataclass(frozen=True, kw_only=True)
class PricesRow:
    """``prices``: one forward timed alone, its median seconds and its cost relative to the target's one-position
    forward (ratio of medians, and its range over the rounds): a target ``width``, or a draft ``shape``."""
    kind: str  # "verification" (a target width) or "draft" (a draft shape)
    seconds: float
    relative: float
    relative_range: Interval
    width: int = ABSENT
    shape: str = ABSENT
    parameters: int = ABSENT


@dataclass(frozen=True, kw_only=True)
class AgreementRow:
    """``agreement``: per draft and temperature, the mean exact acceptance rate over held-out contexts, with its
    95% bootstrap interval over contexts."""
    draft: str
    temperature: float
    contexts: int
    alpha: float
    alpha_ci95: Interval


# ---------------------------------------------------------------- records of several runs

@dataclass(frozen=True, kw_only=True)
class DecodeRunsRow:
    """``bench decode --runs N``: one configuration, each run's :class:`DecodeRow`, and the runs' speedups."""
    batch: int
    temperature: float
    gamma: Union[int, str]
    rule: str
    drafts: int
    runs: list[DecodeRow]
    speedup_runs: Floats
    speedup_range: Interval
    speedup_median_run: float


@dataclass(frozen=True, kw_only=True)
class DraftsRunsRow:
    """``bench drafts`` over several runs: one draft and configuration, each run's row, and the runs' speedups."""
    draft: str
    batch: int
    temperature: float
    gamma: Union[int, str]
    rule: str
    drafts: int
    runs: list[DraftsRow]
    speedup_runs: Floats
    speedup_range: Interval
    speedup_median_run: float


@dataclass(frozen=True, kw_only=True)
class PeerRunsRow:
    """``bench peer --runs N``: one (temperature, schedule, policy), each run's :class:`PeerRow`, and over the
    runs this engine's speed over transformers' assisted generation and over its own plain decoding."""
    batch: int
    temperature: float
    gamma: int
    rule: str
    policy: str
    hf_schedule: str
    runs: list[PeerRow]
    ours_over_hf_assisted_runs: Floats
    ours_over_hf_assisted_range: Interval
    ours_over_hf_assisted_median_run: float
    ours_speedup_runs: Floats
    ours_speedup_range: Interval
    ours_speedup_median_run: float


# ---------------------------------------------------------------- checking a row read back

def _type_name(hint) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _value_problem(value, hint, where: str) -> Optional[str]:
    """What is wrong with ``value`` as a ``hint`` (None when nothing): numbers, strings, lists and dicts of
    them, unions, and rows of a row type."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return None
    if origin in (Union, types.UnionType):
        fits = any(_value_problem(value, h, where) is None for h in args)
        return None if fits else f"{where} is {value!r:.40}, not {' or '.join(map(_type_name, args))}"
    if dataclasses.is_dataclass(hint):
        return row_problem(hint, value, where)
    if origin in (list, dict):
        if not isinstance(value, origin):
            return f"{where} is {type(value).__name__}, not a {origin.__name__}"
        items = enumerate(value) if origin is list else value.items()
        inner = args[0] if origin is list else args[1]
        return next((p for key, v in items if (p := _value_problem(v, inner, f"{where}[{key!r}]"))), None)
    if hint is float:
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is int:
        fits = isinstance(value, int) and not isinstance(value, bool)
    else:
        fits = isinstance(value, hint)
    return None if fits else f"{where} is {type(value).__name__} {value!r:.40}, not {_type_name(hint)}"


def row_problem(row_type, row, where: str = "the row") -> Optional[str]:
    """Return what makes ``row`` (a dict read from JSON) not a row of ``row_type``, in one line naming the row
    (``where``) and the field, or None: a required field missing, a field the type has not, or a value of
    another type."""
    if not isinstance(row, dict):
        return f"{where} is {type(row).__name__}, not a {row_type.__name__} object"
    fields = dataclasses.fields(row_type)
    missing = [f.name for f in fields if f.default is not ABSENT and f.name not in row]
    if missing:
        return f"{where} lacks {', '.join(map(repr, missing))} (a {row_type.__name__})"
    extra = [key for key in row if key not in {f.name for f in fields}]
    if extra:
        return f"{where} has {', '.join(map(repr, extra))}, not a field of {row_type.__name__}"
    hints = get_type_hints(row_type)
    return next((p for key, value in row.items() if (p := _value_problem(value, hints[key], f"{where}.{key}"))),
                None)
