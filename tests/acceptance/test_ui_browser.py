"""``recalltrace ui`` in a real headless Chromium (Debian's ``chromium`` package; ``.ci/run``
installs it): every page loads with no console message (a script error, or anything the
Content-Security-Policy blocks, is one), the overview's charts are drawn on canvases, the
request holding ``<script>`` and ``onerror=`` markup shows it as text with no script run, and
each page's screenshot, at 1280x800 and at a phone's 390x844, is kept in the test's folder."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.test_ui import Served, filled_database, start_ui, stop
from tests.support.answers import require_tool

# The real-system stage (a browser).
pytestmark = pytest.mark.realsystem


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("ui-browser")
    url, hostile_id = filled_database(folder)
    process, base = start_ui(url)
    try:
        yield Served(url, base, process, hostile_id, folder / "ui.db")
    finally:
        stop(process)


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium (as root it needs --no-sandbox); its console goes to stderr."""
    executable = require_tool("chromium", "Debian's chromium package: apt-get install chromium")
    return subprocess.run(
        [
            executable,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def console_messages(stderr: str) -> list[str]:
    """What the pages said on their console (errors, CSP refusals, logs)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def pages(served: Served) -> dict[str, str]:
    return {
        "overview": "/?since=7d&bucket=hour",
        "traces": "/traces?metric=id_based_context_recall",
        "request": f"/traces/{served.hostile_id}",
        "compare": "/compare?metric=id_based_context_recall&baseline=2.4.0",
        "diagnose": "/diagnose?metric=id_based_context_recall&since=7d",
        "agreement": "/agreement?metric=id_based_context_recall",
        "jobs": "/jobs",
    }


def test_every_page_loads_with_no_console_message_and_is_kept_as_a_screenshot(
    served: Served, tmp_path: Path
) -> None:
    for name, path in pages(served).items():
        dom = chromium("--dump-dom", served.base + path)
        assert dom.returncode == 0, dom.stderr[-2000:]
        assert "</html>" in dom.stdout, name
        assert not console_messages(dom.stderr), (name, console_messages(dom.stderr))
        for size, label in (("1280,800", "desktop"), ("390,844", "phone")):
            shot = tmp_path / f"{name}-{label}.png"
            taken = chromium(f"--window-size={size}", f"--screenshot={shot}", served.base + path)
            assert taken.returncode == 0, taken.stderr[-2000:]
            assert shot.stat().st_size > 10_000, shot
    print(f"screenshots in {tmp_path}")


def test_the_overview_draws_a_chart_per_variant(served: Served) -> None:
    dom = chromium("--dump-dom", served.base + "/?since=7d&bucket=hour").stdout
    charts = re.findall(r'<div class="chart" data-metric="([a-z_]+)"[^>]*data-drawn="true"', dom)
    assert set(charts) >= {"id_based_context_recall", "non_llm_context_recall"}, dom[:3000]
    assert dom.count("<canvas") >= len(charts)


def test_stored_markup_runs_no_script(served: Served) -> None:
    dom = chromium("--dump-dom", served.base + f"/traces/{served.hostile_id}")
    assert not console_messages(dom.stderr), console_messages(dom.stderr)
    # The browser parsed the markup as text: no element came from it.
    assert "<img src=" not in dom.stdout
    assert "<script>alert" not in dom.stdout
    assert '&lt;script&gt;alert("stored")&lt;/script&gt;' in dom.stdout
