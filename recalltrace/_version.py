"""The version ``recalltrace --version`` prints: the installed distribution's, the one its
wheel's metadata carries. setuptools-scm sets it from git when the wheel is built (a tag
``vX.Y.Z`` builds ``X.Y.Z``, another commit ``X.Y.(Z+1).devN+g<commit>``; docs/release.md); an
editable install keeps the version of the commit it was installed at."""

from __future__ import annotations

DISTRIBUTION = "recalltrace"


def installed_version() -> str:
    """The installed distribution's version, or a note saying that it is not installed (code
    run from a checkout that was never installed has no metadata to read)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "(not installed: run `pip install .` in the checkout)"
