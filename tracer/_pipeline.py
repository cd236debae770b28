"""A request record's way from its finished request to storage, as one object.

Four stages turn a finished request's state into a stored record:

- **read**: the application's values become plain values (objects it handed over are read
  within the reader's budget); always on the writer thread, the only place that may wait for
  the application's objects without holding up a request;
- **assemble**: the plain values become a :class:`~recalltrace.storage.records.TraceRecord`
  (texts cut, documents and their notes, metadata made JSON-safe);
- **scrub**: secrets and personal data are redacted (skipped when scrubbing is off);
- **store**: the sink writes the batch and says what it stored.

:func:`plan` decides where each of them runs, once, from the configuration; the
:class:`RecordPipeline` it returns holds that decision as data (:attr:`RecordPipeline.stages`)
and runs the stages that belong on the writer thread. With a storage process, the stages after
*read* run there when they can: the writer hands it plain values, and scrubbing moves with
assembly unless a scrubbing callback (the application's code) must run in the application.
A record holding a value the storage process cannot receive exactly (a ``str`` subclass, a
NumPy number) is assembled and scrubbed on the writer thread instead.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from recalltrace.tracer._config import ScrubbingOptions, TracerConfig
from recalltrace.tracer._metrics import VALUES_NOT_READ, TracerStats
from recalltrace.tracer._plain import AssemblyOptions, PlainTrace, assemble_plain, plain_trace
from recalltrace.tracer._reader import READERS_STUCK, BoundedReader, read_values
from recalltrace.tracer._reader import TIMED_OUT as READ_TIMED_OUT
from recalltrace.tracer._sinks import open_default_sink
from recalltrace.tracer._state import (
    TraceState,
    assemble_record,
    scrub_reference,
    scrub_with_pool,
)

if TYPE_CHECKING:
    from recalltrace.storage.records import ReferenceUpdate, TraceRecord
    from recalltrace.tracer._config import TraceSink
    from recalltrace.tracer._scrub import Scrubber

logger = logging.getLogger("recalltrace.tracer")

WRITER_THREAD = "writer thread"
"""The tracer's background thread in the application's process."""
STORAGE_PROCESS = "storage process"
"""The child process the writer hands batches to (``storage_process=True``)."""
GIVEN_SINK = "the given sink"
"""The ``sink=`` passed to ``configure()``, called on the writer thread."""
UNDECIDED = "decided at the first write"
"""``storage_process`` left to choose, and nothing written yet."""

DEFAULT_SCHEMA_HINT = (
    "run `recalltrace db upgrade --database-url URL` (or configure auto_migrate=True)"
)
"""What to do when the database has no recalltrace tables, as the writer says it."""

READ_TIMEOUT_S = 2.0
"""Longest the writer waits for one record's application objects to be read (plain values are
read in full, without a time bound)."""


class Exporter(Protocol):
    """What the writer hands its records to: the writer-thread stages and the sink
    (:class:`RecordPipeline` is the one the tracer uses)."""

    decided: bool
    """Whether where the stages run is decided (else :meth:`decide` is called first)."""

    def decide(self, *, ending: bool) -> None:
        """Decide where the stages run, before the first record."""

    def prepare(self, state: TraceState) -> TraceRecord | PlainTrace:
        """Read (and, unless the sink does, assemble and scrub) a finished request."""

    def prepare_reference(self, update: ReferenceUpdate) -> ReferenceUpdate:
        """A late reference as it is stored."""

    def open_sink(self) -> TraceSink:
        """The sink to write to."""

    @property
    def owns_sink(self) -> bool:
        """Whether the writer closes the sink at shutdown."""

    def fall_back(self, exc: Exception) -> bool:
        """After the sink failed with ``exc``: whether the stages moved to the writer thread
        (the sink was a storage process that cannot start)."""

    def redo(self, item: TraceRecord | PlainTrace) -> TraceRecord | PlainTrace:
        """A record prepared before :meth:`fall_back`, as the stages now prepare it."""

    def redo_reference(self, update: ReferenceUpdate) -> ReferenceUpdate:
        """A late reference prepared before :meth:`fall_back`, as it is now prepared."""


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of the record pipeline and where it runs (``None``: it does not run)."""

    name: str
    place: str | None


