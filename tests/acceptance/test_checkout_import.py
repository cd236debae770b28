"""A script run inside a clone imports the clone's code, not the installed recalltrace: when the
two are different installations, importing says so once, naming both; the checkout that is
installed (``pip install -e .``) says nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def _import_in(folder: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", "import recalltrace; print(recalltrace.__file__)"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_clone_that_is_not_the_installed_one_says_so(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    done = _import_in(clone)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(clone / "recalltrace" / "__init__.py")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert f"importing the checkout at {clone}" in lines[0]
    assert "installed from" in lines[0]


def test_the_installed_checkout_and_other_folders_say_nothing(tmp_path: Path) -> None:
    for folder in (ROOT, tmp_path):
        done = _import_in(folder)
        assert done.returncode == 0, done.stderr
        assert "importing the checkout" not in done.stderr, (folder, done.stderr)
