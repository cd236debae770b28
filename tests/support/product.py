"""The product's modules as the house-rule tests read them: every ``.py`` file of the parts
and the composition root, by its installed dotted name."""

from __future__ import annotations

from pathlib import Path

from tests.support import ROOT

# folder -> the installed package it is mapped to (``recalltrace/`` holds the composition root)
PRODUCT = {
    "recalltrace": "recalltrace",
    "tracer": "recalltrace.tracer",
    "scorers": "recalltrace.scorers",
    "storage": "recalltrace.storage",
    "migrations": "recalltrace.migrations",
}


def product_modules() -> dict[str, Path]:
    """Every product module by its installed dotted name."""
    found: dict[str, Path] = {}
    for folder, package in PRODUCT.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found
