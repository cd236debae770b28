"""``recalltrace ui`` as a user runs it: the real command serving a filled SQLite database (the
demo's requests, two releases a day apart, and one request whose every stored text holds
markup), fetched over real HTTP. Every page answers with the stored figures, every link of the
overview leads somewhere, stored markup is shown as text, the database is never written, and a
host other than the loopback needs a token."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from sqlalchemy import Engine, func, select

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.records import ContextRecord, TraceRecord
from tests.support.answers import free_port
from tests.support.factories import make_history, make_repository, new_trace_id

HOSTILE = '<script>alert("stored")</script><img src=x onerror=alert(1)>'
"""Markup stored in every text of one request: it must reach the page as text."""
RELEASE_OLD, RELEASE_NEW = "2.4.0", "2.5.0"
PER_RELEASE = 40
LABELLED = 10


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _recalltrace(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recalltrace", *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=timeout,
    )


def _release_traces() -> list[TraceRecord]:
    """Two releases of one app: 2.4.0 two days ago retrieves every reference document, 2.5.0
    an hour ago misses one of two in three requests of four."""
    now = datetime.now(timezone.utc)
    records = []
    for release, started, misses in (
        (RELEASE_OLD, now - timedelta(days=2), 0),
        (RELEASE_NEW, now - timedelta(hours=1), 3),
    ):
        for i in range(PER_RELEASE):
            missed = i % 4 < misses
            records.append(
                TraceRecord(
                    trace_id=new_trace_id(),
                    app_name="release-bot",
                    service_name="release-service",
                    started_at=started + timedelta(seconds=i),
                    duration_ms=30.0,
                    user_input=f"How do I reset setting {i}?",
                    response="Open the settings page.",
                    retrieved_contexts=[
                        ContextRecord(
                            content="Settings live under the gear icon.", id="kb-a", score=0.9
                        ),
                        ContextRecord(
                            content="Resetting restores the defaults.",
                            id="kb-x" if missed else "kb-b",
                            score=0.7,
                        ),
                    ],
                    reference="Open the settings page and press reset.",
                    reference_context_ids=["kb-a", "kb-b"],
                    release=release,
                    environment="production",
                )
            )
    return records


def _hostile_trace() -> TraceRecord:
    return TraceRecord(
        trace_id=new_trace_id(),
        app_name="release-bot",
        service_name="release-service",
        started_at=datetime.now(timezone.utc) - timedelta(minutes=5),
        duration_ms=12.0,
        user_input=f"question {HOSTILE}",
        response=f"answer {HOSTILE}",
        retrieved_contexts=[
            ContextRecord(
                content=f"document {HOSTILE}",
                id="kb-hostile",
                score=0.5,
                metadata={"source": HOSTILE},
            )
        ],
        reference=f"reference {HOSTILE}",
        reference_context_ids=["kb-hostile", "kb-absent"],
        metadata={"note": HOSTILE},
        notes=[f"note {HOSTILE}"],
        release=RELEASE_NEW,
        environment="production",
        tags=[f"tag{HOSTILE}"],
    )


@dataclass
class Served:
    """A running ``recalltrace ui`` and what it serves."""

    url: str
    base: str
    process: subprocess.Popen[str]
    hostile_id: str
    db_path: Path


def start_ui(url: str, *extra: str, port: int | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start ``recalltrace ui`` on ``url``; return it and the address it printed."""
    port = port or free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "recalltrace",
            "ui",
            "--database-url",
            url,
            "--port",
            str(port),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            process.wait(10)
            raise AssertionError(
                f"recalltrace ui did not start: {process.stderr.read() if process.stderr else ''}"
            )
        found = re.search(r"http://\S+", line)
        assert found, line
        base = found.group(0).split("/?")[0].rstrip("/")
        token = _token_of(extra)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(base + "/static/ui.css", timeout=5, headers=headers)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    except BaseException:
        stop(process)  # never left running behind a failed start
        raise
    return process, base


def _token_of(extra: tuple[str, ...]) -> str:
    return extra[extra.index("--auth-token") + 1] if "--auth-token" in extra else ""


def stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    """Ctrl-C the process; its exit code and stderr."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
        raise AssertionError("recalltrace ui did not stop within 20 s of Ctrl-C") from None
    return process.returncode, process.stderr.read() if process.stderr else ""


def filled_database(folder: Path) -> tuple[str, str]:
    """The demo's database with two releases and the hostile request added and scored by a
    real ``worker --once``; its URL and the hostile request's id."""
    path = folder / "ui.db"
    url = f"sqlite:///{path}"
    demo = _recalltrace("demo", "--database-url", url)
    assert demo.returncode == 0, demo.stderr[-2000:]
    engine = create_engine_from_url(url)
    hostile = _hostile_trace()
    releases = _release_traces()
    make_repository(engine).write_traces([*releases, hostile])
    engine.dispose()
    # A person labels the first ten requests of 2.5.0 as fully recalled.
    labelled = [r for r in releases if r.release == RELEASE_NEW][:LABELLED]
    labels = folder / "labels.csv"
    labels.write_text(
        "trace_id,metric,value,note\n"
        + "".join(f"{r.trace_id},id_based_context_recall,1,all there\n" for r in labelled),
        encoding="utf-8",
    )
    imported = _recalltrace(
        "labels", "import", str(labels), "--labeller", "ana", "--database-url", url
    )
    assert imported.returncode == 0, imported.stderr
    worker = _recalltrace("worker", "--once", "--no-progress", "--database-url", url)
    assert "Traceback" not in worker.stderr, worker.stderr[-2000:]
    return url, hostile.trace_id


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("ui")
    url, hostile_id = filled_database(folder)
    process, base = start_ui(url)
    try:
        yield Served(url, base, process, hostile_id, folder / "ui.db")
    finally:
        stop(process)


