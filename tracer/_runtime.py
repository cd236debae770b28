"""The configured tracer of this process: OpenTelemetry tracer, sampler, scrubber and writer.

``configure`` builds a :class:`Runtime`; the decorators read the module global ``current`` on
every call (configuring from the environment on first use when the application did not).
OpenTelemetry is imported here, never by ``import tracer``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

from recalltrace.storage.records import ReferenceUpdate
from recalltrace.tracer import _signals
from recalltrace.tracer._config import ScrubbingOptions, TracerConfig
from recalltrace.tracer._conventions import (
    DEPLOYMENT_ENVIRONMENT,
    DEPLOYMENT_ENVIRONMENT_OLD,
    RECALLTRACE_SCOPE,
    SERVICE_NAME,
    SERVICE_VERSION,
)
from recalltrace.tracer._extract import snapshot, to_text, to_text_list
from recalltrace.tracer._internal import FORK_EXIT, FORK_RUNTIME, at_fork_in_child, configured
from recalltrace.tracer._metrics import VALUES_NOT_READ, Ledger, TracerStats, register_instruments
from recalltrace.tracer._plain import AssemblyOptions, PlainTrace, plain_trace
from recalltrace.tracer._reader import (
    READERS_STUCK,
    BoundedReader,
    read_values,
)
from recalltrace.tracer._reader import TIMED_OUT as READ_TIMED_OUT
from recalltrace.tracer._sampling import TraceSampler
from recalltrace.tracer._scrub import TextScrub, build_scrubber, span_text_scrubber
from recalltrace.tracer._sinks import check_default_sink, open_default_sink
from recalltrace.tracer._state import TraceState, assemble_record, read_ids, scrub_reference
from recalltrace.tracer._writer import BatchWriter

if TYPE_CHECKING:
    from recalltrace.storage.records import TraceRecord
    from recalltrace.tracer._config import TraceSink

logger = logging.getLogger("recalltrace.tracer")

READ_TIMEOUT_S = 2.0
"""Longest the writer waits for one record's application objects to be read (plain values are
read in full, without a time bound)."""

INSTRUMENTATION_NAME = RECALLTRACE_SCOPE
STATE_KEY = otel_context.create_key("recalltrace-trace")

_stats = TracerStats()
_lock = threading.RLock()
_atexit_registered = False
current: Runtime | None = None
_installed_provider: Any = None
# Whether an environment configuration refused on first use was said (it is said once).
_refusal_said = False


def _after_fork_in_child() -> None:
    # The parent's counts are the parent's; a lock held by one of its threads at the moment of
    # the fork would never be released here.
    global _lock
    _lock = threading.RLock()
    _stats.reset()


def _prepare_exit_in_child() -> None:
    _signals.after_fork_in_child()
    if current is not None:
        _follow_multiprocessing_exit()


at_fork_in_child(FORK_RUNTIME, _after_fork_in_child)
at_fork_in_child(FORK_EXIT, _prepare_exit_in_child)


# A multiprocessing child (a pool worker, a Process) ends with os._exit after running the
# multiprocessing finalizers, never atexit: the drain is one of those finalizers. The start of
# each child (Process._bootstrap) clears the finalizers it inherited and then runs the
# registered after-fork callbacks, which register it again.
_EXIT_PRIORITY = 10
_exit_finalizer: Any = None
_after_fork_registered = False


class _ExitToken:
    """What multiprocessing's after-fork registry holds (it keeps only a weak reference)."""


_exit_token = _ExitToken()


def _follow_multiprocessing_exit() -> None:
    """Make multiprocessing's exit path (``util._exit_function``) drain the queue, in this
    process and in the children multiprocessing starts from it; nothing when multiprocessing
    is not in use."""
    global _exit_finalizer, _after_fork_registered
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    if not _after_fork_registered:
        _after_fork_registered = True
        util.register_after_fork(_exit_token, _rearm_in_child)
    if _exit_finalizer is None or not _exit_finalizer.still_active():
        _exit_finalizer = util.Finalize(
            None, _drain_final, args=("the process is ending",), exitpriority=_EXIT_PRIORITY
        )


