"""The worker's decisions on their own, without a database or a process: when a failed job is
tried again and after how long, what a transient judge error leads to, when the LLM variants
are held back (paused, over budget) and what a claimed job is then given back as, how many jobs
a worker claims, and the parsers its flags share with the command line."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

from recalltrace.scorers import ScoreResult
from recalltrace.scorers.budget import JudgeBudget
from recalltrace.scorers.worker import (
    LEFT_BUDGET,
    WorkerStats,
    non_negative_seconds,
    port,
    positive_number,
)
from recalltrace.scorers.worker._budget import BudgetGate
from recalltrace.scorers.worker._decisions import (
    ClaimSizing,
    JudgeHold,
    attempt_left,
    backoff,
    given_back_cause,
    transient_action,
    transient_backoff_attempt,
)
from recalltrace.scorers.worker._presence import Presence, StatusLine
from recalltrace.scorers.worker._warming import Warming

NOON = datetime(2026, 11, 26, 12, 30, tzinfo=timezone.utc)


# -- retries ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("attempts", "max_attempts", "again"),
    [(0, 3, True), (1, 3, True), (2, 3, False), (5, 3, False), (0, 1, False)],
)
def test_a_failed_job_is_tried_again_until_its_last_attempt(
    attempts: int, max_attempts: int, again: bool
) -> None:
    assert attempt_left(attempts, max_attempts) is again


def test_backoff_doubles_per_attempt_with_jitter_down_to_half() -> None:
    def delay(attempt: int, rand: float) -> float:
        return backoff(attempt, base_s=5.0, max_s=600.0, rand=lambda: rand).total_seconds()

    assert [delay(a, 1.0) for a in range(4)] == [5.0, 10.0, 20.0, 40.0]
    assert [delay(a, 0.0) for a in range(4)] == [2.5, 5.0, 10.0, 20.0]
    assert delay(-3, 1.0) == 5.0  # a negative attempt counts as the first


def test_backoff_is_capped_and_never_shorter_than_the_judges_hint() -> None:
    capped = backoff(20, base_s=5.0, max_s=600.0, rand=lambda: 1.0)
    assert capped == timedelta(seconds=600)
    hinted = backoff(0, base_s=5.0, max_s=600.0, hint_s=42.0, rand=lambda: 1.0)
    assert hinted == timedelta(seconds=42)
    short_hint = backoff(3, base_s=5.0, max_s=600.0, hint_s=1.0, rand=lambda: 1.0)
    assert short_hint == timedelta(seconds=40)


def test_a_transient_error_is_retried_until_the_job_has_failed_transiently_too_long() -> None:
    def action(first: datetime | None) -> str:
        return transient_action(
            unreachable=False, first_transient_at=first, now=NOON, max_age_s=3600.0
        )

    assert action(None) == "retry"  # its first transient error
    assert action(NOON - timedelta(minutes=59)) == "retry"
    assert action(NOON - timedelta(hours=1)) == "retry"  # not yet older than the limit
    assert action(NOON - timedelta(hours=1, seconds=1)) == "fail"


def test_a_judge_nothing_answers_for_pauses_whatever_the_jobs_age() -> None:
    for first in (None, NOON - timedelta(days=2)):
        chosen = transient_action(
            unreachable=True, first_transient_at=first, now=NOON, max_age_s=3600.0
        )
        assert chosen == "pause"


def test_a_transient_errors_backoff_grows_with_attempts_up_to_six_doublings() -> None:
    assert [transient_backoff_attempt(a) for a in (0, 1, 4, 5, 6, 40)] == [1, 2, 5, 6, 6, 6]


# -- pauses and give-backs --------------------------------------------------------------
def test_a_pause_is_said_once_and_extended_while_it_runs() -> None:
    hold = JudgeHold()
    assert not hold.held(100.0)
    assert hold.pause(100.0, 300.0) is True  # starts: said and counted
    assert hold.paused(399.0) and not hold.paused(400.0)
    assert hold.pause(200.0, 300.0) is False  # already paused: not said again
    assert hold.paused(499.0)  # but it lasts from the new error
    assert hold.pause(600.0, 300.0) is True  # over, then paused again: said again


def test_claimed_llm_jobs_are_given_back_while_the_judge_is_held_non_llm_ones_run() -> None:
    hold = JudgeHold()
    assert hold.give_back(uses_llm=True, now=10.0) == (False, None)
    hold.pause(10.0, 5.0)
    assert hold.give_back(uses_llm=True, now=12.0) == (True, None)
    assert hold.give_back(uses_llm=False, now=12.0) == (False, None)
    assert hold.give_back(uses_llm=True, now=15.0) == (False, None)  # the pause is over


def test_a_job_given_back_over_budget_is_left_for_the_budget() -> None:
    hold = JudgeHold()
    hold.budget_until = 50.0
    assert hold.held(20.0) and hold.over_budget(20.0) and not hold.paused(20.0)
    assert hold.give_back(uses_llm=True, now=20.0) == (True, LEFT_BUDGET)
    hold.pause(20.0, 5.0)  # paused as well: the budget still names the cause
    assert hold.give_back(uses_llm=True, now=21.0) == (True, LEFT_BUDGET)
    assert hold.give_back(uses_llm=False, now=21.0) == (False, None)


def test_jobs_cut_off_by_a_stop_are_given_back_as_stopped_or_at_the_deadline() -> None:
    assert given_back_cause(deadline_reached=False) == "stopped"
    assert given_back_cause(deadline_reached=True) == "given back at the deadline"


def test_a_budget_reached_by_the_deadline_is_not_counted_as_the_judges_doing() -> None:
    stats = WorkerStats(left_reasons={LEFT_BUDGET: 4})
    assert not stats.left_by_judge
    stats.left_reasons["stopped"] = 1
    assert stats.left_by_judge
    assert WorkerStats(deadline_reached=True).left_by_judge


def test_stats_count_stored_outcomes_and_refuse_others() -> None:
    stats = WorkerStats()
    for outcome in ("scored", "scored", "skipped", "failed"):
        stats.count(outcome)
    assert (stats.scored, stats.skipped, stats.failed, stats.finished) == (2, 1, 1, 4)
    with pytest.raises(ValueError, match="'retried'"):
        stats.count("retried")


# -- the budget gate --------------------------------------------------------------------
def result(model: str, tokens: int, usd: float | None) -> ScoreResult:
    return ScoreResult(
        metric="llm_context_recall",
        value=1.0,
        status="scored",
        reason="ok",
        model=model,
        prompt_tokens=tokens,
        completion_tokens=0,
        cost_usd=usd,
    )


def test_the_budget_counts_unwritten_results_of_its_model_and_calls_possibly_billed() -> None:
    gate = BudgetGate(JudgeBudget.parse("1000 tokens/hour"), "judge-a")
    start = JudgeBudget.parse("1000 tokens/hour").period_start(NOON)
    assert not gate.stale
    gate.note_possibly_billed(start - timedelta(seconds=1), 500.0, 0.0)  # the last period
    gate.note_possibly_billed(start + timedelta(minutes=5), 70.0, 0.0)
    assert gate.stale
    unwritten = [result("judge-a", 100, 0.1), result("judge-b", 400, 0.4)]
    assert gate.spent(200, 0.2, unwritten, start) == 200 + 100 + 70
    usd_gate = BudgetGate(JudgeBudget.parse("$1/hour"), "judge-a")
    assert usd_gate.spent(200, 0.2, unwritten, start) == pytest.approx(0.3)


def test_the_budget_holds_llm_variants_until_the_period_ends_and_says_it_once() -> None:
    gate = BudgetGate(JudgeBudget.parse("1000 tokens/hour"), "judge-a")
    hold = JudgeHold()
    assert gate.assess(999.0, now=NOON, now_m=100.0, hold=hold) == "under"
    assert not hold.held(100.0)
    assert gate.assess(1000.0, now=NOON, now_m=100.0, hold=hold) == "reached"
    assert hold.budget_until == 100.0 + 30 * 60  # the hour ends at 13:00
    assert gate.assess(1500.0, now=NOON, now_m=101.0, hold=hold) == "still reached"
    later = NOON + timedelta(hours=1)
    assert gate.assess(0.0, now=later, now_m=3700.0, hold=hold) == "resumed"
    assert not hold.held(3700.0)
    assert gate.assess(2000.0, now=later, now_m=3701.0, hold=hold) == "reached"  # new period


# -- claims -----------------------------------------------------------------------------
def test_a_worker_claims_ahead_and_in_batches_not_job_by_job() -> None:
    sizing = ClaimSizing(concurrency=16, batch_size=32)
    assert (sizing.prefetch, sizing.refill_at) == (8, 4)
    assert sizing.limit(running=0, ready=0) == 24
    assert sizing.limit(running=16, ready=8) == 0  # full
    assert sizing.limit(running=16, ready=5) == 0  # 3 free: less than a quarter
    assert sizing.limit(running=12, ready=8) == 4
    small_batches = ClaimSizing(concurrency=16, batch_size=2)
    assert small_batches.limit(running=0, ready=0) == 2


def test_a_worker_of_one_still_claims_when_idle() -> None:
    sizing = ClaimSizing(concurrency=1, batch_size=32)
    assert (sizing.prefetch, sizing.refill_at) == (1, 1)
    assert sizing.limit(running=0, ready=0) == 2
    assert sizing.limit(running=1, ready=0) == 1
    assert sizing.limit(running=1, ready=1) == 0


# -- what a long-running worker says ----------------------------------------------------
def test_the_status_line_skips_the_first_refresh_then_comes_every_interval() -> None:
    status = StatusLine(60.0)
    assert not status.due(1000.0)  # the start line says enough
    assert not status.due(1059.0)
    assert status.due(1060.0)
    assert not status.due(1100.0)
    assert status.due(1120.0)
    never = StatusLine(None)
    assert not any(never.due(t) for t in (0.0, 1e6))


def test_variants_no_worker_serves_are_named_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def unused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("no database call expected")

    presence = Presence(
        None,  # type: ignore[arg-type]
        unused,
        worker_id="w",
        metrics=["exact_id_recall"],
        started_at=NOON,
    )
    with caplog.at_level(logging.WARNING, logger="recalltrace.scorers.worker"):
        presence.warn_unserved({"llm_context_recall": 3})
        presence.warn_unserved({"llm_context_recall": 5, "id_based_context_recall": 1})
        presence.warn_unserved({"llm_context_recall": 5, "id_based_context_recall": 1})
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "3 queued jobs of variant no running worker serves: llm_context_recall (3)" in lines[0]
    assert "1 queued job of variant no running worker serves: id_based_context_recall" in lines[1]


# -- shared parsers ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("parse", "raw", "message"),
    [
        (positive_number, "soon", "expected a number, got 'soon'"),
        (positive_number, "0", "expected a positive number, got '0'"),
        (positive_number, "nan", "expected a positive number, got 'nan'"),
        (port, "http", "expected a port number, got 'http'"),
        (port, "65536", "expected a port from 0 to 65535, got '65536'"),
        (non_negative_seconds, "-1", "expected 0 or more seconds, got '-1'"),
        (non_negative_seconds, "inf", "expected 0 or more seconds, got 'inf'"),
    ],
)
def test_shared_parsers_name_the_value_and_what_was_expected(
    parse: object, raw: str, message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        parse(raw)  # type: ignore[operator]
    assert str(caught.value) == message


def test_shared_parsers_take_good_values() -> None:
    assert positive_number("2.5") == 2.5
    assert port("0") == 0 and port("65535") == 65535
    assert non_negative_seconds("0") == 0.0


def test_the_budget_is_not_read_while_held_and_a_failed_read_holds_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = BudgetGate(JudgeBudget.parse("1000 tokens/hour"), "judge-a")
    reads: list[str] = []

    async def spend_of(model: str, _since: datetime) -> tuple[int, float]:
        reads.append(model)
        return 5000, 0.0

    async def unreachable(_model: str, _since: datetime) -> tuple[int, float]:
        raise ConnectionError("server closed the connection\nmore detail")

    hold = JudgeHold()
    with caplog.at_level(logging.ERROR, logger="recalltrace.scorers.worker"):
        assert asyncio.run(gate.check(unreachable, list, hold)) is None
        assert not hold.held(time.monotonic())
        checked = asyncio.run(gate.check(spend_of, list, hold))
        assert checked == ("reached", 5000.0) and reads == ["judge-a"]
        assert asyncio.run(gate.check(spend_of, list, hold)) is None  # held: not read again
    assert reads == ["judge-a"]
    lines = [r.getMessage() for r in caplog.records]
    assert (
        "reading the judge's spend failed (ConnectionError: server closed the connection)"
        in (lines[0])
    )
    assert lines[1].startswith("JUDGE BUDGET REACHED: 5,000 tokens spent of 1,000 tokens per hour")


def test_a_failing_warm_is_said_once_and_its_recovery_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes = iter([RuntimeError("no"), RuntimeError("still no"), None])

    def warm() -> None:
        failure = next(outcomes)
        if failure is not None:
            raise failure

    async def in_thread(fn: Callable[[], object]) -> object:
        return fn()

    warming = Warming(warm, interval_s=1e-9)
    never = Warming(warm, interval_s=None)
    with caplog.at_level(logging.INFO, logger="recalltrace.scorers.worker"):
        for _ in range(3):
            asyncio.run(warming.when_due(in_thread))
        asyncio.run(never.when_due(in_thread))  # would raise StopIteration if called
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "storing history summaries failed (RuntimeError: no); queries compute them until it "
        "works again (said once)",
        "storing history summaries works again",
    ]
