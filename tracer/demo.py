"""``recalltrace demo``: prepares the embedded database and reports what it holds.

The shipped demo application (a small corpus, questions with reference answers, a retriever and
an extractive answerer, traced and scored end to end) arrives with the worker; until then this
command sets up the database and reports real counts only.
"""

from __future__ import annotations

import argparse


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``recalltrace demo``."""
    parser.add_argument(
        "--judge-model",
        default=None,
        help="LiteLLM model string for the LLM variants (e.g. ollama/llama3.1)",
    )


def run_demo(args: argparse.Namespace) -> int:
    """Migrate the database and print what it holds."""
    from sqlalchemy import func, select

    from storage.db import redact_url, resolve_database_url
    from storage.models import Score, ScoringJob, Trace
    from storage.repository import open_repository

    url = resolve_database_url(args.database_url)
    repo = open_repository(url, create_schema=True)
    with repo.engine.connect() as conn:
        traces = conn.scalar(select(func.count()).select_from(Trace)) or 0
        jobs = conn.scalar(select(func.count()).select_from(ScoringJob)) or 0
        scores = conn.scalar(select(func.count()).select_from(Score)) or 0
    repo.dispose()
    print(f"recalltrace demo: database {redact_url(url)} is ready (schema at head).")
    print(f"It holds {traces} traces, {jobs} scoring jobs and {scores} scores.")
    print("The traced demo application is not part of this version yet; nothing was scored.")
    return 0