def _rearm_in_child(token: _ExitToken) -> None:
    if current is not None:
        _follow_multiprocessing_exit()
        _signals.watch_for_missed_signals()


def stats() -> TracerStats:
    """The process-wide counters."""
    return _stats


def ledger() -> Ledger:
    """Every request seen by this process and where it ended (see ``recalltrace.ledger``)."""
    return _stats.ledger()


class Runtime:
    """Everything the decorators need per call, resolved once by ``configure``."""

    def __init__(self, config: TracerConfig) -> None:
        self.config = config
        self.enabled = config.enabled
        provider, own = _resolve_tracer_provider(config)
        self.provider = provider
        self.owns_provider = own
        self.otel_tracer = provider.get_tracer(INSTRUMENTATION_NAME)
        self.service_name = config.service_name or _resource_service_name(provider)
        self.release = config.release or _resource_text(provider, SERVICE_VERSION)
        self.environment = config.environment or _resource_text(
            provider, DEPLOYMENT_ENVIRONMENT, DEPLOYMENT_ENVIRONMENT_OLD
        )
        self.sampler = TraceSampler(config.sample_rate, config.sample_rates)
        self.scrubber = build_scrubber(config.scrubbing)
        self.span_scrub: TextScrub | None = span_text_scrubber(self.scrubber, config.scrubbing)
        # With a storage process, that process scrubs the records before it stores them (off
        # the application's interpreter), unless a scrubbing callback (application code) is set.
        self.scrubbing_elsewhere: ScrubbingOptions | None = None
        if config.storage_process and config.sink is None and self.scrubber is not None:
            options = (
                config.scrubbing
                if isinstance(config.scrubbing, ScrubbingOptions)
                else ScrubbingOptions()
            )
            if options.callback is None:
                self.scrubbing_elsewhere = options
        # What scrubs records and late references in this process (None: scrubbing is off, or
        # the storage process does it).
        self.record_scrubber = self.scrubber if self.scrubbing_elsewhere is None else None
        # Where no scrubbing is left to this process, the storage process also assembles the
        # records: the writer thread only reads the application's values.
        self.assembly_elsewhere: AssemblyOptions | None = None
        if config.storage_process and config.sink is None and self.record_scrubber is None:
            self.assembly_elsewhere = AssemblyOptions(
                config.max_text_length, self.release, self.environment
            )
        self.genai_attributes = config.genai_span_attributes
        self.stats = _stats
        # App names label the metrics; one taken from a received span name is user text.
        _stats.label = self.scrubber.scrub_label if self.scrubber is not None else str
        self.reader = BoundedReader(READ_TIMEOUT_S)
        self._said: set[str] = set()
        self.writer = BatchWriter(
            sink_factory=self._open_sink,
            assemble=self._assemble,
            stats=_stats,
            max_queue_size=config.max_queue_size,
            max_batch_size=config.max_batch_size,
            flush_interval=config.flush_interval,
            max_write_attempts=config.max_write_attempts,
            retry_backoff=config.retry_backoff,
            reference_wait=config.reference_wait,
            close_sink=None if config.sink is not None else _dispose,
            prepare_reference=(
                None
                if self.record_scrubber is None
                else functools.partial(scrub_reference, self.record_scrubber)
            ),
        )

    def _open_sink(self) -> TraceSink:
        if self.config.sink is not None:
            return self.config.sink
        # Called here, on the writer thread: opening the repository pulls in SQLAlchemy.
        return open_default_sink(
            self.config.database_url,
            create_schema=self.config.auto_migrate,
            separate_process=self.config.storage_process,
            scrubbing=self.scrubbing_elsewhere,
            assembly=self.assembly_elsewhere,
            nice=self.config.storage_process_nice,
        )

    def _assemble(self, state: TraceState) -> TraceRecord | PlainTrace:
        prepare = getattr(state, "prepare", None)
        if prepare is not None:
            prepare()  # a trace captured from spans reads them here, off the request path
        summary = read_values(state, self.reader)
        if summary.left_out:
            self.stats.values_not_read(summary.why, len(summary.left_out))
            if summary.why not in self._said:
                self._said.add(summary.why)
                if summary.why == READERS_STUCK:
                    logger.warning(
                        "recalltrace writer: %d reader(s) are stuck in application objects "
                        "that never returned; such objects are left out of records until one "
                        "returns (plain values are still stored in full; each record says so "
                        "in its notes, counted in the %s metric)",
                        self.reader.stuck,
                        VALUES_NOT_READ,
                    )
                elif summary.why == READ_TIMED_OUT:
                    logger.warning(
                        "recalltrace writer: reading %s did not finish within %g s (its "
                        "__str__, a property or an iterator hangs or is very slow); the record "
                        "is stored without it (said once; each record says so in its notes, "
                        "counted in the %s metric)",
                        summary.hanging,
                        self.reader.budget,
                        VALUES_NOT_READ,
                    )
        if self.assembly_elsewhere is not None:
            plain = plain_trace(state)
            if plain is not None:
                return plain
        return self._assemble_now(state)

    def _assemble_now(self, state: TraceState) -> TraceRecord:
        return assemble_record(
            state,
            self.record_scrubber,
            self.config.max_text_length,
            release=self.release,
            environment=self.environment,
        )

    def finish_trace(self, state: TraceState) -> None:
        """Called when the outermost decorated span of a trace ended."""
        state.service_name = self.service_name
        self.stats.trace_finished(state.app_name, state.sampled)
        if state.sampled:
            self.writer.offer(state)


