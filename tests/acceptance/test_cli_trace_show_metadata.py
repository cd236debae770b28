"""``trace show`` as a table shows each retrieved document's metadata (its source, page...),
as the JSON output always did."""

from __future__ import annotations

from pathlib import Path

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support.cli import run_cli
from tests.support.factories import make_repository, make_trace


def test_the_table_shows_document_metadata(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'show.db'}"
    upgrade(url)
    engine = create_engine_from_url(url)
    repo = make_repository(engine, metrics=["id_based_context_recall"])
    trace = make_trace()
    repo.write_traces([trace])
    engine.dispose()
    done = run_cli("trace", "show", trace.trace_id, "--database-url", url, env={"COLUMNS": "120"})
    assert done.returncode == 0, done.stderr
    for context in trace.retrieved_contexts:
        assert f'metadata {{"source": "{context.metadata["source"]}"}}' in done.stdout, done.stdout[
            -3000:
        ]
