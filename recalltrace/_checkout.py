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


def checkout_root() -> str | None:
    """The repository's root folder when ``recalltrace/`` runs from a checkout, else ``None``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkout = os.path.isfile(os.path.join(root, "tracer", "__init__.py")) and os.path.isfile(
        os.path.join(root, "pyproject.toml")
    )
    return root if checkout else None
