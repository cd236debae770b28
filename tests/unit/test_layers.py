"""Imports point one way: recalltrace (the composition root) -> tracer, scorers -> storage.

Read from the source with ``ast``, so an import hidden inside a function counts too.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.product import product_modules

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
    if module.startswith("recalltrace."):
        return "recalltrace"  # the rest of the composition root (compare, rescore, testing...)
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


# Strongly connected groups of modules that import each other in a circle today. Each one MUST
# GO: the test fails on any other cycle, and on an entry here that is no longer a cycle (remove
# it then).
KNOWN_CYCLES: set[frozenset[str]] = set()


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(source: str, name: str, *, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that the module ``name`` imports when it runs: at the top, in
    functions and in classes alike; not those under ``if TYPE_CHECKING:``, which never run.
    ``from package import name`` counts as an import of ``package.name`` when that is a
    module, else of ``package``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                for branch in child.orelse:
                    visit_one(branch)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: None if is_package else -1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                child = f"{module}.{alias.name}"
                found.add(child if child in known else module)
        else:
            visit(node)

    visit(ast.parse(source))
    return {module for module in found if module in known and module != name}


@functools.cache
def import_graph() -> dict[str, set[str]]:
    modules = product_modules()
    known = set(modules)
    return {
        name: runtime_imports(
            path.read_text(encoding="utf-8"),
            name,
            is_package=path.name == "__init__.py",
            known=known,
        )
        for name, path in modules.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The groups of modules that reach each other through imports (the strongly connected
    components of more than one module, or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: set[frozenset[str]] = set()

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                cycles.add(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


def test_the_product_has_no_import_cycle_but_the_known_ones() -> None:
    graph = import_graph()
    assert {"recalltrace.cli", "recalltrace.demo", "recalltrace.tracer._runtime"} <= set(graph)
    found = import_cycles(graph)

    def show(cycles: set[frozenset[str]]) -> list[str]:
        return sorted(
            " <-> ".join(
                f"{m} (imports {sorted(graph.get(m, set()) & group)})" for m in sorted(group)
            )
            for group in cycles
        )

    assert show(found - KNOWN_CYCLES) == [], "new import cycle"
    assert show(KNOWN_CYCLES - found) == [], "no longer a cycle: remove it from KNOWN_CYCLES"


def test_the_cycle_check_sees_imports_inside_functions() -> None:
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c"}
    a = "from pkg import b\n"
    b = "def later():\n    from pkg.a import thing\n"
    c = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    graph = {
        "pkg.a": runtime_imports(a, "pkg.a", is_package=False, known=known),
        "pkg.b": runtime_imports(b, "pkg.b", is_package=False, known=known),
        "pkg.c": runtime_imports(c, "pkg.c", is_package=False, known=known),
    }
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": set()}
    assert import_cycles(graph) == {frozenset({"pkg.a", "pkg.b"})}
    relative = "from . import a\nfrom .b import x\n"
    assert runtime_imports(relative, "pkg", is_package=True, known=known) == {"pkg.a", "pkg.b"}
    assert runtime_imports(relative, "pkg.c", is_package=False, known=known) == {"pkg.a", "pkg.b"}


def test_only_the_command_line_imports_the_command_line() -> None:
    """The CLI is a client of the library: the demo, the wiring and the rest of the composition
    root never import it (only ``python -m recalltrace`` starts it)."""
    wrong = []
    for name, targets in sorted(import_graph().items()):
        if part_of(name) == "recalltrace.cli" or name == "recalltrace.__main__":
            continue
        wrong.extend(
            f"{name} imports {t}" for t in sorted(targets) if t.startswith("recalltrace.cli")
        )
    assert wrong == []


def test_the_command_line_groups_are_each_one_module() -> None:
    graph = import_graph()
    groups = graph["recalltrace.cli"]
    expected = {"db", "demo", "scores", "check", "trace", "jobs", "worker", "collect", "doctor"}
    assert {f"recalltrace.cli.{name}" for name in expected} <= groups


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