class RecordPipeline:
    """Where each stage runs (:attr:`stages`), and the stages of the writer thread.

    Built by :func:`plan`. With ``storage_process`` left to choose (``None``), where the stages
    after *read* run is decided once, before the first record is prepared (:meth:`decide`):
    a storage process for a process that keeps storing into a database server, the writer
    thread for one whose first write is its last (a job's process ending, a short script) or
    that stores into SQLite. The writer calls :meth:`prepare` for each finished request and
    :meth:`open_sink` once (again after the sink failed to open)."""

    def __init__(
        self,
        config: TracerConfig,
        scrubber: Scrubber | None,
        assembly: AssemblyOptions,
        stats: TracerStats,
    ) -> None:
        self._config = config
        self._scrubber_configured = scrubber
        self.assembly = assembly
        self._stats = stats
        self.reader = BoundedReader(READ_TIMEOUT_S)
        self.schema_hint = DEFAULT_SCHEMA_HINT
        """What the writer says to do when the database has no recalltrace tables (a command
        that configures the tracer for its own use, such as ``collect``, says it its way)."""
        self._said: set[str] = set()
        self._unscrubbed = False
        """Set by :meth:`fall_back` when the records prepared before it are not scrubbed."""
        self.decided = False
        """Whether where the stages run is decided (always, unless ``storage_process`` is
        left to choose and nothing was written yet)."""
        if config.sink is not None or config.storage_process is not None:
            self._place(bool(config.storage_process) and config.sink is None)
        else:
            self._place(False)
            self.decided = False
            self.stages = (
                Stage("read", WRITER_THREAD),
                Stage("assemble", UNDECIDED),
                Stage("scrub", None if scrubber is None else UNDECIDED),
                Stage("store", UNDECIDED),
            )

    def stores_from_writer_thread(self) -> bool:
        """Whether the default sink is (or will be) opened on the writer thread."""
        if self._config.sink is not None:
            return False
        if self.decided:
            return not self.separate
        return not _server_database(self._config.database_url)

    def decide(self, *, ending: bool) -> None:
        """Decide where the stages run, before the first record (``ending``: the process is
        draining for its end, so its first write is its last)."""
        if self.decided:
            return
        self._place(not ending and _server_database(self._config.database_url))

    def _place(self, separate: bool) -> None:
        config, scrubber = self._config, self._scrubber_configured
        # Scrubbing runs where assembly runs, unless a callback (application code) must run in
        # the application's process.
        self.separate = separate
        self.remote_scrubbing: ScrubbingOptions | None = None
        if separate and scrubber is not None:
            options = (
                config.scrubbing
                if isinstance(config.scrubbing, ScrubbingOptions)
                else ScrubbingOptions()
            )
            if options.callback is None:
                self.remote_scrubbing = options
        self.scrubber = scrubber if self.remote_scrubbing is None else None
        """What scrubs records and late references on the writer thread (``None``: scrubbing
        is off, or the storage process scrubs)."""
        self.remote_assembly = separate and self.scrubber is None
        """Whether the storage process assembles (the writer hands it plain traces)."""
        store = GIVEN_SINK if config.sink is not None else WRITER_THREAD
        if separate:
            store = STORAGE_PROCESS
        assemble = STORAGE_PROCESS if self.remote_assembly else WRITER_THREAD
        scrub = (
            None
            if scrubber is None
            else (STORAGE_PROCESS if self.remote_scrubbing is not None else WRITER_THREAD)
        )
        self.stages = (
            Stage("read", WRITER_THREAD),
            Stage("assemble", assemble),
            Stage("scrub", scrub),
            Stage("store", store),
        )
        self.decided = True

    def place(self, stage: str) -> str | None:
        """Where ``stage`` runs (``None``: it does not)."""
        for item in self.stages:
            if item.name == stage:
                return item.place
        raise KeyError(stage)

    def describe(self) -> str:
        """The stages and their places in one line."""
        return ", ".join(f"{s.name}: {s.place or 'off'}" for s in self.stages)

    # -- the writer thread's stages ---------------------------------------------------------

    def prepare(self, state: TraceState) -> TraceRecord | PlainTrace:
        """Run the writer thread's stages on a finished request: read it, and assemble and
        scrub it unless the storage process does."""
        prepare = getattr(state, "prepare", None)
        if prepare is not None:
            prepare()  # a trace captured from spans reads them here, off the request path
        self._read(state)
        if self.remote_assembly:
            plain = plain_trace(state)
            if plain is not None:
                return plain
        return assemble_record(
            state,
            self.scrubber,
            self._config.max_text_length,
            release=self.assembly.release,
            environment=self.assembly.environment,
        )

    def prepare_reference(self, update: ReferenceUpdate) -> ReferenceUpdate:
        """A late reference as it is stored (scrubbed here when records are)."""
        if self.scrubber is None:
            return update
        return scrub_reference(self.scrubber, update)

    def open_sink(self) -> TraceSink:
        """The store stage's sink (opened on the writer thread: the repository pulls in
        SQLAlchemy)."""
        config = self._config
        if config.sink is not None:
            return config.sink
        return open_default_sink(
            config.database_url,
            create_schema=config.auto_migrate,
            separate_process=self.separate,
            scrubbing=self.remote_scrubbing,
            assembly=self.assembly if self.remote_assembly else None,
            nice=config.storage_process_nice,
            metrics=config.metrics,
        )

    @property
    def owns_sink(self) -> bool:
        """Whether the sink is the tracer's to close (not one passed in)."""
        return self._config.sink is None

    def fall_back(self, exc: Exception) -> bool:
        """After the store stage's sink failed with ``exc``: when that sink is a storage
        process that cannot start (this process's program is not a Python interpreter, or the
        child ended while starting), run every stage on the writer thread from now on, said
        once with why; ``True`` when it did (the writer then opens the new sink and hands the
        records it holds to :meth:`redo`)."""
        if not (self.separate and getattr(exc, "cannot_start", False)):
            return False
        self._unscrubbed = self.remote_scrubbing is not None
        self._place(False)
        logger.warning(
            "recalltrace: %s; records are stored from the writer thread in this process "
            "instead (storage_process=False does so from the start)",
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
        )
        return True

    def redo(self, item: TraceRecord | PlainTrace) -> TraceRecord | PlainTrace:
        """A record prepared for the storage process, as the writer thread stores it: a plain
        trace assembled, and scrubbed here when the storage process was to scrub it."""
        if type(item) is PlainTrace:
            return assemble_plain(item.values, self.scrubber, self.assembly)
        if self._unscrubbed and self.scrubber is not None:
            scrub_with_pool(self.scrubber, item)  # type: ignore[arg-type]
        return item

    def redo_reference(self, update: ReferenceUpdate) -> ReferenceUpdate:
        """A late reference prepared for the storage process, as the writer thread stores it."""
        if self._unscrubbed and self.scrubber is not None:
            return scrub_reference(self.scrubber, update)
        return update

    def _read(self, state: TraceState) -> None:
        summary = read_values(state, self.reader)
        if not summary.left_out:
            return
        self._stats.values_not_read(summary.why, len(summary.left_out))
        if summary.why in self._said:
            return
        self._said.add(summary.why)
        if summary.why == READERS_STUCK:
            logger.warning(
                "recalltrace writer: %d reader(s) are stuck in application objects that never "
                "returned; such objects are left out of records until one returns (plain values "
                "are still stored in full; each record says so in its notes, counted in the %s "
                "metric)",
                self.reader.stuck,
                VALUES_NOT_READ,
            )
        elif summary.why == READ_TIMED_OUT:
            logger.warning(
                "recalltrace writer: reading %s did not finish within %g s (its __str__, a "
                "property or an iterator hangs or is very slow); the record is stored without it "
                "(said once; each record says so in its notes, counted in the %s metric)",
                summary.hanging,
                self.reader.budget,
                VALUES_NOT_READ,
            )


def _server_database(database_url: str | None) -> bool:
    """Whether records go to a database server (Postgres), not a SQLite file."""
    url = database_url or os.environ.get("RECALLTRACE_DATABASE_URL") or ""
    return url.startswith("postgresql")


def plan(
    config: TracerConfig,
    scrubber: Scrubber | None,
    release: str | None,
    environment: str | None,
    stats: TracerStats,
) -> RecordPipeline:
    """Decide where each stage runs for ``config`` (see the module's documentation)."""
    assembly = AssemblyOptions(config.max_text_length, release, environment)
    return RecordPipeline(config, scrubber, assembly, stats)
