"""What a worker hands around and hands back: a finished job on its way to storage
(:class:`Finished`) and the account of a run (:class:`WorkerStats`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from recalltrace.scorers._result import ScoreResult
from recalltrace.scorers.phoenix import AnnotationStats
from recalltrace.storage.contracts import ClaimedJob

LEFT_BUDGET = "the judge budget was reached"
"""Why a claimed job was given back untouched: the budget of its period was spent."""


@dataclass(frozen=True, slots=True)
class Finished:
    """A job that ended with a result, waiting to be stored with it."""

    job: ClaimedJob
    result: ScoreResult
    app_name: str
    """The app of the scored request (``""`` when its trace was gone)."""
    duration_s: float
    """How long scoring took, from the job's start."""


@dataclass
class WorkerStats:
    """What a worker did during :meth:`Worker.run`."""

    scored: int = 0
    skipped: int = 0
    failed: int = 0
    retried: int = 0
    released: int = 0
    paused: int = 0
    db_seconds: float = 0.0
    """Wall time spent in database calls (claims, loads, writes, leases, maintenance)."""
    budget_reached: int = 0
    """Periods in which the judge budget was reached (LLM variants paused until the next)."""
    annotations: AnnotationStats | None = None
    """What was posted to Phoenix (with ``phoenix_url``), counted when the run ends."""
    deadline_reached: bool = False
    """A one-shot run stopped at its deadline (``once_deadline_s``)."""
    left_unscored: int = 0
    """A one-shot run: jobs of the variants it scores still queued when it ended."""
    left_reasons: dict[str, int] = field(default_factory=dict)
    """Why this run's claimed jobs were left unscored (last cause each), e.g. ``judge failing``."""
    possibly_billed_tokens: float = 0.0
    """Estimated tokens of judge calls that timed out after being sent (they may be billed;
    they count against the judge budget)."""
    judge_answers_replayed: int = 0
    """Judge answers read back from the database instead of calling the judge (jobs taken
    again after a worker died mid-judge)."""

    def count(self, outcome: str) -> None:
        """Count one job that ended ``scored``, ``skipped`` or ``failed``."""
        if outcome == "scored":
            self.scored += 1
        elif outcome == "skipped":
            self.skipped += 1
        elif outcome == "failed":
            self.failed += 1
        else:
            raise ValueError(f"not an outcome of a stored score: {outcome!r}")

    @property
    def left_by_judge(self) -> bool:
        """Whether jobs were left unscored because of the judge (failing, paused, too slow for
        the deadline); a budget reached is the run doing what it was told, not counted here."""
        return self.deadline_reached or any(r != LEFT_BUDGET for r in self.left_reasons)

    @property
    def finished(self) -> int:
        """Jobs that ended with a stored score."""
        return self.scored + self.skipped + self.failed
