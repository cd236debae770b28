"""Text from users and models is shown inert: no escape sequence in a question, a document, an
app name, metadata or a judge's reason reaches the terminal through the human-readable output
of ``trace show``, ``scores worst`` or ``jobs list``."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from recalltrace.cli import main
from recalltrace.cli._render import inert
from recalltrace.scorers import ScoreResult
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.records import ContextRecord, TraceRecord
from tests.support.factories import make_repository

CLEAR = "\x1b[2J\x1b[H"
TITLE = "\x1b]0;pwned\x07"
LINK = "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"
C1_CSI = "\x9b31m"
RTL = "\u202egnp.exe"
EVIL = f"{CLEAR}{TITLE}{LINK}{C1_CSI}{RTL}[bold]markup[/bold]"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def run(*args: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(list(args))
    assert code == 0
    return out.getvalue()


def test_inert_shows_control_characters_as_their_escapes() -> None:
    assert inert("plain text\nwith a tab\t") == "plain text\nwith a tab\t"
    assert inert("\x1b[2J") == "\\x1b[2J"
    assert inert("\u202egnp") == "\\u202egnp"
    assert not any(raw in inert(EVIL) for raw in RAW)


def test_untrusted_text_reaches_no_terminal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'evil.db'}"
    upgrade(url)
    repo = make_repository(create_engine_from_url(url), metrics=["id_based_context_recall"])
    trace_id = "ab" * 16
    repo.write_traces(
        [
            TraceRecord(
                trace_id=trace_id,
                app_name=f"app{CLEAR}",
                service_name="svc",
                started_at=datetime.now(timezone.utc),
                duration_ms=1.0,
                user_input=f"question {EVIL}",
                response=f"answer {EVIL}",
                retrieved_contexts=[ContextRecord(f"doc {EVIL}", id=f"id{TITLE}")],
                reference_context_ids=["x"],
                metadata={f"key{LINK}": f"value {EVIL}"},
            )
        ]
    )
    (job,) = repo.claim_jobs("w", limit=1, lease=__import__("datetime").timedelta(minutes=1))
    result: Any = ScoreResult(
        metric="id_based_context_recall", value=0.0, status="scored", reason=f"judge {EVIL}"
    )
    repo.finish_job(job, result)
    outputs = [
        run("trace", "show", trace_id, "--database-url", url),
        run("scores", "worst", "--since", "1h", "--database-url", url),
        run("jobs", "list", "--database-url", url),
    ]
    for text in outputs:
        assert not any(raw in text for raw in RAW), repr(text[:2000])
    assert "\\x1b[2J" in outputs[0]  # shown, not acted on
    assert "[bold]" in outputs[0]  # markup shown as text, not applied