def _dispose(sink: Any) -> None:
    # Only for the repository the tracer opened itself; a sink passed in belongs to the caller.
    dispose = getattr(sink, "dispose", None)
    if callable(dispose):
        dispose()


def _resource_service_name(provider: Any) -> str:
    resource = getattr(provider, "resource", None)
    attributes = getattr(resource, "attributes", None) or {}
    name = attributes.get(SERVICE_NAME)
    if isinstance(name, str) and name and not name.startswith("unknown_service"):
        return name
    return "unknown_service"


def _resource_text(provider: Any, *names: str) -> str | None:
    """The first of ``names`` the provider's resource holds, as text."""
    attributes = getattr(getattr(provider, "resource", None), "attributes", None) or {}
    for name in names:
        value = attributes.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _global_provider_is_set() -> bool:
    return not isinstance(otel_trace.get_tracer_provider(), otel_trace.ProxyTracerProvider)


def _resolve_tracer_provider(config: TracerConfig) -> tuple[Any, bool]:
    choice = config.tracer_provider
    if not isinstance(choice, str):
        return choice, False
    if choice == "global" or (choice == "auto" and _global_provider_is_set()):
        return otel_trace.get_tracer_provider(), False
    global _installed_provider
    if _installed_provider is not None and otel_trace.get_tracer_provider() is _installed_provider:
        # Configured again: keep the provider installed the first time.
        return _installed_provider, True
    provider = _make_own_provider(config)
    if _global_provider_is_set():
        logger.warning(
            "recalltrace: the application already installed a TracerProvider; the tracer's own "
            "provider is used privately and its spans do not reach the application's exporters "
            "(pass tracer_provider='global' to join it)"
        )
    else:
        otel_trace.set_tracer_provider(provider)
        _installed_provider = provider
    return provider, True


