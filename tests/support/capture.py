"""Helpers for the span-capture tests: what a stored request looks like, and a real
``recalltrace worker --once`` run (the command line, in process) against the scripted judge
server that scores it."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field

from sqlalchemy import Engine, select

from recalltrace.storage.models import RetrievedContext, Score, Trace
from tests.support import ROOT
from tests.support.cli import run_cli
from tests.support.judge_server import JudgeServer

QUESTIONS = {
    "What is the capital of France?": ["d1", "d2"],
    "Which river runs through Berlin?": ["d3", "d1"],
}
CORPUS = {
    "d1": "Paris is the capital of France.",
    "d2": "France borders Spain and Italy.",
    "d3": "The Spree runs through Berlin.",
}
ANSWERS = {
    "What is the capital of France?": "Paris is the capital.",
    "Which river runs through Berlin?": "The Spree.",
}


def ranked(question: str) -> list[str]:
    """The ids a test retriever returns for ``question``, in rank order."""
    return QUESTIONS[question]


@dataclass
class Stored:
    """One stored trace with its contexts and scores."""

    trace_id: str
    app_name: str
    user_input: str | None
    response: str | None
    ids: list[str | None]
    contents: list[str]
    notes: list[str]
    metadata: dict[str, object]
    scores: dict[str, str] = field(default_factory=dict)


def stored(engine: Engine) -> list[Stored]:
    """Every stored trace, oldest first, with its contexts in rank order and its scores."""
    with engine.connect() as conn:
        traces = conn.execute(select(Trace.__table__).order_by(Trace.started_at)).all()
        result = []
        for row in traces:
            contexts = conn.execute(
                select(RetrievedContext.context_id, RetrievedContext.content)
                .where(RetrievedContext.trace_id == row.trace_id)
                .order_by(RetrievedContext.position)
            ).all()
            scores = conn.execute(
                select(Score.metric, Score.status).where(Score.trace_id == row.trace_id)
            ).all()
            result.append(
                Stored(
                    row.trace_id,
                    row.app_name,
                    row.user_input,
                    row.response,
                    [c.context_id for c in contexts],
                    [c.content for c in contexts],
                    list(row.notes or []),
                    dict(row.metadata or {}),
                    {metric: status for metric, status in scores},
                )
            )
    return result


def run_worker(database_url: str, judge: JudgeServer) -> subprocess.CompletedProcess[str]:
    """One real ``recalltrace worker --once`` over every variant, judged by ``judge``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["OPENAI_API_KEY"] = "test-key"
    command = ["worker", "--once", "--database-url", database_url, "--no-progress"]
    command += ["--judge-model", "openai/test-judge", "--judge-api-base", judge.base_url]
    return run_cli(*command, cwd=ROOT, env=env)


def check_requests(records: list[Stored], app_name: str | None = None) -> None:
    """One record per question, with the question, the ids and contents in rank order and the
    answer."""
    assert [r.user_input for r in records] == list(QUESTIONS)
    for record in records:
        question = record.user_input
        assert question is not None
        assert record.ids == ranked(question)
        assert record.contents == [CORPUS[i] for i in ranked(question)]
        assert record.response == ANSWERS[question]
        assert record.metadata.get("captured_from") == "spans"
        if app_name is not None:
            assert record.app_name == app_name
