"""Draft-length policies: how many tokens to draft in the next block, chosen on the fly.

Explained in: notebooks/07_cost_model (choosing gamma on the fly: the proof, the counterexample, the race).

A policy may look only at the past: the outcomes of earlier blocks (how many drafts each accepted) and,
within a block, the draft's own tokens and probabilities. Then the emitted tokens keep the target's law
whatever the policy does (``exact.adaptive_sequence_law`` proves it by enumeration; chapter 07 gives the
argument). A policy that looks at the target's probabilities of the drafts before deciding what to
verify breaks it (``pitfalls`` entry "peek_target_length").

A policy is plain Python, one row at a time, so that the same object drives both the engine
(``decode.speculative_decode(..., gamma=policy)``, which keeps one state per row) and the exact
enumeration (``exact.adaptive_sequence_law``). Its state is a value the policy returns and is handed
back, never mutated in place:

- ``start()``: the state of a row before its first block;
- ``length(state)``: how many tokens to draft in the next block, 1 .. ``max_gamma``;
- ``stop_after(q)``: True to stop drafting right after a token the draft gave probability ``q`` (the
  token is kept); works on floats, Fractions and tensors alike;
- ``update(state, accepted, full)``: the state after a block that accepted ``accepted`` drafts, all of
  them when ``full``;
- ``batch_length(states)``: the length of a block that several rows share (the engine's default for a
  batch: every row verifies all of it, since the batch computes the longest row's drafts anyway); the
  longest any row asks for, unless the policy knows better (the cost model maximises the batch's expected
  tokens per unit of time).

Nothing else reaches a policy: not the target's probabilities, not the verification's uniforms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

from speculative import defaults

__all__ = ["DraftPolicy", "FixedLength", "HeuristicSchedule", "ConfidenceStop", "CostModelPolicy",
           "POLICIES", "make_policy", "expected_tokens", "isotonic"]


class DraftPolicy:
    """The interface (see the module docstring). ``max_gamma`` bounds every block's drafts."""

    name = "policy"
    max_gamma: int = 1

    def start(self):
        return None

    def length(self, state) -> int:
        raise NotImplementedError

    def stop_after(self, q):
        return q != q  # never (False, or an all-False tensor; NaN never occurs in a probability)

    def update(self, state, accepted: int, full: bool):
        return state

    def batch_length(self, states: list) -> int:
        return max(self.length(state) for state in states)

    def describe(self) -> str:
        return self.name


