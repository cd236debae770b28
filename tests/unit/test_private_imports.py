"""The tests and benchmarks use a public name where the product has one: importing a name from a
private module (``recalltrace.tracer._config``) when its package exports it (``recalltrace.tracer``)
ties them to the layout instead of the API users see."""

from __future__ import annotations

import ast
import importlib

from tests.support import ROOT


def _public_package(module: str) -> str:
    """The module path up to its first private part: ``recalltrace.tracer._config`` ->
    ``recalltrace.tracer``."""
    parts = module.split(".")
    for index, part in enumerate(parts):
        if part.startswith("_"):
            return ".".join(parts[:index])
    return module


def test_no_private_import_of_a_name_the_package_exports() -> None:
    wrong = []
    files = [*sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module and not node.level):
                continue
            if not node.module.startswith("recalltrace."):
                continue
            package = _public_package(node.module)
            if package == node.module:
                continue
            exported = set(getattr(importlib.import_module(package), "__all__", ()))
            for alias in node.names:
                if alias.name in exported:
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    wrong.append(f"{where}: {alias.name} from {package}, not {node.module}")
    assert wrong == []
