"""The configured tracer of this process: OpenTelemetry tracer, sampler, scrubber and writer.

``configure`` builds a :class:`Runtime`; the decorators read the module global ``current`` on
every call (configuring from the environment on first use when the application did not).
OpenTelemetry is imported here, never by ``import tracer``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

from recalltrace.storage.records import ReferenceUpdate
from recalltrace.tracer import _signals, _threads
from recalltrace.tracer._config import TracerConfig, export_for_children, shown_url
from recalltrace.tracer._conventions import (
    DEPLOYMENT_ENVIRONMENT,
    DEPLOYMENT_ENVIRONMENT_OLD,
    RECALLTRACE_SCOPE,
    SERVICE_NAME,
    SERVICE_VERSION,
)
from recalltrace.tracer._extract import snapshot, to_text, to_text_list
from recalltrace.tracer._internal import (
    FORK_EXIT,
    FORK_RUNTIME,
    at_fork_in_child,
    before_fork,
    configured,
    own_process,
)
from recalltrace.tracer._metrics import Ledger, TracerStats, register_instruments
from recalltrace.tracer._pipeline import READ_TIMEOUT_S, RecordPipeline, plan
from recalltrace.tracer._process_ledger import default_run_dir
from recalltrace.tracer._sampling import TraceSampler
from recalltrace.tracer._scrub import build_scrubber
from recalltrace.tracer._sinks import check_default_sink, warm_default_sink
from recalltrace.tracer._span_scrub import TextScrub, span_text_scrubber
from recalltrace.tracer._state import TraceState, read_ids
from recalltrace.tracer._writer import BatchWriter

if TYPE_CHECKING:
    from recalltrace.tracer._reader import BoundedReader

logger = logging.getLogger("recalltrace.tracer")

__all__ = ["READ_TIMEOUT_S", "Runtime", "configure", "flush", "get", "ledger", "shutdown"]

INSTRUMENTATION_NAME = RECALLTRACE_SCOPE
STATE_KEY = otel_context.create_key("recalltrace-trace")

_stats = TracerStats()
_lock = _threads.RLock()
_atexit_registered = False
current: Runtime | None = None
_installed_provider: Any = None
# Whether an environment configuration refused on first use was said (it is said once).
_refusal_said = False


def _after_fork_in_child() -> None:
    # The parent's counts are the parent's; a lock held by one of its threads at the moment of
    # the fork would never be released here.
    global _lock
    _lock = _threads.RLock()
    _stats.reset()


def _prepare_exit_in_child() -> None:
    _signals.after_fork_in_child()
    if current is not None:
        _follow_multiprocessing_child()


at_fork_in_child(FORK_RUNTIME, _after_fork_in_child)
at_fork_in_child(FORK_EXIT, _prepare_exit_in_child)


_warmed: tuple[int, str | None] | None = None


def _warm_before_fork() -> None:
    """A process about to fork, whose records are stored from its writer thread, loads the
    database stack first (once): its children, which each open their own connection (an RQ
    work horse per job, a pool worker), find it loaded instead of each importing it (about
    0.3 s of CPU per child). Not where a storage process stores, or may (``storage_process``
    left to choose with a database server: a pre-fork server's workers would carry the stack
    in their heaps for nothing), nor with a sink of the application's."""
    global _warmed
    runtime = current
    if runtime is None or not runtime.pipeline.stores_from_writer_thread():
        return
    key = (os.getpid(), runtime.config.database_url)
    if _warmed == key:
        return
    _warmed = key
    warm_default_sink(runtime.config.database_url)


before_fork(_warm_before_fork)


# -- how a process ends ------------------------------------------------------------------------
#
# Every way out that runs Python code drains the queue once, bounded by shutdown_timeout, and
# says the ledger in one line (_drain_final): ``atexit`` (the interpreter's normal end, spawn
# children), ``os._exit`` (multiprocessing's fork and forkserver children, job queues that fork
# a child per job such as RQ, ``os.fork()`` loops, scripts), and a stopping signal (see
# _signals). A process that ends without running Python code (SIGKILL, an exit from C) leaves
# its ledger file behind instead, and the next tracer process to look says what it held.

_real_exit: Callable[[int], NoReturn] | None = None


def _exit_draining(status: int) -> NoReturn:
    """``os._exit`` with the queue drained first (within ``shutdown_timeout``): on a helper
    thread, as a stopping signal's drain, since the caller may be a signal handler that
    interrupted the tracer inside its own lock."""
    try:
        runtime = current
        if runtime is not None:
            if runtime.writer.holds_records():
                why = "os._exit was called"
                _bounded(lambda: _drain_final(why), runtime.config.shutdown_timeout, why)
            else:
                runtime.writer.forget_file()
    except BaseException:  # never keep a process from ending
        pass
    assert _real_exit is not None
    _real_exit(status)


def _follow_os_exit() -> None:
    """Put the draining ``os._exit`` in place (once per interpreter; a forked child has it)."""
    global _real_exit
    if os._exit is _exit_draining:
        return
    _real_exit = os._exit
    os._exit = _exit_draining


class _ExitToken:
    """What multiprocessing's after-fork registry holds (it keeps only a weak reference)."""


_exit_token = _ExitToken()
_after_fork_registered = False


def _follow_multiprocessing_child() -> None:
    """In the children multiprocessing starts, watch for a stopping signal the main thread
    would miss (see ``_signals.watch_for_missed_signals``): at each child's start, and at once
    in a child configured after its start (its first task configured it: a parent that
    configured under ``if __name__ == "__main__":``); nothing when multiprocessing is not in
    use. Draining at their end is ``os._exit``'s."""
    global _after_fork_registered
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    process = sys.modules.get("multiprocessing.process")
    if process is not None and process.parent_process() is not None:
        _signals.watch_for_missed_signals()
    if _after_fork_registered:
        return
    _after_fork_registered = True
    util.register_after_fork(_exit_token, _rearm_in_child)


