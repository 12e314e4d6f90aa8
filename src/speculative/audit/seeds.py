"""Seeds: what a seed promises beyond the law, checked request by request.

Explained in: notebooks/13_audit_serving (Seeds).

The law test over many seeds cannot see a seed that is ignored, or one whose tokens move with
speculation: every draw stays fresh. :func:`seed_checks` compares tokens instead: a **repeat** of the same
requests, each request **alone** against the same request in a batch, and speculation **off** against
speculation on. :func:`keyed_engine` is a correct seeded engine whose target draws are keyed by seed and
position; :data:`SEED_GALLERY` adds two faults that keep the law (mlx-vlm #2029, TensorRT-LLM #17599).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np
import torch

from speculative.audit.engine_cases import CONTEXT, EngineCase, processed_probs
from speculative.audit.engine_gallery import _Forwards, _write
from speculative.audit.serving import SERVING_CASES
from speculative.sampling.draws import inverse_cdf

__all__ = ["keyed_uniforms", "keyed_engine", "SeedEntry", "SEED_GALLERY", "SEED_CHECKS",
           "seed_checks", "seed_check_power", "seed_gallery"]

def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def keyed_uniforms(seeds, stream: int, counters) -> torch.Tensor:
    """One uniform in [0, 1) per row, a pure function of (seed, stream, counter): a counter-based random
    stream, so a draw depends on what it is for, not on how many draws came before it."""
    seeds = np.asarray(seeds, dtype=np.int64).astype(np.uint64)
    counters = np.broadcast_to(np.asarray(counters, dtype=np.int64), seeds.shape).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = _mix(_mix(seeds ^ (np.uint64(stream) << np.uint64(56))) + counters)
    return torch.from_numpy((z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53)


@torch.no_grad()
def keyed_engine(target, draft, prompt, max_new_tokens, config, seeds, speculate: bool = True, *,
                 gamma: int = 2, bug: Optional[str] = None, state: Optional[dict] = None) -> torch.Tensor:
    """A seeded engine in the design mlx-vlm describes in its pull request #2029: every request has a seed;
    the target's token at output position t is drawn by inverse CDF from a uniform keyed by (seed, t), the
    draft's proposals from the request's own stream, and a draft is accepted when it equals the target's
    draw at its position. The emitted tokens are then the target's draws, exactly: the law is the target's,
    and a seed gives the same tokens with speculation on or off (``speculate``), alone or in a batch.

    Returns (len(seeds), max_new_tokens). ``bug`` plants a seed-handling fault that keeps the law:

    - ``"top_k_fallback"`` (mlx-vlm before #2029): a request with top-k draws the target's tokens from its
      stateful stream, which the draft's proposals consume too, so speculation changes its tokens;
    - ``"engine_stream"`` (TensorRT-LLM #17599): the seeds are ignored; every row draws from one stream of
      the engine (``state`` carries its position across calls), so neither a repeat nor a request alone
      gives the same tokens."""
    seeds = np.asarray(list(seeds), dtype=np.int64)
    n, start = len(seeds), len(prompt)
    counter = np.zeros(n, dtype=np.int64)  # each request's stateful stream
    state = {"draws": 0} if state is None else state
    shared = bug == "top_k_fallback" and config.top_k is not None

    def stateful(stream_seeds):
        nonlocal counter
        drawn = keyed_uniforms(stream_seeds, 0, counter)
        counter = counter + 1
        return drawn

    def engine_draw():
        drawn = keyed_uniforms(np.zeros(n, dtype=np.int64), 2, state["draws"] + np.arange(n))
        state["draws"] += n
        return drawn

    def target_uniform(positions):
        if bug == "engine_stream":
            return engine_draw()
        return stateful(seeds) if shared else keyed_uniforms(seeds, 1, positions)

    def draft_uniform(counts):
        if bug == "engine_stream":
            return engine_draw()
        return stateful(seeds) if shared else keyed_uniforms(seeds, 3, counts)

    target_forward = _Forwards(target, prompt)
    out = torch.zeros(n, CONTEXT + 1, dtype=torch.long)
    out[:, :start] = torch.tensor(list(prompt))
    ends = torch.full((n,), start)
    drafted = np.zeros(n, dtype=np.int64)
    if not speculate:
        for _ in range(max_new_tokens):
            p = processed_probs(target_forward(out, ends)[:, 0], config, out, ends, start)
            token = inverse_cdf(p, target_uniform((ends - start).numpy()))
            ends = _write(out, ends, token.unsqueeze(1), torch.ones(n, dtype=torch.long))
        return out[:, start:start + max_new_tokens]
    draft_forward = _Forwards(draft, prompt)
    while int((ends - start).min()) < max_new_tokens:
        active = ends - start < max_new_tokens
        seen = out.clone()
        drafts = torch.zeros(n, gamma, dtype=torch.long)
        for j in range(gamma):
            q = processed_probs(draft_forward(seen, ends + j)[:, 0], config, seen, ends + j, start)
            drafts[:, j] = inverse_cdf(q, draft_uniform(drafted))
            drafted = drafted + 1
            seen[torch.arange(n), ends + j] = drafts[:, j]
        logits = target_forward(seen, ends, extra=gamma)
        draws = torch.stack([inverse_cdf(processed_probs(logits[:, i], config, seen, ends + i, start),
                                         target_uniform((ends - start + i).numpy()))
                             for i in range(gamma + 1)], 1)
        accepted = (drafts == draws[:, :gamma]).long().cumprod(1).sum(1)
        ends = _write(out, ends, draws, torch.where(active, accepted + 1, 0))
    return out[:, start:start + max_new_tokens]


@dataclasses.dataclass
class SeedEntry:
    """One seeded engine of the seed gallery (:func:`keyed_engine`), and the checks its fault fails."""

    key: str
    name: str
    lawful: bool
    what: str
    cite: str = ""
    url: str = ""
    bug: Optional[str] = None
    fails: tuple = ()  # the checks of :func:`seed_checks` it fails

    def engine(self) -> Callable:
        """The engine in the seeded convention: (target, draft, prompt, k, config, seeds, speculate)."""
        state = {"draws": 0}

        def run(target, draft, prompt, max_new_tokens, config, seeds, speculate=True):
            return keyed_engine(target, draft, prompt, max_new_tokens, config, seeds, speculate, bug=self.bug,
                                state=state)

        run.__qualname__ = self.name
        return run

    def law_engine(self) -> Callable:
        """The same engine in the ``"models"`` convention, one fresh seed per row from the generator."""
        seeded = self.engine()

        def run(target, draft, prompt, max_new_tokens, config, generator, n):
            seeds = torch.randint(2 ** 62, (n,), generator=generator).numpy()
            return seeded(target, draft, prompt, max_new_tokens, config, seeds)

        run.__qualname__ = self.name
        return run


#: The seed checks, in order: a repeat gives the same tokens; each request alone gives the tokens it gave
#: in the batch; speculation off gives the tokens speculation gave.
SEED_CHECKS = ("repeat", "batched", "serial")

SEED_GALLERY = [
    SeedEntry("keyed", "target draws keyed by seed and position", True,
              "a correct seeded engine: the target's draw at each position depends only on the seed and the "
              "position", "mlxvlm2029", "https://github.com/Blaizzy/mlx-vlm/pull/2029"),
    SeedEntry("top_k_fallback", "top-k requests fall back to a stateful stream", False,
              "with top-k, the target draws from the request's stateful stream, which the draft's proposals "
              "consume as well; the law is kept, the tokens of a seed move with speculation",
              "mlxvlm2029", "https://github.com/Blaizzy/mlx-vlm/pull/2029", "top_k_fallback", ("serial",)),
    SeedEntry("engine_stream", "one engine-wide stream, seeds ignored", False,
              "every request draws from one stream of the engine that every call advances; the law is kept, "
              "a seed means nothing", "tensorrtllm17599", "https://github.com/NVIDIA/TensorRT-LLM/pull/17599",
              "engine_stream", ("repeat", "batched", "serial")),
]


def seed_checks(engine: Callable, case: EngineCase, seeds=range(32)) -> dict:
    """Run a seeded engine (the convention of :meth:`SeedEntry.engine`) on ``case`` and return, for each
    of :data:`SEED_CHECKS`, whether every request gave the same tokens both ways."""
    seeds = list(seeds)

    def run(chosen, speculate=True):
        return torch.as_tensor(engine(case.target, case.draft, list(case.prompt), case.length, case.config,
                                      chosen, speculate))

    first = run(seeds)
    sides = {"repeat": run(seeds), "batched": torch.cat([run([seed]) for seed in seeds]),
             "serial": run(seeds, False)}
    return {check: bool(torch.equal(first, sides[check])) for check in SEED_CHECKS}


def seed_check_power(engine: Callable, case: EngineCase, check: str, requests: int, probe=range(1_000, 1_256)) -> float:
    """The probability that ``check`` over ``requests`` seeds catches ``engine``: 1 - (1 - f)^requests,
    where f is the fraction of the ``probe`` seeds (none of them the check's) whose two sides differ."""
    if check not in SEED_CHECKS:
        raise ValueError(f"unknown seed check {check!r}; known: {', '.join(SEED_CHECKS)}")
    probe = list(probe)

    def run(chosen, speculate=True):
        return torch.as_tensor(engine(case.target, case.draft, list(case.prompt), case.length, case.config,
                                      chosen, speculate))

    first = run(probe)
    other = {"repeat": lambda: run(probe), "batched": lambda: torch.cat([run([seed]) for seed in probe]),
             "serial": lambda: run(probe, False)}[check]()
    differ = float((first != other).any(1).double().mean())
    return 1.0 - (1.0 - differ) ** requests


def seed_gallery(cases: list, requests: int = 32, family_false_alarm: Optional[float] = None,
                 max_rows: Optional[int] = None, seed: int = 0) -> list[dict]:
    """Every engine of :data:`SEED_GALLERY` on the top-k case: its law audit (over fresh seeds), its seed
    checks over ``requests`` seeds, and for each wrong one the power of the checks it must fail."""
    from speculative.audit.engine_audit import audit_engine
    from speculative.sampling import stats

    family_false_alarm = stats.FALSE_ALARM_RATE if family_false_alarm is None else family_false_alarm
    case = {c.name: c for c in cases}[SERVING_CASES[1]]
    rows = []
    for entry in SEED_GALLERY:
        report = audit_engine(entry.law_engine(), cases=[case], family_false_alarm=family_false_alarm, seed=seed,
                              max_rows=max_rows)
        checks = seed_checks(entry.engine(), case, range(requests))
        power = None
        if not entry.lawful:
            miss = 1.0
            for check in entry.fails:
                miss *= 1 - seed_check_power(entry.engine(), case, check, requests)
            power = 1 - miss
        rows.append({"key": entry.key, "name": entry.name, "lawful": entry.lawful, "cite": entry.cite,
                     "url": entry.url, "law_passed": report.passed, "checks": checks,
                     "passed": report.passed and all(checks.values()), "power": power, "report": report})
    return rows
