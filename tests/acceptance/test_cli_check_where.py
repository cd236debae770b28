"""``check --min`` on the traces ``--where`` selects (it was refused without ``--compare-to``):
the demo's mobile-app slice, whose index is stale, fails a threshold the web slice passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.cli import run_cli

METRIC = "id_based_context_recall"


def test_check_min_reads_only_the_traces_where_selects(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    demo = subprocess.run(
        [sys.executable, "-m", "recalltrace", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stderr
    url = f"sqlite:///{tmp_path / 'recalltrace.db'}"

    def check(*where: str) -> subprocess.CompletedProcess[str]:
        args = ["check", "--metric", METRIC, "--since", "1d", "--min", "0.5", *where]
        return run_cli(*args, "--database-url", url, env=env)

    mobile = check("--where", "tag=mobile-app")
    assert mobile.returncode == 1, mobile.stderr
    assert "mean 0.1667 is below 0.5 over 36 scored traces" in mobile.stderr
    assert mobile.stderr.strip().endswith("tag=mobile-app")
    web = check("--where", "tag=web")
    assert web.returncode == 0, web.stderr
    assert "mean 0.6667 is at least 0.5 over 36 scored traces" in web.stdout
    everything = check()
    assert everything.returncode == 1
    assert "over 72 scored traces" in everything.stderr
    # Two filters: both hold (a user no trace has selects nothing).
    nobody = check("--where", "tag=web", "--where", "user_id=nobody")
    assert nobody.returncode == 1
    assert "0 scored traces" in nobody.stderr and "user_id=nobody" in nobody.stderr
