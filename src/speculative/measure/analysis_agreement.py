"""Analysis of an agreement record (:func:`speculative.measure.drafts.measure_agreement`): each draft's exact
acceptance rate, per temperature, with its interval over held-out contexts.

Explained in: notebooks/14_which_draft. Pure: it averages the rates the record keeps.
"""

from __future__ import annotations

import statistics

from speculative.measure.rows import AgreementRow
from speculative.measure.shared import mean_interval

__all__ = ["agreement_rows"]


def agreement_rows(record: dict) -> list[AgreementRow]:
    """Per draft and temperature: the mean exact acceptance rate over contexts, with a 95% bootstrap
    interval over contexts (the context is the unit: positions within one are not independent)."""
    rows = []
    for o in record["observations"]:
        rows.append(AgreementRow(draft=o["draft"], temperature=o["temperature"], contexts=len(o["rates"]),
                                 alpha=statistics.fmean(o["rates"]), alpha_ci95=mean_interval(o["rates"], seed=0)))
    return rows
