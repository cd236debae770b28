"""Helpers shared by the tests and the benchmarks (import them as ``tests.support.*``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root folder."""
