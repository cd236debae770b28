"""Fault-injection suite: real Postgres, real judge server over HTTP, real subprocesses.

Long variants are marked ``slow``: they are skipped unless ``RECALLTRACE_SLOW=1`` (the scripts in
``benchmarks/`` set it), so CI runs the short variants only. The load tests
(``test_load.py``) belong to the real-system stage (``python -m pytest -m realsystem``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REAL_SYSTEM_MODULES = ("test_load.py",)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in REAL_SYSTEM_MODULES and item.path.parent == Path(__file__).parent:
            item.add_marker(pytest.mark.realsystem)
    if os.environ.get("RECALLTRACE_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long variant; run with RECALLTRACE_SLOW=1 (see benchmarks/)")
    here = os.path.dirname(__file__)
    for item in items:
        if "slow" in item.keywords and str(item.fspath).startswith(here):
            item.add_marker(skip)
