"""Which sink the writer opens when ``configure()`` is given none.

The tracer does not know how the product stores records: the composition root
(``import recalltrace``) registers the repository on the configured database URL here. This
module imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from recalltrace.tracer._config import ScrubbingOptions, TraceSink
    from recalltrace.tracer._plain import AssemblyOptions

_factory: Callable[..., TraceSink] | None = None
_check: Callable[[Sequence[str] | None], None] | None = None
_warm: Callable[[str | None], None] | None = None


def set_default_sink_factory(
    factory: Callable[..., TraceSink],
    check: Callable[[Sequence[str] | None], None] | None = None,
    warm: Callable[[str | None], None] | None = None,
) -> None:
    """Register what opens the default sink from the configured database URL, and ``check``,
    which ``configure()`` runs at once to refuse (``ValueError``) what would make every later
    write fail (an unknown metric in ``metrics``, its argument); ``warm(database_url)`` loads what
    opening it needs, without opening it."""
    global _factory, _check, _warm
    _factory, _check, _warm = factory, check, warm


def warm_default_sink(database_url: str | None) -> None:
    """Load what opening the default sink on ``database_url`` needs (its modules), so that
    processes forked afterwards find them loaded."""
    if _warm is not None:
        _warm(database_url)


def check_default_sink(metrics: Sequence[str] | None = None) -> None:
    """Run the registered check on the configured ``metrics``; raises ``ValueError`` with a
    one-line reason."""
    if _check is not None:
        _check(metrics)


def open_default_sink(
    database_url: str | None,
    *,
    create_schema: bool | None = None,
    separate_process: bool = False,
    scrubbing: ScrubbingOptions | None = None,
    assembly: AssemblyOptions | None = None,
    nice: int = 0,
    metrics: Sequence[str] | None = None,
) -> TraceSink:
    """Open the registered default sink (``create_schema``: the tracer's ``auto_migrate``;
    ``True`` runs the migrations first, ``None`` creates a schema that is missing entirely,
    ``False`` leaves a Postgres schema alone; ``separate_process``: the tracer's
    ``storage_process``; ``scrubbing``: with ``separate_process``, the ``ScrubbingOptions``
    that process scrubs each record with before storing it, in place of the writer thread;
    ``assembly``, with ``separate_process``: that process also assembles the records, and the
    writer hands it ``PlainTrace`` values in their place where it can; ``nice``, how much lower
    that process's CPU priority is; ``metrics``, the variants whose jobs a stored record gets,
    ``None`` for all); raises ``RuntimeError`` if none is registered."""
    if _factory is None:
        raise RuntimeError(
            "no default trace sink is registered: import recalltrace (not only its tracer) "
            "or pass sink= to configure()"
        )
    return _factory(
        database_url,
        create_schema=create_schema,
        separate_process=separate_process,
        scrubbing=scrubbing,
        assembly=assembly,
        nice=nice,
        metrics=metrics,
    )
