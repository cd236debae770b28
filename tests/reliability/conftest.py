"""Fault-injection suite: real Postgres, real judge server over HTTP, real subprocesses.

Long variants are marked ``slow``: they are skipped unless ``RECALLTRACE_SLOW=1`` (the scripts in
``benchmarks/`` set it), so CI runs the short variants only. The load tests (``test_load.py``)
belong to the real-system stage (``python -m pytest -m realsystem``); they and the saturated
host's test are also marked ``alone``: CI runs them with nothing beside them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Real-system tests that need the machine to themselves: the load test's latency figures, and a
# test that keeps every core busy on purpose (it would slow whatever runs beside it).
ALONE_MODULES = ("test_load.py", "test_saturated_reading.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in ALONE_MODULES and item.path.parent == Path(__file__).parent:
            item.add_marker(pytest.mark.realsystem)
            item.add_marker(pytest.mark.alone)
    if os.environ.get("RECALLTRACE_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long variant; run with RECALLTRACE_SLOW=1 (see benchmarks/)")
    here = os.path.dirname(__file__)
    for item in items:
        if "slow" in item.keywords and str(item.fspath).startswith(here):
            item.add_marker(skip)