def _check_length(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


@dataclass
class FixedLength(DraftPolicy):
    """Always ``gamma`` drafts: the fixed schedule, as a policy."""

    gamma: int
    name: str = "fixed"

    def __post_init__(self):
        self.max_gamma = _check_length("gamma", self.gamma)

    def length(self, state) -> int:
        return self.gamma

    def describe(self) -> str:
        return f"fixed {self.gamma}"


@dataclass
class HeuristicSchedule(DraftPolicy):
    """transformers' "heuristic" schedule: start at ``start_gamma``; after a block whose drafts were all
    accepted draft 2 more, otherwise 1 fewer (never below 1); capped at ``max_gamma`` here (transformers
    caps only by the remaining length)."""

    start_gamma: int = 4
    max_gamma: int = 16
    name: str = "heuristic"

    def __post_init__(self):
        _check_length("start_gamma", self.start_gamma)
        _check_length("max_gamma", self.max_gamma)
        if self.start_gamma > self.max_gamma:
            raise ValueError(f"start_gamma ({self.start_gamma}) exceeds max_gamma ({self.max_gamma})")

    def start(self):
        return self.start_gamma

    def length(self, state) -> int:
        return state

    def update(self, state, accepted: int, full: bool):
        return min(self.max_gamma, state + 2) if full else max(1, state - 1)

    def describe(self) -> str:
        return f"heuristic (start {self.start_gamma}, at most {self.max_gamma})"


@dataclass
class ConfidenceStop(DraftPolicy):
    """Draft up to ``max_gamma`` tokens, stopping right after a token the draft gave probability below
    ``threshold`` (transformers' assistant confidence threshold, without its adaptation). The engine
    hands it the draft's probability of the token under q, or under the draft's softmax at temperature
    1 when decoding greedily (q is then one-hot), as transformers does."""

    threshold: float = defaults.CONFIDENCE_THRESHOLD
    max_gamma: int = 16
    name: str = "confidence"

    def __post_init__(self):
        _check_length("max_gamma", self.max_gamma)
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold!r}")

    def length(self, state) -> int:
        return self.max_gamma

    def stop_after(self, q):
        return q < self.threshold

    def describe(self) -> str:
        return f"confidence (threshold {self.threshold:g}, at most {self.max_gamma})"


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens per block when each draft is accepted independently with probability ``alpha``:
    (1 - alpha^(gamma + 1)) / (1 - alpha), and gamma + 1 at alpha = 1 (Leviathan et al.)."""
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


@dataclass
class CostModelPolicy(DraftPolicy):
    """Chapter 07's cost model, per row, on the fly: pick the next block's length k maximising expected
    tokens per unit of time, ``expected_tokens(alpha, k) / (k c + v(k))``.

    ``c`` is a draft step and ``v[k]`` a verification over k + 1 positions, both in plain steps (as
    ``calibration.calibrate_steps`` measures them; a k missing from ``v`` is interpolated linearly, and held
    flat past the last). A verification over more positions does not cost less, but timings on a shared
    machine can say it does (a calibration here once gave v(1) = 1.50 and v(4) = 1.38); the policy would
    then chase the noise and favour the falsely cheap length. So the given costs are replaced by their
    non-decreasing least-squares fit (isotonic regression, pool-adjacent-violators) before use, raised
    to at least ``v_floor`` (a verification does not cost less than the plain step it is priced in: one
    run here timed v = 0.79 and drafted the shortest block throughout), and the fit is kept in
    ``v_fitted``. alpha is the row's running acceptance rate: accepted / tested drafts,
    with each earlier block's counts discounted by ``decay`` and a prior of ``prior_weight`` tested
    drafts at ``prior_alpha``. The state is (accepted, tested), discounted. Under block verification the
    same counts are taken from each block's outcome; there a draft's acceptance is not an independent
    event, so the estimate is a heuristic plug-in, not the rule's expected tokens.
    """

    c: float
    v: Mapping[int, float]
    max_gamma: int = 8
    prior_alpha: float = 0.7
    prior_weight: float = 4.0
    decay: float = 0.9
    v_floor: float = defaults.AUTO_V_FLOOR
    name: str = "auto"
    _costs: list = field(init=False, repr=False)
    v_fitted: dict = field(init=False, repr=False)

    def __post_init__(self):
        _check_length("max_gamma", self.max_gamma)
        if not (self.c >= 0 and math.isfinite(self.c)):
            raise ValueError(f"c must be a finite number >= 0, got {self.c!r}")
        known = sorted((int(k), float(value)) for k, value in dict(self.v).items())
        if not known or any(not (value > 0 and math.isfinite(value)) for _, value in known):
            raise ValueError(f"v must map draft lengths to positive costs, got {dict(self.v)!r}")
        if not (0 <= self.prior_alpha <= 1 and self.prior_weight > 0 and 0 < self.decay <= 1):
            raise ValueError("need 0 <= prior_alpha <= 1, prior_weight > 0 and 0 < decay <= 1")
        if not (self.v_floor >= 0 and math.isfinite(self.v_floor)):
            raise ValueError(f"v_floor must be a finite number >= 0, got {self.v_floor!r}")
        fitted = isotonic([value for _, value in known])
        known = [(k, max(self.v_floor, value)) for (k, _), value in zip(known, fitted)]
        self.v_fitted = dict(known)
        self._costs = [k * self.c + _interpolate(known, k) for k in range(1, self.max_gamma + 1)]

    def start(self):
        return (0.0, 0.0)

    def alpha(self, state) -> float:
        accepted, tested = state
        return (accepted + self.prior_alpha * self.prior_weight) / (tested + self.prior_weight)

    def length(self, state) -> int:
        return self.batch_length([state])

    def batch_length(self, states: list) -> int:
        """The length k maximising the rows' summed expected tokens per unit of time, sum_r E_r(k) / (k c +
        v(k)): the rows of a batch share the block and its cost (for one row, :meth:`length`)."""
        alphas = [self.alpha(state) for state in states]
        rates = [sum(expected_tokens(a, k) for a in alphas) / cost for k, cost in enumerate(self._costs, start=1)]
        return 1 + max(range(len(rates)), key=rates.__getitem__)

    def update(self, state, accepted: int, full: bool):
        tested = accepted + (0 if full else 1)  # a rejected draft was tested too
        return (self.decay * state[0] + accepted, self.decay * state[1] + tested)

    def describe(self) -> str:
        return f"auto (cost model, at most {self.max_gamma})"


def isotonic(values: list) -> list:
    """Return the non-decreasing sequence nearest ``values`` in least squares (SciPy's pool adjacent
    violators, :func:`scipy.optimize.isotonic_regression`)."""
    from scipy.optimize import isotonic_regression

    return [float(value) for value in isotonic_regression([float(v) for v in values]).x]


def _interpolate(known: list, k: int) -> float:
    if k <= known[0][0]:
        return known[0][1]
    for (k0, v0), (k1, v1) in zip(known, known[1:]):
        if k0 <= k <= k1:
            return v0 + (v1 - v0) * (k - k0) / (k1 - k0)
    return known[-1][1]


#: The policies the engine ships, by the name the command line and the records use.
POLICIES = ("fixed", "heuristic", "confidence", "auto")


def make_policy(name: str, gamma: int = 4, calibration: Optional[dict] = None, max_gamma: int = 8,
                v_floor: float = defaults.AUTO_V_FLOOR) -> DraftPolicy:
    """Return the policy called ``name`` (:data:`POLICIES`): ``fixed`` at ``gamma``, ``heuristic`` starting
    at ``gamma``, ``confidence`` at transformers' default threshold, ``auto`` from ``calibration`` (a
    ``calibration.calibrate_steps`` result, with ``c`` and ``v`` per gamma, its fitted v at least
    ``v_floor``); each drafts at most ``max_gamma``."""
    if name == "fixed":
        return FixedLength(gamma)
    if name == "heuristic":
        return HeuristicSchedule(start_gamma=min(gamma, max_gamma), max_gamma=max_gamma)
    if name == "confidence":
        return ConfidenceStop(threshold=defaults.CONFIDENCE_THRESHOLD, max_gamma=max_gamma)
    if name == "auto":
        if calibration is None:
            raise ValueError("the auto policy needs a calibration (c and v per gamma, from "
                             "calibration.calibrate_steps)")
        return CostModelPolicy(c=calibration["c"], v=calibration["v"], max_gamma=max_gamma, v_floor=v_floor)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
