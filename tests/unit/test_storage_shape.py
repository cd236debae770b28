"""House rules for storage's shape: modules stay small, and what differs between Postgres and
SQLite is decided by the dialect (``storage/_dialect.py``, its statements in
``storage/_postgres.py``), not by branches on the backend spread through the product.

Read from the source with ``ast``: a test of the backend is an ``if``, conditional expression,
``while`` or boolean operand whose condition reads ``is_postgres`` or a ``.postgres`` attribute.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import ROOT

PRODUCT = ("recalltrace", "tracer", "scorers", "storage")
DIALECT_MODULES = {Path("storage/_dialect.py"), Path("storage/_postgres.py")}
MOST_LINES = 800
MOST_BACKEND_TESTS = 3


def _reads_backend(node: ast.AST) -> bool:
    for inner in ast.walk(node):
        if isinstance(inner, ast.Attribute) and inner.attr in ("postgres", "is_postgres"):
            return True
        if isinstance(inner, ast.Name) and inner.id == "is_postgres":
            return True
    return False


def backend_tests(path: Path) -> list[int]:
    """Lines of ``path`` that branch on whether the backend is Postgres."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        conditions: list[ast.AST] = []
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            conditions.append(node.test)
        elif isinstance(node, ast.BoolOp):
            conditions.extend(node.values)
        elif isinstance(node, ast.comprehension):
            conditions.extend(node.ifs)
        lines.extend(c.lineno for c in conditions if isinstance(c, ast.expr) and _reads_backend(c))
    return sorted(set(lines))


def test_no_storage_module_is_over_800_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted((ROOT / "storage").rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MOST_LINES
    }
    assert not long, f"storage modules over {MOST_LINES} lines (split them by job): {long}"


def test_storage_branches_on_the_backend_only_in_its_dialect() -> None:
    found = {
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "storage").rglob("*.py"))
        if path.relative_to(ROOT) not in DIALECT_MODULES
        for line in backend_tests(path)
    }
    assert not found, f"give these branches to storage/_dialect.py's Dialect: {sorted(found)}"


def test_the_product_branches_on_the_backend_at_most_three_times() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in PRODUCT
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.relative_to(ROOT) not in DIALECT_MODULES
        for line in backend_tests(path)
    ]
    assert len(found) <= MOST_BACKEND_TESTS, f"tests of the backend outside the dialect: {found}"


def test_the_backend_test_finder_finds_the_forms_it_names(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "if repo.is_postgres:\n"
        "    pass\n"
        "x = 1 if self.dialect.postgres else 2\n"
        "y = is_postgres(engine) and z\n"
        "w = [a for a in b if d.postgres]\n"
        "v = dialect.postgres\n",
        encoding="utf-8",
    )
    assert backend_tests(source) == [1, 3, 4, 5]
