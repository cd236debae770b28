"""House rule: a module logs under its own dotted name (``__name__``) or a package containing it,
so that configuring ``recalltrace`` (or ``recalltrace.scorers``, ...) reaches every record; and
a logger named anywhere in the product names a real module or package of it."""

from __future__ import annotations

import ast

from tests.support.product import product_modules

LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}
PRODUCT_ROOTS = {"recalltrace", "tracer", "scorers", "storage", "migrations"}


def _get_logger_argument(node: ast.AST) -> ast.expr | None:
    """The argument of ``logging.getLogger(ARG)`` / ``getLogger(ARG)``, else None."""
    if not (isinstance(node, ast.Call) and len(node.args) == 1):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return node.args[0] if name == "getLogger" else None


def _own_loggers(tree: ast.Module) -> list[tuple[int, ast.expr]]:
    """The loggers a module logs to: ``x = getLogger(ARG)`` at the top of the module, and
    ``getLogger(ARG).warning(...)`` (or another level) anywhere."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            argument = _get_logger_argument(node.value)
            if argument is not None:
                found.append((node.lineno, argument))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LOG_METHODS
        ):
            argument = _get_logger_argument(node.func.value)
            if argument is not None:
                found.append((node.lineno, argument))
    return found


def _allowed(argument: ast.expr, module: str) -> bool:
    if isinstance(argument, ast.Name) and argument.id == "__name__":
        return True
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return module == argument.value or module.startswith(argument.value + ".")
    return False


def test_each_module_logs_under_its_own_name_or_its_package() -> None:
    wrong = []
    for module, path in product_modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, argument in _own_loggers(tree):
            if not _allowed(argument, module):
                wrong.append(f"{module}:{line} logs to {ast.unparse(argument)}")
    assert wrong == []


def test_every_logger_named_in_the_product_exists() -> None:
    """A logger configured by name (a level, a filter) is one the product logs to."""
    modules = set(product_modules())
    wrong = []
    for module, path in product_modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            argument = _get_logger_argument(node)
            if not (isinstance(argument, ast.Constant) and isinstance(argument.value, str)):
                continue
            if argument.value.split(".")[0] in PRODUCT_ROOTS and argument.value not in modules:
                wrong.append(f"{module}:{node.lineno} names the logger {argument.value!r}")
    assert wrong == []


def test_the_judge_logs_under_its_module() -> None:
    from recalltrace.scorers import _judge

    assert _judge.logger.name == _judge.__name__ == "recalltrace.scorers._judge"
