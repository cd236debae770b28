"""Imports point one way: recalltrace (the composition root) -> tracer, scorers -> storage.

Read from the source with ``ast``, so an import hidden inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import ROOT

# folder -> the installed name of each part it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    # storage runs the Alembic scripts shipped in migrations (it only locates the folder)
    "storage": {"recalltrace.migrations"},
    "migrations": {"recalltrace.storage"},
    "tracer": {"recalltrace.storage"},
    "scorers": {"recalltrace.storage"},
}
PARTS = {
    "recalltrace.storage",
    "recalltrace.tracer",
    "recalltrace.scorers",
    "recalltrace.migrations",
    "recalltrace.cli",
    "recalltrace.demo",
    "recalltrace._wiring",
}
OWN = {folder: f"recalltrace.{folder}" for folder in ALLOWED}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append((node.lineno, "." * node.level + (node.module or "")))
            elif node.module == "recalltrace":
                found.extend((node.lineno, f"recalltrace.{a.name}") for a in node.names)
            elif node.module is not None:
                found.append((node.lineno, node.module))
    return found


def part_of(module: str) -> str | None:
    if module == "recalltrace":
        return "recalltrace"
    for part in PARTS:
        if module == part or module.startswith(part + "."):
            return part
    return None


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_each_part_imports_only_what_lies_below_it(folder: str) -> None:
    wrong = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, module in imported_modules(path):
            if module.startswith("."):
                wrong.append(f"{path.relative_to(ROOT)}:{line} relative import {module}")
                continue
            part = part_of(module)
            if part is None or part == OWN[folder]:
                continue
            if part not in ALLOWED[folder]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert wrong == []


def test_no_part_imports_the_composition_root() -> None:
    wrong = []
    for folder in ALLOWED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, module in imported_modules(path):
                if part_of(module) in {"recalltrace", "recalltrace.cli", "recalltrace._wiring"}:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert wrong == []


def test_the_command_line_modules_import_without_cycles() -> None:
    """Command groups use the shared modules (_args, _render, _charts), never each other in
    a circle."""
    cli = ROOT / "recalltrace" / "cli"
    graph: dict[str, set[str]] = {}
    for path in cli.glob("*.py"):
        name = f"recalltrace.cli.{path.stem}" if path.stem != "__init__" else "recalltrace.cli"
        graph[name] = {
            module
            for _, module in imported_modules(path)
            if module.startswith("recalltrace.cli.") and module != name
        }
    graph["recalltrace.cli"] = set()  # the parser imports every group lazily, by design

    def visit(node: str, path: list[str]) -> None:
        assert node not in path, " -> ".join([*path, node])
        for target in sorted(graph.get(node, ())):
            visit(target, [*path, node])

    for start in sorted(graph):
        visit(start, [])
    assert {"recalltrace.cli.db", "recalltrace.cli.scores", "recalltrace.cli.trace"} <= set(graph)
    assert {"recalltrace.cli.jobs", "recalltrace.cli.worker"} <= set(graph)


def test_every_package_folder_is_installed() -> None:
    """pyproject lists the packages one by one (the folders are mapped under recalltrace)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    listed = set(config["setuptools"]["packages"])
    mapping = config["setuptools"]["package-dir"]
    found = set()
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *relative)))
    assert found == listed