def _make_own_provider(config: TracerConfig) -> Any:
    """An SDK provider exporting where the standard variables say: ``OTEL_TRACES_EXPORTER``
    (``otlp``, ``console``, ``none``), else OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set.
    Raises ``ValueError`` for an exporter that cannot be set up."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    from recalltrace.tracer._otlp import otlp_exporter, otlp_wanted

    attributes = {SERVICE_NAME: config.service_name} if config.service_name else {}
    raw = os.environ.get("OTEL_TRACES_EXPORTER")
    names = [part.strip().lower() for part in (raw or "").split(",") if part.strip()]
    if raw is None and otlp_wanted("traces"):
        names = ["otlp"]
    processors: list[Any] = []
    for name in names:
        if name == "otlp":
            processors.append(BatchSpanProcessor(otlp_exporter("traces")))
        elif name == "console":
            processors.append(SimpleSpanProcessor(ConsoleSpanExporter()))
        elif name != "none":
            raise ValueError(
                f"OTEL_TRACES_EXPORTER names {name!r}, which recalltrace cannot set up: use "
                "otlp, console or none, or install your own TracerProvider before configure()"
            )
    provider = TracerProvider(resource=Resource.create(attributes))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def configure(config: TracerConfig) -> Runtime:
    """Install ``config`` as the process's tracer, replacing (and draining) a previous one."""
    global current, _atexit_registered
    config.validate()
    if config.sink is None:
        check_default_sink()
    with _lock:
        previous = current
        runtime = Runtime(config)
        current = runtime
        register_instruments(stats, config.meter_provider)
        if config.register_atexit and not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
        if config.handle_signals:
            if not _signals.install(_drain_on_signal, _write_eagerly):
                _say_signals_unhandled()
        else:
            _signals.uninstall()
        _follow_multiprocessing_exit()
        configured(runtime)
    if previous is not None:
        previous.writer.shutdown(previous.config.shutdown_timeout)
    return runtime


def get() -> Runtime:
    """The current runtime, configured from the environment on first use."""
    runtime = current
    if runtime is not None:
        return runtime
    with _lock:
        if current is not None:
            return current
        logger.debug("recalltrace: not configured; using the environment defaults")
        try:
            return configure(TracerConfig.from_env())
        except ValueError as exc:
            global _refusal_said
            if not _refusal_said:
                _refusal_said = True
                logger.error(
                    "recalltrace: the configuration the environment gives is refused (%s); "
                    "decorated calls run untraced until configure() succeeds",
                    exc,
                )
            raise


_unhandled_said = False


def _say_signals_unhandled() -> None:
    global _unhandled_said
    if _unhandled_said:
        return
    _unhandled_said = True
    logger.warning(
        "recalltrace: configure() ran outside the main thread, so SIGTERM and SIGINT cannot be "
        "handled: records still queued when a signal ends this process are lost uncounted; "
        "call configure() from the main thread, or recalltrace.shutdown() from the server's "
        "stop hook"
    )


def _at_exit() -> None:
    _drain_final("the process is exiting")


_drained: tuple[int, int] | None = None
"""(pid, runtime) whose final drain ran: the exit paths that reach it (multiprocessing's exit
function, ``atexit``, a stopping signal) drain and say the ledger once between them."""


def _drain_final(why: str) -> None:
    """The process is ending: store what is queued within ``shutdown_timeout`` and count the
    rest as dropped (``shutdown``, said in one line with the exact number)."""
    global _drained
    runtime = current
    if runtime is None:
        return
    key = (os.getpid(), id(runtime))
    if _drained == key:
        _stats.report_drops()  # what was dropped since (nothing, as a rule) is still said
        return
    _drained = key
    with _signals.final_drain():
        try:
            # What the drain gives up is said once, in the ledger's line below.
            runtime.writer.shutdown(runtime.config.shutdown_timeout, report=False)
        except Exception:
            logger.exception("recalltrace: draining the queue (%s) failed", why)
    counts = _stats.ledger()
    if counts.dropped_total or counts.pending or counts.unaccounted:
        logger.warning("recalltrace at exit: %s", counts.line())
        _stats.forget_unreported()
    else:
        _stats.report_drops()  # late references only: not requests


def flush(timeout: float | None = None) -> bool:
    """Wait until every record queued so far is stored (or dropped), at most ``timeout``
    seconds (default: ``flush_timeout``); on a timeout, say how many still wait."""
    runtime = current
    if runtime is None:
        return True
    limit = runtime.config.flush_timeout if timeout is None else timeout
    done = runtime.writer.flush(limit)
    if not done:
        waiting = runtime.writer.queue_size()
        logger.warning(
            "recalltrace: flush gave up after %g s with %d record(s) not stored yet%s; they "
            "stay queued (bounded by max_queue_size) and are retried",
            limit,
            waiting,
            runtime.writer.last_failure_text(),
        )
    return done


