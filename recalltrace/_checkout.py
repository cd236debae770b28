"""Running from a checkout: the package's parts are found beside ``recalltrace/``.

The repository keeps the parts in top-level folders (``tracer/``, ``scorers/``, ``storage/``,
``migrations/``) that are mapped into the package only when it is installed. A script run inside
the checkout imports the checkout's ``recalltrace/`` folder (it comes first on ``sys.path``) rather
than the installed package, so the parts are looked up beside it too: the package adds
:func:`checkout_root` to its own ``__path__``. An installed package has no such folders beside it
and is left as it is.
"""

from __future__ import annotations

import os


def shadowed_installation(root: str) -> str | None:
    """When the checkout at ``root`` is imported while recalltrace is installed from somewhere
    else (a wheel, or an editable install of another folder), what that installation is: its
    version and where it lives; else ``None``. A script run in a clone imports the clone's code,
    whatever is installed, and the two may not agree (on the database schema, say)."""
    import json
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        installed = distribution("recalltrace")
    except PackageNotFoundError:
        return None
    where = os.path.realpath(str(installed.locate_file("")))
    try:
        direct = json.loads(installed.read_text("direct_url.json") or "{}")
    except ValueError:
        direct = {}
    url = direct.get("url", "") if isinstance(direct, dict) else ""
    if url.startswith("file://") and direct.get("dir_info", {}).get("editable"):
        where = os.path.realpath(url[len("file://") :])
    # This checkout is the one installed (``pip install -e .``, whose metadata may sit in it).
    if where == os.path.realpath(root):
        return None
    return f"recalltrace {installed.version} installed from {where}"


def checkout_root() -> str | None:
    """The repository's root folder when ``recalltrace/`` runs from a checkout, else ``None``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkout = os.path.isfile(os.path.join(root, "tracer", "__init__.py")) and os.path.isfile(
        os.path.join(root, "pyproject.toml")
    )
    return root if checkout else None
