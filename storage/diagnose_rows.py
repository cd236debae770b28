"""The rows ``scores diagnose`` returns (:mod:`storage.diagnose`): plain frozen dataclasses with
``as_dict`` for JSON output."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from recalltrace.storage.diagnose_stats import CONFIDENCE


@dataclass(frozen=True)
class SliceRow:
    """One slice against the rest of the window."""

    attribute: str
    """A request attribute (``release``) or ``document.KEY`` for retrieved documents' metadata."""
    value: str
    count: int
    """Scored traces in the slice."""
    mean: float
    rest_count: int
    rest_mean: float
    difference: float
    """The slice's mean minus the rest's."""
    interval: tuple[float, float]
    """The difference's 95% interval (Welch, Student's t)."""
    p_value: float
    q_value: float
    """The Benjamini-Hochberg adjusted p-value over every slice tested."""
    significant: bool
    """``q_value`` is at most the diagnosis' ``q``."""
    impact: float
    """Requests' worth of recall the slice loses: ``count x (rest mean - mean)``."""
    where: tuple[tuple[str, str], ...] | None
    """The history filter selecting the slice (with the diagnosis' own); ``None`` for
    document-metadata slices, which name example traces instead."""
    example_trace_ids: tuple[str, ...] = ()
    """For document-metadata slices: its lowest-scoring traces."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary."""
        out = asdict(self)
        out["interval"] = list(self.interval)
        out["where"] = None if self.where is None else [list(w) for w in self.where]
        out["example_trace_ids"] = list(self.example_trace_ids)
        return out


@dataclass(frozen=True)
class MissedReference:
    """One reference document (or reference context) and how often it was retrieved when a
    request needed it."""

    reference: str
    """The document id, or the reference context's text."""
    kind: str
    """``id`` or ``context``."""
    needed: int
    """Scored requests whose reference includes it."""
    retrieved: int
    """Of those, the requests that retrieved it."""
    needed_share: float
    """``needed`` over every scored request of the window."""
    retrieved_share: float
    interval: tuple[float, float]
    """Wilson 95% interval of ``retrieved_share``."""
    example_trace_ids: tuple[str, ...]
    """Recent requests that needed it and did not retrieve it."""

    @property
    def missed(self) -> int:
        """Requests that needed it and did not retrieve it."""
        return self.needed - self.retrieved

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary."""
        out = asdict(self)
        out["missed"] = self.missed
        out["interval"] = list(self.interval)
        out["example_trace_ids"] = list(self.example_trace_ids)
        return out


@dataclass(frozen=True)
class UnsupportedClaim:
    """One claim of the references, and how often the retrieved contexts did not support it."""

    claim: str
    """The statement (as first judged; grouped ignoring case and surrounding space)."""
    unsupported: int
    judged: int
    unsupported_share: float
    interval: tuple[float, float]
    """Wilson 95% interval of ``unsupported_share``."""
    reference: str | None
    """The reference answer it came from (the most frequent among the examples)."""
    expected_documents: tuple[str, ...]
    """Reference document ids of the example traces: what should have supported it."""
    example_trace_ids: tuple[str, ...]
    """Recent traces where it was not supported."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary."""
        out = asdict(self)
        out["interval"] = list(self.interval)
        out["expected_documents"] = list(self.expected_documents)
        out["example_trace_ids"] = list(self.example_trace_ids)
        return out


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found."""

    metric: str
    version: str
    since: datetime | None
    until: datetime | None
    app: str | None
    where: tuple[tuple[str, str], ...]
    scored: int
    """Scored results of the metric in the window (after the filters)."""
    mean: float | None
    q: float
    """The false-discovery rate the slices are controlled at."""
    min_count: int
    tested: int
    """Slices tested (the two values of an attribute that splits every trace between them are
    one hypothesis of the false-discovery control, each the other's rest)."""
    skipped_small: int
    """Slices not tested: fewer than ``min_count`` scored traces in them or in their rest (the
    largest are named in ``small_slices``)."""
    skipped_attributes: dict[str, int]
    """Attributes not sliced because they are the clusters (user and session ids: each of
    their values lies within one cluster), with their number of values."""
    significant: int
    """Slices with a q-value at most ``q``."""
    significant_below: int
    """Of those, the slices below the rest."""
    slices: list[SliceRow]
    """The slices shown, by impact: the significant ones below the rest, or every slice tested
    when asked."""
    missed: list[MissedReference] | None
    """``None`` when the metric keeps no per-reference evidence."""
    missed_total: int
    """References missed at least once (``missed`` shows the first ``limit``)."""
    claims: list[UnsupportedClaim] | None
    """``None`` unless the metric is ``llm_context_recall``."""
    confidence: float = CONFIDENCE
    notes: list[str] = field(default_factory=list)
    clustering: str = ""
    """One line: what the tests treat as independent (clusters by user or session, or
    independent traces)."""
    small_slices: list[tuple[str, str, int]] = field(default_factory=list)
    """The largest slices not tested for too few traces (in them or their rest):
    ``(attribute, value, traces)``, at most the diagnosis' ``limit``."""
    skipped_one_cluster: int = 0
    """Slices not tested because they (or their rest) lie within one cluster."""
    one_cluster_slices: list[tuple[str, str, int]] = field(default_factory=list)
    """The largest of those, ``(attribute, value, traces)``."""

    @property
    def needed(self) -> int:
        """The fewest scored traces in which any slice can be tested: a slice and its rest
        of ``min_count`` each."""
        return 2 * self.min_count

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary."""
        return {
            "metric": self.metric,
            "version": self.version,
            "since": None if self.since is None else self.since.isoformat(),
            "until": None if self.until is None else self.until.isoformat(),
            "app": self.app,
            "where": [list(w) for w in self.where],
            "scored": self.scored,
            "mean": self.mean,
            "q": self.q,
            "confidence": self.confidence,
            "min_count": self.min_count,
            "clustering": self.clustering,
            "slices_tested": self.tested,
            "slices_skipped_small": self.skipped_small,
            "slices_too_small": [
                {"attribute": a, "value": v, "traces": n} for a, v, n in self.small_slices
            ],
            "slices_skipped_one_cluster": self.skipped_one_cluster,
            "slices_within_one_cluster": [
                {"attribute": a, "value": v, "traces": n} for a, v, n in self.one_cluster_slices
            ],
            "attributes_skipped": dict(self.skipped_attributes),
            "slices_significant": self.significant,
            "slices_significant_below": self.significant_below,
            "slices": [s.as_dict() for s in self.slices],
            "missed_references": None
            if self.missed is None
            else [m.as_dict() for m in self.missed],
            "missed_references_total": self.missed_total,
            "unsupported_claims": None
            if self.claims is None
            else [c.as_dict() for c in self.claims],
            "notes": list(self.notes),
        }