def _rearm_in_child(token: _ExitToken) -> None:
    if current is not None:
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
        self.genai_attributes = config.genai_span_attributes
        self.stats = _stats
        # App names label the metrics; one taken from a received span name is user text.
        _stats.label = self.scrubber.scrub_label if self.scrubber is not None else str
        self.pipeline: RecordPipeline = plan(
            config, self.scrubber, self.release, self.environment, _stats
        )
        """Where each stage of a record runs (``docs/reliability.md``, *One pipeline*)."""
        self.writer = BatchWriter(
            self.pipeline,
            stats=_stats,
            max_queue_size=config.max_queue_size,
            max_batch_size=config.max_batch_size,
            flush_interval=config.flush_interval,
            max_write_attempts=config.max_write_attempts,
            retry_backoff=config.retry_backoff,
            reference_wait=config.reference_wait,
            run_dir=default_run_dir() if config.run_dir is None else _path(config.run_dir),
            describe=self._describe,
        )

    @property
    def reader(self) -> BoundedReader:
        """The reader of the application's objects (the pipeline's *read* stage)."""
        return self.pipeline.reader

    def _describe(self) -> dict[str, Any]:
        """What this process's ledger file says of it (for whoever finds it after it ended)."""
        from datetime import datetime, timezone

        return {
            "service": self.service_name,
            "database": _shown_database(self.config),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "argv": _shown_command(sys.argv),
        }

    def finish_trace(self, state: TraceState) -> None:
        """Called when the outermost decorated span of a trace ended."""
        state.service_name = self.service_name
        self.stats.trace_finished(state.app_name, state.sampled)
        if state.sampled:
            self.writer.emit(state)


def _shown_command(argv: list[str]) -> list[str]:
    """The command line as a ledger file keeps it: the program and the words before its first
    option, at most four (an option's value may be a secret: ``collect --token ...``)."""
    shown: list[str] = []
    for word in argv[:4]:
        if word.startswith("-") or "=" in word:
            break
        shown.append(word)
    return shown


def _path(value: Any) -> Any:
    from pathlib import Path

    return Path(value)


def _shown_database(config: TracerConfig) -> str:
    """Where this process stores, password hidden (read without SQLAlchemy: with a storage
    process the application never loads it)."""
    if config.sink is not None:
        return type(config.sink).__name__
    url = config.database_url or os.environ.get("RECALLTRACE_DATABASE_URL") or ""
    return shown_url(url) if url else f"sqlite:///{os.path.abspath('recalltrace.db')}"


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
    own_process()
    config.validate()
    if config.sink is None:
        check_default_sink(config.metrics)
    with _lock:
        previous = current
        runtime = Runtime(config)
        current = runtime
        register_instruments(stats, config.meter_provider)
        if config.register_atexit and not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
        if config.drain_on_os_exit:
            _follow_os_exit()
        if config.handle_signals:
            if not _signals.install(_drain_on_signal, _write_eagerly):
                _say_signals_unhandled()
        else:
            _signals.uninstall()
        _follow_multiprocessing_child()
        export_for_children(config)
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
"""(pid, runtime) whose final drain ran: the exit paths that reach it (``atexit``,
``os._exit``, a stopping signal) drain and say the ledger once between them."""


def _drain_final(why: str) -> None:
    """The process is ending: store what is queued within ``shutdown_timeout`` and count the
    rest as dropped (``shutdown``), then say the ledger in one line: at WARNING when anything
    was not stored, at INFO when the drain stored what was queued, nothing when nothing was
    queued. A copy of another process's tracer (a forked child that never traced) has nothing
    to drain."""
    global _drained
    runtime = current
    if runtime is None:
        return
    own_process()
    key = (os.getpid(), id(runtime))
    if _drained == key:
        _stats.report_drops()  # what was dropped since (nothing, as a rule) is still said
        return
    _drained = key
    runtime.writer.ending = True
    waiting = runtime.writer.queue_size()
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
        return
    _stats.report_drops()  # late references only: not requests
    if waiting:
        logger.info(
            "recalltrace: %s: the %d queued record(s) were stored before the end", why, waiting
        )


def flush(timeout: float | None = None) -> bool:
    """Wait until every record queued so far is stored (or dropped), at most ``timeout``
    seconds (default: ``flush_timeout``); on a timeout, say how many still wait."""
    runtime = current
    if runtime is None:
        return True
    limit = runtime.config.flush_timeout if timeout is None else timeout
    done = runtime.writer.force_flush(limit)
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
            _drain_final(why)
        else:
            runtime.writer.force_flush(timeout)

    with _signals.final_drain() if final else contextlib.nullcontext():
        _bounded(drain, timeout, why)


# Beyond shutdown_timeout, the drain on a helper thread is given this long to say what it did.
_DRAIN_GRACE = 2.0


def _bounded(drain: Callable[[], None], timeout: float, why: str) -> None:
    """Run ``drain`` on a helper thread and wait for it at most ``timeout`` (plus a grace).

    A signal handler runs in the main thread between any two of its instructions, also while
    that thread holds one of the tracer's locks (queuing a record when a pool worker is told
    to stop); the drain, needing that lock, would then wait forever in the same thread. On its
    own thread it waits for the lock at most this long, and the process ends as it would have.
    """
    done = _threads.Event()

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
        _threads.Thread(in_thread, "recalltrace-drain").start()
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
    own_process()
    runtime.writer.ending = True
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