def _drain_on_signal(why: str, final: bool) -> None:
    runtime = current
    if runtime is None:
        return
    timeout = runtime.config.shutdown_timeout

    def drain() -> None:
        if final:
            _drain_before_exit(runtime, why, timeout)
        else:
            runtime.writer.flush(timeout)

    with _signals.final_drain() if final else contextlib.nullcontext():
        _bounded(drain, timeout, why)


def _drain_before_exit(runtime: Runtime, why: str, timeout: float) -> None:
    before = runtime.stats.dropped_total()
    waiting = runtime.writer.queue_size()
    runtime.writer.shutdown(timeout)
    lost = runtime.stats.dropped_total() - before
    if waiting or lost:
        logger.warning(
            "recalltrace: %s: %d queued record(s) stored, %d dropped before exit",
            why,
            max(waiting - lost, 0),
            lost,
        )


# Beyond shutdown_timeout, the drain on a helper thread is given this long to say what it did.
_DRAIN_GRACE = 2.0


def _bounded(drain: Callable[[], None], timeout: float, why: str) -> None:
    """Run ``drain`` on a helper thread and wait for it at most ``timeout`` (plus a grace).

    A signal handler runs in the main thread between any two of its instructions, also while
    that thread holds one of the tracer's locks (queuing a record when a pool worker is told
    to stop); the drain, needing that lock, would then wait forever in the same thread. On its
    own thread it waits for the lock at most this long, and the process ends as it would have.
    """
    done = threading.Event()

    def run() -> None:
        try:
            drain()
        except Exception:
            logger.exception("recalltrace: draining the queue on %s failed", why)
        finally:
            done.set()

    def in_thread() -> None:
        _signals.keep_off_this_thread()
        run()

    try:
        threading.Thread(target=in_thread, name="recalltrace-drain", daemon=True).start()
    except RuntimeError:
        run()  # the interpreter is shutting down and starts no thread: drain here instead
        return
    if not done.wait(timeout + _DRAIN_GRACE):
        logger.warning(
            "recalltrace: %s: draining did not finish within %g s (the signal interrupted the "
            "tracer while it held its queue); the records still queued are not stored",
            why,
            timeout + _DRAIN_GRACE,
        )


def _write_eagerly() -> None:
    runtime = current
    if runtime is not None:
        runtime.writer.write_eagerly()


def shutdown(timeout: float | None = None) -> bool:
    """Drain the queue and stop the writer; later traces are dropped until ``configure``."""
    runtime = current
    if runtime is None:
        return True
    return runtime.writer.shutdown(runtime.config.shutdown_timeout if timeout is None else timeout)


_ID_HELP = "a record id is 32 hex digits, as recalltrace.current_trace_id() returns it"


def normalize_trace_id(trace_id: str | int) -> str:
    """A record id as 32 lowercase hex digits (accepts an int, or hex with or without ``0x``
    and dashes); ``ValueError`` naming the problem otherwise."""
    if isinstance(trace_id, int) and not isinstance(trace_id, bool):
        value = trace_id
    elif isinstance(trace_id, str):
        text = trace_id.strip().lower()
        if text.startswith("0x"):
            text = text[2:]
        text = text.replace("-", "")
        if not text or len(text) > 32 or any(c not in "0123456789abcdef" for c in text):
            raise ValueError(f"{trace_id!r} is not a record id: {_ID_HELP}")
        value = int(text, 16)
    else:
        raise TypeError(f"trace_id must be a hex string or an int, not {type(trace_id).__name__}")
    if not 0 < value < (1 << 128):
        raise ValueError(f"{trace_id!r} is not a record id: {_ID_HELP}")
    return format(value, "032x")


