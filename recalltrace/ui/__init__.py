"""``recalltrace ui``: read-only web pages over the score history (docs/ui.md).

The pages read the same history API as the command line (:mod:`recalltrace.storage.history`,
:mod:`recalltrace.compare`, :func:`recalltrace.storage.diagnose.diagnose`) and never write.
Starlette serves them, Jinja2 renders them with autoescaping on (every stored value is shown as
text), and the charts are drawn by uPlot, shipped inside the wheel under ``static/uplot``.
The web stack is the ``ui`` extra: ``pip install 'recalltrace[ui]'``.
"""

from __future__ import annotations

__all__ = ["create_app"]


def __getattr__(name: str) -> object:
    # The web stack is imported only when the application is built (``recalltrace --help``
    # and the tracer never import Starlette).
    if name == "create_app":
        from recalltrace.ui.app import create_app

        return create_app
    raise AttributeError(name)
