"""Fault-injection suite: real Postgres, real judge server over HTTP, real subprocesses.

Long variants are marked ``slow``: they are skipped unless ``RECALLTRACE_SLOW=1`` (the scripts in
``benchmarks/`` set it), so CI runs the short variants only.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("RECALLTRACE_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long variant; run with RECALLTRACE_SLOW=1 (see benchmarks/)")
    here = os.path.dirname(__file__)
    for item in items:
        if "slow" in item.keywords and str(item.fspath).startswith(here):
            item.add_marker(skip)
