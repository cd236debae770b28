"""The tracer resets itself in a forked child through one set of steps: ``tracer/_internal.py``
registers the product's only ``os.register_at_fork`` callback, and every other after-fork step
is added to it with ``at_fork_in_child`` (which runs them in a fixed order). The same steps run
when the tracer finds itself in a process that skipped the hook (``own_process``); record ids
need none (each is read from the operating system).

Read from the source with ``ast``, so a callback registered inside a function counts too."""

from __future__ import annotations

import ast

from tests.support import ROOT
from tests.support.product import product_modules


def _calls_named(tree: ast.AST, name: str) -> list[ast.Call]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called == name:
            found.append(node)
    return found


def _trees() -> dict[str, ast.AST]:
    return {
        path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
        for path in product_modules().values()
    }


def test_the_product_registers_one_fork_callback() -> None:
    where = [
        f"{name}:{call.lineno}"
        for name, tree in _trees().items()
        for call in _calls_named(tree, "register_at_fork")
    ]
    assert len(where) == 1 and where[0].startswith("tracer/_internal.py:"), where


def test_every_after_fork_step_goes_through_the_hook_with_a_named_place() -> None:
    steps = {
        name: _calls_named(tree, "at_fork_in_child")
        for name, tree in _trees().items()
        if name != "tracer/_internal.py"
    }
    places = {
        f"{name}:{call.lineno}": ast.unparse(call.args[0])
        for name, calls in steps.items()
        for call in calls
    }
    # The steps of the tracer's parts: the runtime, the writers and readers, span capture and
    # the exit path (each at its FORK_* place, not at a bare number).
    assert {place.split(":")[0] for place in places} >= {
        "tracer/_runtime.py",
        "tracer/_writer.py",
        "tracer/_reader.py",
        "tracer/_capture.py",
    }
    assert all(order.startswith("FORK_") for order in places.values()), places
