"""What an audit reports: each case's verdict, and the whole report as a Markdown table or as JSON.

Explained in: notebooks/09_audit (a verification function) and notebooks/12_audit_engine (a whole engine).

:class:`AuditReport` is what :func:`core.audit_sampler` returns; :class:`EngineReport` what
:func:`engine_audit.audit_engine` returns, with what each engine case is. Both tables are built with
``tabulate`` and end with one line: how many cases failed, the family-wise false-alarm rate, the time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional

from speculative.measure.report import markdown_table

__all__ = ["CaseResult", "AuditReport", "EngineReport"]


@dataclass
class CaseResult:
    name: str
    n: int
    p_value: Optional[float]
    detectable_tv: Optional[float]
    passed: bool
    detail: str = ""
    seconds: float = 0.0
    counts: Optional[list] = None  # an engine case's counts on its law's cells, then outside them


@dataclass
class AuditReport:
    sampler: str
    convention: str
    family_false_alarm: float
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def table(self) -> str:
        """Return the report as a Markdown table with the overall verdict under it."""
        rows = [[r.name, *_cells(r)] for r in self.results]
        return _markdown(rows, ["case", "n", "p-value", "detectable TV", "verdict"]) + "\n\n" + self._summary()

    def _summary(self) -> str:
        """The line under the table: the overall verdict, the false-alarm rate and the time taken."""
        failed = sum(not r.passed for r in self.results)
        return (f"{self.sampler} ({self.convention}): "
                + ("every case passed" if not failed else f"{failed} of {len(self.results)} cases failed")
                + f"; family-wise false-alarm rate {_readable(self.family_false_alarm)}; {self.seconds:.1f} s.")

    def to_json(self) -> str:
        return json.dumps({"sampler": self.sampler, "convention": self.convention, "passed": self.passed,
                           "family_false_alarm": self.family_false_alarm, "seconds": self.seconds,
                           "results": [asdict(r) for r in self.results]}, indent=2)


@dataclass
class EngineReport(AuditReport):
    """An :class:`AuditReport` of a whole engine, with what each case is (k tokens, the target's entropy
    and the draft's exact acceptance rate)."""

    cases: list[dict] = field(default_factory=list)

    def table(self) -> str:
        rows = [[r.name, str(info["k"]), f"{info['entropy_bits']:.2f}", f"{info['acceptance']:.2f}", *_cells(r)]
                for info, r in zip(self.cases, self.results)]
        headers = ["case", "k", "entropy (bits/token)", "α", "n", "p-value", "detectable TV", "verdict"]
        return _markdown(rows, headers) + "\n\n" + self._summary()

    def to_json(self) -> str:
        record = json.loads(super().to_json())
        record["cases"] = self.cases
        return json.dumps(record, indent=2)


def _cells(r: CaseResult) -> list[str]:
    """A case's n, p-value, detectable TV and verdict, as the tables show them."""
    p = "—" if r.p_value is None else _readable(r.p_value)
    tv = "—" if r.detectable_tv is None else f"{r.detectable_tv:.3f}"
    verdict = ("pass" if r.passed else "**FAIL**") + (": " + r.detail if r.detail else "")
    return [f"{r.n:,}", p, tv, verdict]


def _markdown(rows: list[list[str]], headers: list[str]) -> str:
    """A Markdown table of text cells: the first column (the case) and the last (the verdict) to the left,
    the figures between them to the right."""
    return markdown_table(rows, headers, "l" + "r" * (len(headers) - 2) + "l")


def _readable(value: float) -> str:
    from speculative.measure.report import scientific

    return "0" if value == 0 else (f"{value:.3g}" if value >= 1e-3 else scientific(value).text)
