"""Serving audit records (``results/audits/engine_*.json``) analysed again, from their counts alone.

Explained in: notebooks/13_audit_serving.

A serving record (written by ``python -m speculative audit-engine vllm|openai --record FILE --run NAME``)
keeps, for every case of every configuration, the exact law the case was tested against and the counts
the engine produced on its cells (the last count: rows the law rules out). :func:`reanalyse` recomputes
each verdict from those, with no engine and no model, so a record can be checked on any machine.
"""

from __future__ import annotations

import re
from typing import Optional

from speculative.sampling import stats

__all__ = ["reanalyse", "verdict", "VERDICTS"]

#: What a case's verdict can be.
VERDICTS = {
    "pass": "the counts fit the exact law",
    "law": "the counts do not fit the exact law",
    "ruled out": "the engine emitted sequences the exact law rules out",
    "refused": "the engine refused the request, would not start, or did not answer, in one line",
    "malformed": "the engine answered, but not n rows of k token ids in the vocabulary",
    "crashed": "the engine raised during the case or ran past its time limit",
}
_REFUSED = ("vLLM refused", "the server exited", "the server did not answer", "no answer from",
            "the server answered HTTP", "lists no model")
_MALFORMED = ("returned", "emitted [", "asked for", "answered text")


#: Errors by which an engine says no to a request or a configuration, rather than failing inside it.
_REFUSALS = ("VLLMValidationError", "ValueError", "ImportError", "NotImplementedError")


def verdict(detail: str, passed: bool, impossible: int) -> str:
    """The kind of a case's verdict (:data:`VERDICTS`) from its detail line, pass flag and ruled-out rows."""
    if passed:
        return "pass"
    if impossible:
        return "ruled out"
    error = re.search(r"\b(\w+(?:Error|Exception)): ", detail)
    if error and error.group(1) not in _REFUSALS:
        return "crashed"
    if any(text in detail for text in _REFUSED):
        return "refused"
    if any(detail.startswith(text) or text in detail for text in _MALFORMED) and "law rejected" not in detail:
        return "malformed"
    if detail.startswith("raised") or "ran past" in detail:
        return "crashed"
    return "law"


def _row(run_name: str, configuration: dict, info: dict, result: dict, per_case: float) -> dict:
    counts = result.get("counts")
    law = info.get("law")
    row = {"run": run_name, "label": configuration["label"], "method": configuration["method"],
           "axis": configuration["axis"], "case": result["name"], "n": result["n"], "detail": result["detail"],
           "recorded_passed": result["passed"], "p_value": None, "detectable_tv": None,
           "seconds": result["seconds"], "acceptance": info.get("acceptance")}
    impossible = int(counts[-1]) if counts else 0
    complete = counts is not None and law is not None and sum(counts) == result["n"] and result["n"] > 0
    hard_failure = bool(result["detail"]) and result["p_value"] is None and not impossible
    if complete and not hard_failure:
        fit = stats.goodness_of_fit(counts[:-1], law)
        row["p_value"] = 0.0 if impossible else fit.p_value
        row["detectable_tv"] = stats.detectable_tv(result["n"], stats.pooled(law, result["n"]), per_case)
        passed = not impossible and fit.p_value >= per_case
    else:
        passed = False
    row["passed"] = passed
    row["verdict"] = verdict(result["detail"], passed, impossible)
    return row


def reanalyse(record: dict, run: Optional[str] = None) -> list[dict]:
    """One row per case of every configuration of every run (or of ``run``): the verdict recomputed from
    the recorded law and counts, with the p-value, the total variation the sample detects at power 0.99,
    and the recorded verdict beside it (``recorded_passed``)."""
    rows = []
    for run_name, content in record["runs"].items():
        if run is not None and run_name != run:
            continue
        for configuration in content["configurations"]:
            per_case = configuration["family_false_alarm"] / max(1, len(configuration["results"]))
            for info, result in zip(configuration["cases"], configuration["results"]):
                rows.append(_row(run_name, configuration, info, result, per_case))
    return rows
