"""recalltrace's build backend: setuptools' own, with every wheel built in a fresh folder.

setuptools builds a wheel from ``build/lib`` in the source tree and never empties that folder,
so a module deleted from the source after a ``pip install .`` (or ``python -m build --wheel``)
was shipped again by the next build. Here each wheel is built under a temporary folder that is
removed afterwards (setuptools reads it as ``[build] build_base`` from the extra configuration
file that ``DIST_EXTRA_CONFIG`` names; a file the caller named there is kept, with that one
option added). Source distributions, metadata and editable installs are setuptools' unchanged.
"""

from __future__ import annotations

import configparser
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (
    build_editable,
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

_EXTRA_CONFIG = "DIST_EXTRA_CONFIG"


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """PEP 517's hook: setuptools' wheel, built from a build folder no earlier build used."""
    with _fresh_build_folder():
        return str(_setuptools.build_wheel(wheel_directory, config_settings, metadata_directory))


@contextmanager
def _fresh_build_folder() -> Iterator[None]:
    previous = os.environ.get(_EXTRA_CONFIG)
    with tempfile.TemporaryDirectory(prefix="recalltrace-build-") as folder:
        config = configparser.ConfigParser(interpolation=None)
        if previous:
            config.read(previous, encoding="utf-8")
        if not config.has_section("build"):
            config.add_section("build")
        config.set("build", "build_base", os.path.join(folder, "build"))
        path = os.path.join(folder, "setup.cfg")
        with open(path, "w", encoding="utf-8") as handle:
            config.write(handle)
        os.environ[_EXTRA_CONFIG] = path
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(_EXTRA_CONFIG, None)
            else:
                os.environ[_EXTRA_CONFIG] = previous