class Links(HTMLParser):
    """The href and src addresses of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.found.append(value)


def links_of(page: str) -> list[str]:
    parser = Links()
    parser.feed(page)
    return parser.found


def get(served: Served, path: str) -> httpx.Response:
    return httpx.get(served.base + path, timeout=60)


def _shown(value: float) -> str:
    return f"{value:.3f}"


def test_overview_shows_each_variant_with_its_releases_and_the_queue(served: Served) -> None:
    engine = create_engine_from_url(served.url)
    history = make_history(engine)
    since = datetime.now(timezone.utc) - timedelta(days=7)
    stats = {
        m: history.window(metric=m, since=since)
        for m in ("id_based_context_recall", "non_llm_context_recall")
    }
    groups = history.group_summaries(metric="id_based_context_recall", by="release", since=since)
    engine.dispose()
    response = get(served, "/")
    assert response.status_code == 200
    page = response.text
    for metric, window in stats.items():
        assert window.count > 0
        assert f"{window.count} scored, mean <strong>{_shown(window.mean or 0)}</strong>" in page, (
            metric
        )
    # the releases with their means and the verdict of the new one against the old one
    assert groups[RELEASE_OLD].count == PER_RELEASE
    new = groups[RELEASE_NEW]
    assert f"<td>{new.count}</td><td>{_shown(new.total / new.count)}</td>" in page
    assert "verdict-worse" in page
    # the chart's data and the markers of both releases, for the shipped script
    assert 'id="chart-data"' in page and '"releases": [[' in page
    assert RELEASE_OLD in page and RELEASE_NEW in page
    assert '<script src="/static/uplot/uPlot.iife.min.js"></script>' in page
    assert "recalltrace scores summary --since 7d --bucket day" in page
    assert '<h2 id="queue-heading">Queue</h2>' in page
    # security headers on every answer
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"


def test_every_link_of_the_overview_and_of_the_pages_it_links_resolves(served: Served) -> None:
    seen: dict[str, int] = {}
    overview = get(served, "/").text
    first = {urljoin(served.base + "/", link) for link in links_of(overview)}
    assert any("/traces?" in link for link in first), first
    assert any("/diagnose?" in link for link in first), first
    second: set[str] = set()
    for link in sorted(first):
        if urlsplit(link).netloc != urlsplit(served.base).netloc:
            continue
        response = httpx.get(link, timeout=60)
        seen[link] = response.status_code
        if response.headers.get("content-type", "").startswith("text/html"):
            second.update(urljoin(link, found) for found in links_of(response.text))
    for link in sorted(second - set(seen)):
        if urlsplit(link).netloc == urlsplit(served.base).netloc:
            seen[link] = httpx.get(link, timeout=60).status_code
    broken = {link: status for link, status in seen.items() if status != 200}
    assert not broken, broken
    assert len(seen) >= 15, sorted(seen)
    assert any(re.search(r"/traces/[0-9a-f]{32}$", link) for link in seen), sorted(seen)


def test_requests_are_filtered_sorted_and_paged_by_the_database(served: Served) -> None:
    engine = create_engine_from_url(served.url)
    history = make_history(engine)
    worst = history.worst(
        metric="id_based_context_recall", limit=1, where=[("release", RELEASE_NEW)]
    )
    engine.dispose()
    base = "/traces?metric=id_based_context_recall&release=2.5.0"
    page = get(served, base).text
    # 30 of the 40 requests of 2.5.0 miss a document, the hostile one misses one of two too
    assert "<strong>41</strong> scored results match; page 1 of 1." in page
    assert f"/traces/{worst[0].trace_id}" in page
    low = get(served, base + "&max=0.5").text
    assert "<strong>31</strong> scored results match" in low
    high = get(served, base + "&min=0.9&sort=-value").text
    assert "<strong>10</strong> scored results match" in high
    assert (
        "recalltrace scores worst --since 7d --metric id_based_context_recall --where release=2.5.0"
        in page
    )
    # pages of 50: every scored result of the window, in order, the second page the rest
    first = get(served, "/traces?sort=time").text
    total = int(re.search(r"<strong>(\d+)</strong> scored results match", first).group(1))  # type: ignore[union-attr]
    assert total > 50
    second = get(served, "/traces?sort=time&page=2").text
    assert f"page 2 of {-(-total // 50)}" in second
    assert second.count('<td class="value">') == min(50, total - 50)
    refused = get(served, "/traces?min=lots")
    assert refused.status_code == 400
    assert "min must be a number from 0 to 1, not &#39;lots&#39;" in refused.text


def test_one_request_shows_documents_references_and_evidence(served: Served) -> None:
    engine = create_engine_from_url(served.url)
    history = make_history(engine)
    lowest = history.worst(
        metric="id_based_context_recall", limit=5, where=[("release", RELEASE_NEW)]
    )
    worst = next(row for row in lowest if row.trace_id != served.hostile_id)
    detail = history.trace(worst.trace_id)
    engine.dispose()
    page = get(served, f"/traces/{worst.trace_id}").text
    assert "How do I reset setting" in page
    assert "<code>kb-a</code>" in page and "retrieved at rank 1" in page
    assert "missed: not retrieved" in page
    assert "missing ids" in page  # the evidence of id_based_context_recall
    for score in detail.scores:
        assert score.metric in page
    assert f"recalltrace trace show {worst.trace_id}" in page
    assert get(served, "/traces/" + "0" * 32).status_code == 404
    assert get(served, "/traces/not-an-id").status_code == 404


def test_compare_and_diagnose_name_the_worse_release(served: Served) -> None:
    page = get(
        served,
        f"/compare?metric=id_based_context_recall&baseline={RELEASE_OLD}&candidate={RELEASE_NEW}",
    ).text
    assert "verdict-worse" in page and ">worse<" in page
    assert (
        "recalltrace scores compare --metric id_based_context_recall --by release --since 7d "
        "--baseline 2.4.0" in page
    )
    unknown = get(served, "/compare?baseline=9.9.9")
    assert unknown.status_code == 400
    diagnose = get(served, "/diagnose?metric=id_based_context_recall&since=7d").text
    slice_links = re.findall(r'<a class="slice" href="([^"]+)"', diagnose)
    assert slice_links, diagnose[-3000:]
    assert any("tag=mobile-app" in link for link in slice_links), slice_links
    for link in slice_links:
        target = get(served, link.replace("&amp;", "&"))
        assert target.status_code == 200
        assert re.search(r"<strong>[1-9]\d*</strong> scored results match", target.text), link


def test_jobs_page_shows_the_queue_and_the_cost(served: Served) -> None:
    page = get(served, "/jobs").text
    assert "Queue per variant" in page
    assert "recalltrace jobs list --since 7d" in page
    # the LLM variants have no judge here: their jobs are due and age
    assert "llm_context_recall" in page


def test_stored_markup_is_shown_as_text_everywhere(served: Served) -> None:
    pages = [
        f"/traces/{served.hostile_id}",
        "/traces?app=release-bot&sort=-time",
        "/",
        "/compare?by=tag",
    ]
    for path in pages:
        response = get(served, path)
        assert response.status_code == 200, path
        assert "<script>alert" not in response.text, path
        assert "<img src=x" not in response.text, path
        assert "onerror=alert(1)>" not in response.text or "&lt;img" in response.text, path
    page = get(served, f"/traces/{served.hostile_id}").text
    escaped = (
        "&lt;script&gt;alert(&#34;stored&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"
    )
    for where in ("question ", "answer ", "document ", "reference ", "note "):
        assert where + escaped in page, where
    assert "missed: not retrieved" in page  # kb-absent


def test_the_database_is_never_written(served: Served) -> None:
    before = hashlib.sha256(served.db_path.read_bytes()).hexdigest()
    for path in ("/", "/traces", "/compare", "/diagnose?metric=id_based_context_recall", "/jobs"):
        assert get(served, path).status_code == 200
    assert hashlib.sha256(served.db_path.read_bytes()).hexdigest() == before
    engine = create_engine_from_url(served.url)
    from recalltrace.storage.models import Score

    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Score))
    engine.dispose()


def test_another_host_without_a_token_is_refused_in_one_line(tmp_path: Path) -> None:
    result = _recalltrace(
        "ui", "--host", "0.0.0.0", "--database-url", f"sqlite:///{tmp_path / 'none.db'}"
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "--host 0.0.0.0 lets other machines in: give --auth-token TOKEN" in lines[0]


def test_with_a_token_every_page_needs_it(served: Served) -> None:
    token = "t0k3n-" + new_trace_id()
    process, base = start_ui(served.url, "--host", "0.0.0.0", "--auth-token", token)
    address = base.replace("0.0.0.0", "127.0.0.1")
    try:
        for path in ("/", "/traces", "/static/ui.css", f"/traces/{served.hostile_id}"):
            refused = httpx.get(address + path, timeout=30)
            assert refused.status_code == 401, path
            assert refused.text.count("\n") == 1 and "needs its access token" in refused.text
        assert (
            httpx.get(
                address + "/", headers={"authorization": "Bearer wrong"}, timeout=30
            ).status_code
            == 401
        )
        assert (
            httpx.get(
                address + "/", headers={"authorization": f"Bearer {token}"}, timeout=60
            ).status_code
            == 200
        )
        with httpx.Client(base_url=address, timeout=60) as browser:
            opened = browser.get(f"/traces?metric=id_based_context_recall&token={token}")
            assert opened.status_code == 303
            assert opened.headers["location"] == "/traces?metric=id_based_context_recall"
            assert "httponly" in opened.headers["set-cookie"].lower()
            assert browser.get("/jobs").status_code == 200  # the cookie carries it
            assert browser.get(f"/?token=wrong{token}").status_code == 401
            # the redirect stays on this site, whatever the path
            away = httpx.get(f"{address}//example.org/traces?token={token}", timeout=60)
            assert away.headers["location"] == "/example.org/traces"
    finally:
        _code, stderr = stop(process)
    assert "Traceback" not in stderr


def test_ctrl_c_stops_it_cleanly(served: Served) -> None:
    process, base = start_ui(served.url)
    assert httpx.get(base + "/", timeout=60).status_code == 200
    code, stderr = stop(process)
    assert code == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == "recalltrace ui: stopped"
    with pytest.raises(httpx.TransportError):
        httpx.get(base + "/", timeout=5)


def test_demo_ends_on_the_ui(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "recalltrace",
            "demo",
            "--database-url",
            f"sqlite:///{tmp_path / 'demo.db'}",
            "--ui",
            "--ui-port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert process.stdout is not None
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("recalltrace ui: http://"):
                break
        address = re.search(r"http://\S+", lines[-1]).group(0)  # type: ignore[union-attr]
        assert address == f"http://127.0.0.1:{port}/?since=1d&bucket=hour"
        page = httpx.get(address, timeout=60)
        assert page.status_code == 200
        assert "72 scored, mean" in page.text
    finally:
        _code, stderr = stop(process)
    assert "Traceback" not in stderr


def _row_counts(engine: Engine) -> dict[str, int]:
    """Rows of every table of the database (the read caches included)."""
    from sqlalchemy import inspect, text

    names = inspect(engine).get_table_names()
    with engine.connect() as conn:
        return {
            name: int(conn.execute(text(f'SELECT count(*) FROM "{name}"')).scalar_one())
            for name in names
        }


@pytest.mark.postgres
def test_on_postgres_the_pages_read_and_never_fill_the_caches(
    pg_engine: Engine, postgres_url: str
) -> None:
    # Ended hours two days ago: `scores summary` would store their summaries in the cache.
    make_repository(pg_engine).write_traces(_release_traces())
    worker = _recalltrace("worker", "--once", "--no-progress", "--database-url", postgres_url)
    assert "Traceback" not in worker.stderr, worker.stderr[-2000:]
    before = _row_counts(pg_engine)
    assert before["scores"] >= 2 * PER_RELEASE
    process, base = start_ui(postgres_url)
    try:
        for path in (
            "/?since=7d&bucket=hour",
            "/?since=7d",
            "/traces?release=2.5.0",
            f"/compare?metric=id_based_context_recall&baseline={RELEASE_OLD}",
            "/diagnose?metric=id_based_context_recall&since=7d",
            "/jobs",
        ):
            response = httpx.get(base + path, timeout=60)
            assert response.status_code == 200, (path, response.text[-1500:])
        overview = httpx.get(base + "/?since=7d", timeout=60).text
        assert "verdict-worse" in overview
    finally:
        _code, stderr = stop(process)
    assert "Traceback" not in stderr
    assert _row_counts(pg_engine) == before


def test_without_the_ui_extra_one_line_says_how_to_install_it(tmp_path: Path) -> None:
    # The web stack made unimportable in this interpreter, as where the extra is not installed.
    program = (
        "import sys\n"
        "sys.modules['starlette'] = None\n"
        "from recalltrace.cli import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n"
    )
    demo_db = tmp_path / "demo.db"
    for argv in (
        ["ui", "--database-url", f"sqlite:///{tmp_path / 'none.db'}"],
        ["demo", "--ui", "--database-url", f"sqlite:///{demo_db}"],
    ):
        result = subprocess.run(
            [sys.executable, "-c", program, *argv],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=120,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            "recalltrace: error: recalltrace ui needs the ui extra (starlette missing): "
            "pip install 'recalltrace[ui]'"
        ]
    assert not demo_db.exists()  # refused before the demo wrote anything


def test_agreement_measures_the_judge_against_the_labels(served: Served) -> None:
    # Of the ten labelled requests (all labelled 1), eight scored 0.5 (i % 4 < 3) and two 1.
    page = get(served, "/agreement?metric=id_based_context_recall&threshold=0.75").text
    assert f"{LABELLED} labelled requests" in page
    assert '<th scope="row">mean absolute error</th><td>0.400</td>' in page
    assert '<th scope="row">judge pass</th><td>2</td><td>0</td>' in page
    assert '<th scope="row">judge fail</th><td>8</td><td>0</td>' in page
    assert "recalltrace scores agreement --since 90d --metric id_based_context_recall " in page
    assert page.count('<a href="/traces/') == 8  # the disagreements, each linking to its request
    assert get(served, "/agreement").status_code == 200
    assert get(served, "/agreement?metric=id_based_context_recall&threshold=2").status_code == 400


def test_the_judge_budget_and_the_link_to_the_tracing_backend(served: Served) -> None:
    engine = create_engine_from_url(served.url)
    demo = make_history(engine).worst(metric="id_based_context_recall", app="lumen-help-desk")[0]
    otel = make_history(engine).trace(demo.trace_id).otel_trace_id
    engine.dispose()
    assert otel
    link = "http://jaeger.example/trace/{otel_trace_id}"
    process, base = start_ui(served.url, "--judge-budget", "2.5/day", "--trace-link", link)
    try:
        jobs = httpx.get(base + "/jobs", timeout=60).text
        assert "Budget: 2.5 USD per day" in jobs
        assert "Nothing spent in this period." in jobs  # the demo ran without a judge
        page = httpx.get(f"{base}/traces/{demo.trace_id}", timeout=60).text
        assert f'<a href="http://jaeger.example/trace/{otel}" rel="noopener noreferrer">' in page
    finally:
        _code, stderr = stop(process)
    assert "Traceback" not in stderr
    for option, value, said in (
        ("--trace-link", "javascript:alert(1)//{otel_trace_id}", "--trace-link must be an http(s)"),
        ("--judge-budget", "lots", "--judge-budget: expected a budget like 50/day"),
    ):
        refused = _recalltrace("ui", "--database-url", served.url, option, value)
        assert refused.returncode == 2
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert said in refused.stderr


def test_a_database_file_whose_path_holds_uri_characters(served: Served, tmp_path: Path) -> None:
    # The read-only SQLite file is opened by a URI: "#" and "%" in its path are encoded.
    import shutil

    folder = tmp_path / "team #1 %20 data"
    folder.mkdir()
    for suffix in ("", "-wal"):
        source = Path(f"{served.db_path}{suffix}")
        if source.exists():
            shutil.copy(source, folder / f"ui.db{suffix}")
    process, base = start_ui(f"sqlite:///{folder / 'ui.db'}")
    try:
        page = httpx.get(base + "/traces?metric=id_based_context_recall&release=2.5.0", timeout=60)
        assert page.status_code == 200
        assert "<strong>41</strong> scored results match" in page.text
    finally:
        _code, stderr = stop(process)
    assert "Traceback" not in stderr
