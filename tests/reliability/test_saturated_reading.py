"""Plain values are read in full whatever the host's load.

Every core is kept busy by spinning processes while an app traces retrievals of 300 and of
30,000 plain documents (dicts with nested metadata, (document, score) pairs returned as a
tuple, strings) into SQLite and Postgres at sample rate 1: every stored record keeps every
document, no record says its reading was cut, and the ledger balances against the database's
rows. Before, reading a request's values had 2 s in all, which a 30,000-document record (and,
on a busy host, a 300-document one) overran: the record kept only the documents on its span.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import text

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from tests.support.ledger import LedgerCheck

# The real-system stage (every core kept busy on purpose).
pytestmark = pytest.mark.realsystem

APP = "saturated"
# (shape, documents, requests): 30,000 documents first, then the usual size.
PLAN = [
    ("dicts", 30_000, 1),
    ("dicts", 300, 8),
    ("pairs", 300, 4),
    ("texts", 300, 4),
]


@pytest.fixture
def saturated() -> Iterator[int]:
    """One spinning process per core, stopped at the end."""
    count = os.cpu_count() or 1
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield count
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait(30)


def _metadata(i: int) -> dict[str, Any]:
    return {"source": f"kb/{i}.md", "tags": ["faq", {"rank": i, "seen": [True, None, 1.5]}]}


def _dict_doc(i: int) -> dict[str, Any]:
    return {
        "id": f"d{i}",
        "content": f"Document {i} of the knowledge base, about topic {i % 97}.",
        "score": 1.0 / (i + 1),
        "metadata": _metadata(i),
    }


@recalltrace.retrieval
def search(shape: str, count: int) -> Any:
    if shape == "dicts":
        return [_dict_doc(i) for i in range(count)]
    if shape == "texts":
        return [_dict_doc(i)["content"] for i in range(count)]
    return tuple((_dict_doc(i), 1.0 / (i + 1)) for i in range(count))


@recalltrace.rag(APP, input_param="question")
def answer(question: str, shape: str, count: int) -> str:
    search(shape, count)
    recalltrace.set_attributes(metadata={"shape": shape, "nested": {"count": [count, {"k": 1}]}})
    return "answered"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_plain_documents_are_never_cut_on_a_saturated_host(
    backend: str, saturated: int, request: pytest.FixtureRequest
) -> None:
    url = str(
        request.getfixturevalue("sqlite_url" if backend == "sqlite" else "database_url_postgres")
    )
    check = LedgerCheck()
    recalltrace.configure(
        database_url=url,
        tracer_provider=TracerProvider(),
        service_name="saturated",
        sample_rate=1.0,
        flush_interval=0.05,
        shutdown_timeout=60.0,
        flush_timeout=600.0,
    )
    try:
        expected: dict[str, int] = {}
        for shape, count, times in PLAN:
            for k in range(times):
                question = f"{shape}-{count}-{k}"
                expected[question] = count
                assert answer(question, shape, count) == "answered"
        assert recalltrace.flush(600.0), "flush timed out"
        engine = create_engine_from_url(url)
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT t.user_input, t.notes, count(c.position), max(c.position) "
                        "FROM traces t LEFT JOIN retrieved_contexts c ON c.trace_id = t.trace_id "
                        "WHERE t.app_name = :app GROUP BY t.trace_id, t.user_input, t.notes"
                    ),
                    {"app": APP},
                ).all()
                last = conn.execute(
                    text(
                        "SELECT t.user_input, c.context_id, c.content, c.metadata "
                        "FROM traces t JOIN retrieved_contexts c ON c.trace_id = t.trace_id "
                        "WHERE t.app_name = :app AND c.position = 29999"
                    ),
                    {"app": APP},
                ).all()
        finally:
            engine.dispose()
        found = {row[0]: row for row in rows}
        assert set(found) == set(expected)
        kept = {question: found[question][2] for question in expected}
        assert kept == expected, "documents were cut"
        for question, notes, _count, highest in rows:
            assert highest == expected[question] - 1
            notes = json.loads(notes) if isinstance(notes, str) else notes
            assert not [note for note in notes or [] if "did not finish" in note], notes
        assert len(last) == 1
        for _question, doc_id, content, metadata in last:
            assert doc_id == "d29999"
            assert content == _dict_doc(29999)["content"]
            metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
            assert metadata == _metadata(29999)
        counts = check.assert_matches_database(url, apps=[APP])
        assert counts.seen == counts.stored == len(expected)
        assert not counts.dropped
    finally:
        recalltrace.shutdown(60.0)


@pytest.fixture
def database_url_postgres(postgres_url: str) -> str:
    from tests.support.postgres import truncate_all

    engine = create_engine_from_url(postgres_url)
    truncate_all(engine)
    engine.dispose()
    return postgres_url
