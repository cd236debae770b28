"""``recalltrace labels import`` scrubs what people typed (note, labeller, claims) with the
scrubbing the environment configures, as the tracer scrubs records, on SQLite and Postgres."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sqlalchemy import select

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.models import Label
from tests.support import ROOT
from tests.support.cli import run_cli
from tests.support.factories import make_repository, make_trace

METRIC = "id_based_context_recall"
GITHUB = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
AWS = "AKIAZ7QX4LM2RT6WPB5N"
CARD = "4539148803436467"
EMAIL = "jane.doe@example.org"
SECRETS = (GITHUB, AWS, CARD, EMAIL)


def _import(url: str, path: Path, labeller: str, **env_extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env.update(env_extra)
    done = run_cli(
        "labels", "import", str(path), "--labeller", labeller, "--metric", METRIC,
        "--database-url", url, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _stored(url: str) -> list[tuple[str, str | None, object]]:
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        rows = conn.execute(select(Label.labeller, Label.note, Label.claims)).all()
    engine.dispose()
    return [(row.labeller, row.note, row.claims) for row in rows]


def _trace_ids(url: str, count: int) -> list[str]:
    records = [make_trace() for _ in range(count)]
    repo = make_repository(create_engine_from_url(url), metrics=[METRIC])
    repo.write_traces(records)
    repo.dispose()
    return [record.trace_id for record in records]


def test_note_labeller_and_claims_are_scrubbed(database_url: str, tmp_path: Path) -> None:
    first, second = _trace_ids(database_url, 2)
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text(
        "trace_id,value,note\n"
        f'{first},0.5,"asked by {EMAIL}, card {CARD}"\n'
        f"{second},1,token {GITHUB} key {AWS}\n"
    )
    out = _import(database_url, csv_file, f"ana <{EMAIL}>")
    jsonl = tmp_path / "claims.jsonl"
    claims = [{"claim": f"the key is {AWS}", "ok": False, "by": EMAIL}]
    jsonl.write_text(json.dumps({"trace_id": first, "value": 0.0, "claims": claims}) + "\n")
    _import(database_url, jsonl, "bo")
    rows = _stored(database_url)
    assert len(rows) == 3
    text = json.dumps(rows) + out
    for secret in SECRETS:
        assert secret not in text
    assert {labeller for labeller, _, _ in rows} == {"ana <[REDACTED]>", "bo"}
    assert "asked by [REDACTED], card [REDACTED]" in {note for _, note, _ in rows}
    (stored_claims,) = [c for _, _, c in rows if c]
    assert stored_claims == [{"claim": "the key is [REDACTED]", "ok": False, "by": "[REDACTED]"}]


def test_scrubbing_switched_off_stores_labels_as_typed(database_url: str, tmp_path: Path) -> None:
    (trace_id,) = _trace_ids(database_url, 1)
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text(f"trace_id,value,note\n{trace_id},0.5,mail {EMAIL}\n")
    _import(database_url, csv_file, "ana", RECALLTRACE_SCRUBBING="0")
    assert _stored(database_url) == [("ana", f"mail {EMAIL}", None)]