def current_state() -> TraceState | None:
    """The state of the trace the current context belongs to, if a decorated call is open."""
    state = otel_context.get_current().get(STATE_KEY)
    return state if isinstance(state, TraceState) else None


_outside_said = False


def set_attributes(
    *,
    user_id: Any = None,
    session_id: Any = None,
    tags: Any = None,
    release: Any = None,
    environment: Any = None,
    metadata: Mapping[str, Any] | None = None,
) -> bool:
    """Set attributes of the request open in the current context (see
    ``recalltrace.set_attributes``); False, said once, outside any request."""
    global _outside_said
    state = current_state()
    if state is None or state.closed:
        if not _outside_said:
            _outside_said = True
            logger.warning(
                "recalltrace: set_attributes() was called outside any @recalltrace.rag request: "
                "nothing was set (said once)"
            )
        return False
    if not state.sampled:
        return True
    # Read now, in the caller's own call: a value is text from here on. A value whose printing
    # raises is left out with a note (the application's call goes on).
    for name, value in (
        ("user_id", user_id),
        ("session_id", session_id),
        ("release", release),
        ("environment", environment),
    ):
        if value is not None:
            text = _printed_now(value, name, state.notes)
            if text is not None:
                setattr(state, name, text)
    if tags is not None:
        try:
            items = [tags] if isinstance(tags, str) else list(tags)
        except Exception as exc:
            items = []
            state.notes.append(f"tags not captured: reading them raised {type(exc).__name__}")
        for index, tag in enumerate(items):
            text = _printed_now(tag, f"tags[{index}]", state.notes)
            if text and text not in state.tags:
                state.tags.append(text)
    if metadata:
        try:
            state.metadata.update(snapshot(dict(metadata)))
        except Exception as exc:
            state.notes.append(f"metadata not captured: reading it raised {type(exc).__name__}")
    return True


def _printed_now(value: Any, name: str, notes: list[str]) -> str | None:
    try:
        return str(value)
    except Exception as exc:
        notes.append(f"{name} not captured: its value raised {type(exc).__name__} when printed")
        return None


def _read_now(read: Any, value: Any, name: str, problems: list[str]) -> Any:
    try:
        return read(value)
    except Exception as exc:
        problems.append(f"{name} not captured: its value raised {type(exc).__name__} when read")
        return None


def current_trace_id() -> str | None:
    """The id of the request being traced (32 hex digits), or None outside any request."""
    state = current_state()
    if state is not None:
        return state.hex_id()
    return None


def set_reference(
    trace_id: str | int | None,
    *,
    reference: Any = None,
    reference_contexts: Any = None,
    reference_context_ids: Any = None,
) -> None:
    """Record ground truth for a trace (see ``tracer.set_reference``)."""
    runtime = get()
    if trace_id is None:
        trace_id = current_trace_id()
        if trace_id is None:
            raise ValueError("set_reference(None, ...) needs an open trace in the current context")
    hex_id = normalize_trace_id(trace_id)
    problems: list[str] = []
    update = ReferenceUpdate(
        trace_id=hex_id,
        reference=_read_now(to_text, reference, "reference", problems),
        reference_contexts=_read_now(
            to_text_list, reference_contexts, "reference_contexts", problems
        ),
        reference_context_ids=read_ids(reference_context_ids, problems),
    )
    if problems:
        # The application's own objects could not be printed: what could be is kept.
        logger.warning("recalltrace: set_reference(%s): %s", hex_id, "; ".join(problems))
    if (
        update.reference is None
        and not update.reference_contexts
        and not update.reference_context_ids
    ):
        return
    state = current_state()
    open_state = state if state is not None and state.hex_id() == hex_id else None
    if open_state is None and not runtime.sampler.could_be_sampled(int(hex_id, 16)):
        # No rate of this configuration samples this id, so no process configured like this
        # one stored it; waiting for it would only cost storage queries.
        logger.debug("recalltrace: reference for unsampled trace %s ignored", hex_id)
        return
    runtime.writer.merge_reference(update, open_state)
