"""How far the judge is from people: agreement between stored scores and human labels.

For each judge model and variant version, over the traces a person labelled: the number of
labelled traces, the mean absolute error, Pearson's and Spearman's correlation, Cohen's kappa
after cutting both at a threshold (a score at or above it is a pass), the confusion table of
that cut, and the traces where judge and person disagree most, with the judge's reason and the
person's note.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from recalltrace.storage.labels import AgreementPair


@dataclass
class Agreement:
    """Agreement of one judge model and variant version with the labels."""

    model: str | None
    version: str
    labelled: int
    mae: float
    pearson: float | None
    """``None`` when either side is constant (the correlation is undefined)."""
    spearman: float | None
    kappa: float | None
    """Cohen's kappa at ``threshold``; ``None`` when both sides put every trace on one side."""
    threshold: float
    confusion: dict[str, int]
    """``judge_pass_label_pass``, ``judge_pass_label_fail``, ``judge_fail_label_pass``,
    ``judge_fail_label_fail``."""
    worst: list[AgreementPair] = field(default_factory=list)
    rescored: bool = False
    """The judge scored the labelled traces just now, for this comparison (nothing stored)."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "model": self.model,
            "version": self.version,
            "rescored": self.rescored,
            "labelled": self.labelled,
            "mae": self.mae,
            "pearson": self.pearson,
            "spearman": self.spearman,
            "kappa": self.kappa,
            "threshold": self.threshold,
            "confusion": dict(self.confusion),
            "worst": [
                {
                    "trace_id": p.trace_id,
                    "labeller": p.labeller,
                    "label": p.label,
                    "note": p.note,
                    "score": p.score,
                    "reason": p.reason,
                }
                for p in self.worst
            ],
        }


def agreement(
    pairs: Iterable[AgreementPair], *, threshold: float = 0.5, worst: int = 5
) -> list[Agreement]:
    """Agreement per (judge model, variant version), most labelled first."""
    groups: dict[tuple[str | None, str], list[AgreementPair]] = {}
    for pair in pairs:
        groups.setdefault((pair.model, pair.version), []).append(pair)
    reports = []
    for (model, version), members in groups.items():
        scores = [p.score for p in members]
        labels = [p.label for p in members]
        cells = {
            "judge_pass_label_pass": 0,
            "judge_pass_label_fail": 0,
            "judge_fail_label_pass": 0,
            "judge_fail_label_fail": 0,
        }
        for score, label in zip(scores, labels, strict=True):
            judge = "pass" if score >= threshold else "fail"
            person = "pass" if label >= threshold else "fail"
            cells[f"judge_{judge}_label_{person}"] += 1
        ordered = sorted(members, key=lambda p: (-abs(p.score - p.label), p.trace_id))
        reports.append(
            Agreement(
                model=model,
                version=version,
                labelled=len(members),
                mae=statistics.fmean(abs(s - x) for s, x in zip(scores, labels, strict=True)),
                pearson=pearson(scores, labels),
                spearman=pearson(ranks(scores), ranks(labels)),
                kappa=cohen_kappa(cells),
                threshold=threshold,
                confusion=cells,
                worst=[p for p in ordered[:worst] if p.score != p.label],
            )
        )
    reports.sort(key=lambda r: (-r.labelled, str(r.model), r.version))
    return reports


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's correlation; ``None`` when fewer than two values or either side is constant."""
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    syy = math.fsum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def ranks(values: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank (for Spearman's correlation)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            result[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return result


def cohen_kappa(cells: dict[str, int]) -> float | None:
    """Cohen's kappa of a 2x2 confusion table; ``None`` when chance agreement is total."""
    n = sum(cells.values())
    if n == 0:
        return None
    pp, pf = cells["judge_pass_label_pass"], cells["judge_pass_label_fail"]
    fp, ff = cells["judge_fail_label_pass"], cells["judge_fail_label_fail"]
    observed = (pp + ff) / n
    expected = ((pp + pf) * (pp + fp) + (fp + ff) * (pf + ff)) / (n * n)
    if expected == 1:
        return None
    return (observed - expected) / (1 - expected)
