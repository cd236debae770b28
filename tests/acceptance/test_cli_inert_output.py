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


# Values a spreadsheet runs as formulas (OWASP's CSV-injection list), stored as releases.
FORMULAS = [
    '=HYPERLINK("https://evil.example","x")',
    "+cmd|' /C calc'!A0",
    "@SUM(1+1)*cmd|x",
    "-2+3",
]


def _run_any(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    from contextlib import redirect_stderr

    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def _hostile_database(tmp_path: Path) -> str:
    """Traces whose every stored text holds escape sequences, and releases that are formulas,
    each scored."""
    url = f"sqlite:///{tmp_path / 'hostile.db'}"
    upgrade(url)
    repo = make_repository(create_engine_from_url(url), metrics=["id_based_context_recall"])
    records = []
    for index, release in enumerate([*FORMULAS, f"rel{EVIL}"]):
        records.append(
            TraceRecord(
                trace_id=f"{index:032x}",
                app_name=f"app{CLEAR}{TITLE}\x1b[8m",
                service_name=f"svc{C1_CSI}",
                started_at=datetime.now(timezone.utc),
                duration_ms=1.0,
                user_input=f"question {EVIL}",
                response=f"answer {EVIL}",
                retrieved_contexts=[ContextRecord(f"doc {EVIL}", id=f"id{TITLE}")],
                reference_context_ids=["x"],
                metadata={"captured_from": "spans", "capture_missing": ["response"]},
                release=release,
                environment=f"=env{RTL}",
                user_id=f"@user{CLEAR}",
                tags=[f"+tag{LINK}"],
            )
        )
    repo.write_traces(records)
    from datetime import timedelta

    for job in repo.claim_jobs("w", limit=100, lease=timedelta(minutes=1)):
        result: Any = ScoreResult(
            metric="id_based_context_recall", value=0.5, status="scored", reason=f"r {EVIL}"
        )
        repo.finish_job(job, result)
    repo.dispose()
    return url


READ_COMMANDS: list[tuple[str, ...]] = [
    ("doctor",),
    ("scores", "summary"),
    ("scores", "summary", "--by", "release"),
    ("scores", "summary", "--by", "tag"),
    ("scores", "worst"),
    ("scores", "worst", "--per-question"),
    ("scores", "compare", "--metric", "id_based_context_recall", "--by", "release"),
    ("scores", "compare", "--metric", "id_based_context_recall", "--by", "environment"),
    ("scores", "cost", "--by", "release"),
    ("scores", "cost", "--by", "user_id"),
    ("trace", "show", "0" * 32),
    ("jobs", "list"),
    ("jobs", "counts"),
    ("check", "--metric", "id_based_context_recall", "--min", "0.1"),
]


def _formats(command: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The output formats a command offers, read from its own parser."""
    from recalltrace.cli import build_parser

    parser = build_parser()
    for word in command:
        actions = [a for a in parser._actions if getattr(a, "choices", None)]
        sub = next((a for a in actions if isinstance(a.choices, dict) and word in a.choices), None)
        if sub is None:
            break
        parser = sub.choices[word]
    choices = next((a.choices for a in parser._actions if "--format" in a.option_strings), None)
    return [()] + [("--format", f) for f in (choices or ()) if f != "table"]


def test_every_read_command_in_every_format_keeps_stored_text_inert(tmp_path: Path) -> None:
    url = _hostile_database(tmp_path)
    runs = 0
    for command in READ_COMMANDS:
        for form in _formats(command):
            argv = [*command, *form, "--database-url", url]
            code, out, err = _run_any(*argv)
            assert code in (0, 1), (argv, code, err)
            for text in (out, err):
                found = [raw for raw in RAW if raw in text]
                assert not found, (argv, found, text[:1500])
            runs += 1
    assert runs >= 30, runs


def test_csv_cells_never_start_a_formula(tmp_path: Path) -> None:
    import csv

    url = _hostile_database(tmp_path)
    csv_commands = [c for c in READ_COMMANDS if ("--format", "csv") in _formats(c)]
    assert len(csv_commands) >= 6, csv_commands
    cells_seen: set[str] = set()
    for command in csv_commands:
        code, out, err = _run_any(*command, "--format", "csv", "--database-url", url)
        assert code in (0, 1), (command, err)
        rows = list(csv.reader(io.StringIO(out)))
        assert rows, command
        for row in rows:
            for cell in row:
                cells_seen.add(cell)
                assert not cell.startswith(("=", "+", "@", "\t", "\r")), (command, cell)
                if cell.startswith("-"):
                    float(cell)  # a negative number may start with "-"; text may not
    for formula in FORMULAS:
        assert "'" + formula in cells_seen, formula  # shown as text, prefixed with '


def test_doctor_shows_an_app_name_inert(tmp_path: Path) -> None:
    url = _hostile_database(tmp_path)
    code, out, _err = _run_any("doctor", "--database-url", url)
    assert code == 0
    assert "\x1b" not in out
    assert "app\\x1b[2J" in out and "\\x1b[8m" in out
