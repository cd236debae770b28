"""The worker reaches storage only through the layer's contracts: the job store it is handed
(``JobStore``), storage's error kinds, and opening a repository when it is handed none. Which
backend runs, its engine and its history queries stay storage's and the composition root's."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).resolve().parents[2] / "scorers" / "worker"
ALLOWED_STORAGE = {
    "recalltrace.storage.contracts",
    "recalltrace.storage.errors",
    "recalltrace.storage.repository",
}
STORAGE_INTERNALS = {"engine", "is_postgres", "notify_dsn", "dialect"}


def test_the_worker_imports_only_storage_contracts_and_touches_no_storage_internals() -> None:
    modules = sorted(WORKER.glob("*.py"))
    assert len(modules) > 5, modules
    found: list[str] = []
    for path in modules:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                module = node.module
                if module.startswith("recalltrace.storage") and module not in ALLOWED_STORAGE:
                    found.append(f"{path.name}:{node.lineno} imports {module}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("recalltrace.storage"):
                        found.append(f"{path.name}:{node.lineno} imports {alias.name}")
            elif isinstance(node, ast.Attribute) and node.attr in STORAGE_INTERNALS:
                found.append(f"{path.name}:{node.lineno} reads .{node.attr}")
    assert found == []


def test_recalltrace_run_worker_stores_the_history_summaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``recalltrace.run_worker`` (the Python twin of ``recalltrace worker``) hands the worker
    the warming of the history summaries, as the command does."""
    import recalltrace
    from recalltrace.scorers.worker import Worker, WorkerOptions, WorkerStats

    seen: list[Any] = []

    async def run(self: Worker, *, once: bool = False) -> WorkerStats:
        seen.append(self._warming._warm)
        return self.stats

    monkeypatch.setattr(Worker, "run", run)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    recalltrace.run_worker(WorkerOptions(database_url=url), once=True)
    assert len(seen) == 1 and callable(seen[0])
    seen[0]()  # the warming runs against the worker's database
