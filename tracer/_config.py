"""Configuration of the tracer: the options dataclasses and their defaults from the environment.

Nothing here imports OpenTelemetry or storage, so ``import tracer`` stays cheap.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, Protocol

from recalltrace.tracer._conventions import (
    DEPLOYMENT_ENVIRONMENT,
    DEPLOYMENT_ENVIRONMENT_OLD,
    SERVICE_NAME,
    SERVICE_VERSION,
)

if TYPE_CHECKING:
    from recalltrace.storage.records import ReferenceUpdate, TraceRecord, WriteResult

logger = logging.getLogger("recalltrace.tracer")

TracerProviderChoice = Literal["auto", "global", "own"]


@dataclass(frozen=True, slots=True)
class ScrubMatch:
    """One piece of text the scrubber is about to redact, as shown to a scrubbing callback."""

    path: str
    """Where the text sits in the trace record, e.g. ``user_input``,
    ``retrieved_contexts[2].content`` or ``metadata.password``."""
    value: str
    """The matched text (for a sensitive key name: the whole value under that key)."""
    pattern: str
    """Name of the pattern that matched: ``api_key``, ``bearer_token``, ``password``, ``email``,
    ``card_number``, ``sensitive_key`` or ``custom``."""


ScrubCallback = Callable[[ScrubMatch], "str | None"]
"""Called for every match. Return ``None`` to redact it with the replacement text, or a string to
put in its place (return ``match.value`` to keep the text unchanged)."""


@dataclass(slots=True)
class ScrubbingOptions:
    """What the tracer redacts from a trace record before it is stored."""

    extra_patterns: Sequence[str] = ()
    """Further regular expressions (matched case-insensitively) to redact from text values and
    to treat as sensitive when they match a metadata key name."""
    callback: ScrubCallback | None = None
    """Decides per match whether to redact, replace or keep it; see :data:`ScrubCallback`.
    A callback that raises is treated as returning ``None`` (the match is redacted)."""
    default_patterns: bool = True
    """Apply the built-in rules: the token formats of the shipped rule files (gitleaks' rules and
    the scrubber's own), the generic detectors (assignments, "the password is ..." phrases,
    credentials in URLs and commands, key blocks, encoded secrets), personal data (e-mail
    addresses, checksummed card and IBAN numbers, SSNs, phone numbers) and sensitive metadata
    keys. See docs/tracing.md, "Scrubbing"."""
    replacement: str = "[REDACTED]"
    """Text put in place of a redacted match."""
    rule_files: Sequence[str] = ()
    """Paths of further rule files in gitleaks' TOML schema (``[[rules]]`` with ``id``,
    ``regex``, ``keywords``, optionally ``secretGroup``, ``entropy`` and ``allowlists``), applied
    with the built-in ones (or alone when ``default_patterns`` is off)."""
    scrub_span_attributes: bool = False
    """Also scrub the spans exporters receive: every text field (name, attributes, events'
    names and attributes, links' attributes, status description) of the decorators' spans and,
    with ``capture_spans``, of the instrumentations' spans span capture sees (see
    ``tracer/_span_scrub.py``). Off by default because it runs on the request path; the stored
    record is always scrubbed, on the background writer thread."""


class TraceSink(Protocol):
    """Where finished trace records go. ``storage.Repository`` is the production sink."""

    def write_traces(self, records: Sequence[TraceRecord]) -> WriteResult | None:
        """Store a batch of records in one transaction (idempotent on ``trace_id``) and say
        what was stored: a :class:`~recalltrace.storage.records.WriteResult` naming the records
        not stored (another request under the same id), or ``None`` when all were. Raise when
        the batch could not be written at all (it is retried)."""

    def attach_reference(self, update: ReferenceUpdate) -> int:
        """Attach late ground truth to a stored trace; raise ``TraceNotFound`` (or any
        ``LookupError``) when the trace is not stored yet."""


# -- the options table ---------------------------------------------------------------------------
# Each option of :class:`TracerConfig` is written once: its field holds the default and the
# documentation, and its metadata the environment variables it is read from (first one set
# wins) with the parser of each. ``from_env`` and the docs' table (checked by a test) follow.

_UNSET: Any = object()
"""A parser's answer for "this value sets nothing" (``RECALLTRACE_SCRUBBING=1``)."""

EnvSource = tuple[str, Callable[[str], Any]]


def _float(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError("not a number") from None


def _int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("not an integer") from None


def _truthy(raw: str) -> bool:
    return raw.lower() in ("1", "true", "yes", "on")


def _text(raw: str) -> str:
    return raw


def _names(raw: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def parse_sample_rates(raw: str) -> dict[str, float]:
    """Parse ``"app-a=0.5,app-b=1"`` into ``{"app-a": 0.5, "app-b": 1.0}``."""
    rates: dict[str, float] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.rpartition("=")
        if not sep or not name.strip():
            raise ValueError(f"expected app=rate, got {item!r}")
        rates[name.strip()] = _float(value)
    return rates


def _resource_attribute(*names: str) -> Callable[[str], Any]:
    """A parser of ``OTEL_RESOURCE_ATTRIBUTES`` that takes the first of ``names`` it holds."""

    def parse(raw: str) -> Any:
        found: dict[str, str] = {}
        for item in raw.split(","):
            key, sep, value = item.partition("=")
            if sep and value.strip():
                found[key.strip()] = value.strip()
        for name in names:
            if name in found:
                return found[name]
        return _UNSET

    return parse


_service_name_from_resource = _resource_attribute(SERVICE_NAME)


def _scrubbing_switch(raw: str) -> Any:
    return _UNSET if _truthy(raw) else False


def _provider_choice(raw: str) -> str:
    if raw not in ("auto", "global", "own"):
        raise ValueError("expected auto, global or own")
    return raw


def _storage_process_choice(raw: str) -> Any:
    if raw.lower() == "auto":
        return None
    return _truthy(raw)


def _enabled(raw: str) -> bool:
    return _truthy(raw)


def _otel_disabled(raw: str) -> Any:
    return False if _truthy(raw) else _UNSET


def option(default: Any = MISSING, *, env: Sequence[EnvSource] = (), factory: Any = MISSING) -> Any:
    """A :class:`TracerConfig` field with the environment variables it is read from."""
    metadata = {"env": tuple(env)}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def env_sources(name: str) -> tuple[EnvSource, ...]:
    """The environment variables (with their parsers) option ``name`` is read from."""
    return tuple(TracerConfig.__dataclass_fields__[name].metadata.get("env", ()))


@dataclass(slots=True)
class TracerConfig:
    """All tracer options. Build it with :meth:`from_env` to get the environment defaults."""

    database_url: str | None = option(None, env=[("RECALLTRACE_DATABASE_URL", _text)])
    """Where records are stored. ``None`` means ``RECALLTRACE_DATABASE_URL``, else the SQLite
    file ``./recalltrace.db``."""
    service_name: str | None = option(
        None,
        env=[
            ("RECALLTRACE_SERVICE_NAME", _text),
            ("OTEL_SERVICE_NAME", _text),
            ("OTEL_RESOURCE_ATTRIBUTES", _service_name_from_resource),
        ],
    )
    """``service.name`` written on every record. ``None`` means ``RECALLTRACE_SERVICE_NAME``,
    ``OTEL_SERVICE_NAME``, ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``, the resource of
    the joined TracerProvider, else ``unknown_service``."""
    release: str | None = option(
        None,
        env=[
            ("RECALLTRACE_RELEASE", _text),
            ("OTEL_RESOURCE_ATTRIBUTES", _resource_attribute(SERVICE_VERSION)),
        ],
    )
    """The release (version) written on every record. ``None`` means ``RECALLTRACE_RELEASE``,
    ``service.version`` in ``OTEL_RESOURCE_ATTRIBUTES``, the joined TracerProvider's resource,
    else none."""
    environment: str | None = option(
        None,
        env=[
            ("RECALLTRACE_ENVIRONMENT", _text),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                _resource_attribute(DEPLOYMENT_ENVIRONMENT, DEPLOYMENT_ENVIRONMENT_OLD),
            ),
        ],
    )
    """The deployment environment written on every record: ``RECALLTRACE_ENVIRONMENT``,
    ``deployment.environment.name`` (or the older ``deployment.environment``) in
    ``OTEL_RESOURCE_ATTRIBUTES`` or the provider's resource, else none."""
    sample_rate: float = option(1.0, env=[("RECALLTRACE_SAMPLE_RATE", _float)])
    """Share of traces stored for scoring, 0..1. Decided once per trace from its trace id, so
    the set sampled at a higher rate contains the lower one's."""
    sample_rates: Mapping[str, float] = option(
        factory=dict, env=[("RECALLTRACE_SAMPLE_RATES", parse_sample_rates)]
    )
    """Per-app rates keyed by the root's name, overriding ``sample_rate``
    (``RECALLTRACE_SAMPLE_RATES="support-bot=0.5,search=1"``)."""
    scrubbing: ScrubbingOptions | Literal[False] = option(
        factory=ScrubbingOptions, env=[("RECALLTRACE_SCRUBBING", _scrubbing_switch)]
    )
    """Scrubbing options, or ``False`` to store text unchanged (``RECALLTRACE_SCRUBBING=0``)."""
    genai_span_attributes: bool = option(
        False, env=[("RECALLTRACE_GENAI_SPAN_ATTRIBUTES", _truthy)]
    )
    """Also put the OpenTelemetry GenAI conventions' content attributes on the decorators'
    spans (``gen_ai.retrieval.query.text``, ``gen_ai.retrieval.documents``,
    ``gen_ai.input.messages``/``output.messages``, ``gen_ai.response.model``,
    ``gen_ai.usage.*``) beside OpenInference's, for a backend that reads those. Off by default:
    every attribute costs the request path, and OpenInference's carry the same content.
    ``gen_ai.operation.name`` (and the ``data_source``/``model`` given to the decorators) are
    always set."""
    max_queue_size: int = option(2048, env=[("RECALLTRACE_MAX_QUEUE_SIZE", _int)])
    """Bound of the in-memory queue of records waiting for storage, including records kept for
    a retry while storage is down. Beyond it records are dropped and counted; the caller is
    never blocked."""
    max_batch_size: int = option(256, env=[("RECALLTRACE_MAX_BATCH_SIZE", _int)])
    """Most records written in one transaction."""
    flush_interval: float = option(1.0, env=[("RECALLTRACE_FLUSH_INTERVAL", _float)])
    """Seconds the writer waits for a batch to fill before writing what it has."""
    shutdown_timeout: float = option(5.0, env=[("RECALLTRACE_SHUTDOWN_TIMEOUT", _float)])
    """Seconds :func:`shutdown`, the exit hook and a stopping signal wait for the queue to
    drain; what is still queued then is counted as dropped (``shutdown``) and logged."""
    auto_migrate: bool | None = option(None, env=[("RECALLTRACE_AUTO_MIGRATE", _truthy)])
    """``True``: create or upgrade the recalltrace tables when the tracer first opens the
    database. ``None`` (default): create them only in a Postgres database that has none of them
    (a fresh one), never upgrade an older schema. ``False``: never touch a Postgres schema. SQLite
    always creates and upgrades. A database without the tables keeps the records (bounded) and
    one line says to run ``recalltrace db upgrade``."""
    storage_process: bool | None = option(
        None, env=[("RECALLTRACE_STORAGE_PROCESS", _storage_process_choice)]
    )
    """Store through a child process the writer starts (the scrubbing rules and the database
    driver's work then run on the child's interpreter, not between the application's threads).
    The child also assembles the records; the application's process only reads its own objects
    (within the reader's budget) and keeps the ledger. With a scrubbing ``callback``
    (application code) records are assembled and scrubbed in the application's process.
    ``None`` (the default, ``RECALLTRACE_STORAGE_PROCESS=auto``): decided at the first write, a
    storage process when the records go to Postgres and the process is not ending (a service),
    the writer thread when its first write is its last (a job's process, a short script) or the
    database is a SQLite file; see docs/tracing.md, *Where records are stored from*. Applies to
    the default sink only (not with ``sink=``)."""
    storage_process_nice: int = option(0, env=[("RECALLTRACE_STORAGE_PROCESS_NICE", _int)])
    """How much lower the storage process's CPU priority is than the application's (``nice``
    increment, 0 to 19; 0, the default: the same). Raised, the child takes only the CPU the
    application leaves: a saturated service keeps more of its speed, but on a host whose cores
    are all busy the child falls behind, records wait in the queue (dropped and counted past
    ``max_queue_size``) and the drain when the process stops takes longer (what
    ``shutdown_timeout`` does not cover is dropped and counted)."""
    flush_timeout: float = option(30.0, env=[("RECALLTRACE_FLUSH_TIMEOUT", _float)])
    """Seconds :func:`flush` waits when called without a timeout (it never waits forever, e.g.
    while the database is down); it returns False and logs what is still waiting."""
    handle_signals: bool = option(True, env=[("RECALLTRACE_HANDLE_SIGNALS", _truthy)])
    """Drain the queue on SIGTERM and SIGINT before the process ends, chaining to the handlers
    already installed (uvicorn's, gunicorn's, the application's) without changing what they do.
    Installed from the main thread only."""
    max_write_attempts: int = option(5, env=[("RECALLTRACE_MAX_WRITE_ATTEMPTS", _int)])
    """Attempts to write a record that storage refuses, with exponential back-off, before it
    is dropped as ``storage_error``. While storage cannot be reached at all, records are kept
    within ``max_queue_size`` without using attempts."""
    retry_backoff: float = option(0.5)
    """First back-off in seconds after a failed write; doubled per failure, at most 5 s."""
    reference_wait: float = option(30.0, env=[("RECALLTRACE_REFERENCE_WAIT", _float)])
    """Seconds a late reference waits for its trace to be stored (it may still be in flight)
    before it is dropped."""
    max_text_length: int | None = option(100_000)
    """Longest text stored per field; longer text is cut and the cut noted on the record."""
    tracer_provider: TracerProviderChoice | Any = option(
        "auto", env=[("RECALLTRACE_TRACER_PROVIDER", _provider_choice)]
    )
    """``"global"``: join the application's global TracerProvider (its exporters get the spans).
    ``"own"``: create an SDK TracerProvider and install it globally if none is installed yet.
    ``"auto"`` (default): join if the application already installed one, else ``"own"``.
    Or pass a TracerProvider instance to use it without touching the global one. An own
    provider exports to the exporter named by ``OTEL_TRACES_EXPORTER`` (``otlp`` or
    ``console``) when that is set."""
    meter_provider: Any = option(None)
    """MeterProvider for the tracer's own metrics; ``None`` means the global one (no metrics SDK
    is set up by the tracer)."""
    sink: TraceSink | None = option(None)
    """Where records go; ``None`` means the repository on ``database_url`` (what
    ``recalltrace.open_repository`` opens), opened lazily on the writer thread."""
    enabled: bool = option(
        True, env=[("RECALLTRACE_ENABLED", _enabled), ("OTEL_SDK_DISABLED", _otel_disabled)]
    )
    """``False`` turns the decorators into plain calls (``RECALLTRACE_ENABLED=0`` or
    ``OTEL_SDK_DISABLED=true``)."""
    capture_spans: bool = option(False, env=[("RECALLTRACE_CAPTURE_SPANS", _truthy)])
    """Also store the RAG requests found in the spans of the application's instrumentors
    (OpenInference, OpenTelemetry GenAI, OpenLLMetry): a :class:`recalltrace.SpanCapture` is
    added to the application's TracerProvider, also to one it sets after ``configure``
    (see ``docs/ingest.md``)."""
    register_atexit: bool = option(True)
    """Drain the queue when the interpreter exits."""
    drain_on_os_exit: bool = option(True, env=[("RECALLTRACE_DRAIN_ON_OS_EXIT", _truthy)])
    """Drain the queue (within ``shutdown_timeout``) when the process calls ``os._exit``, as
    multiprocessing's children, job queues that fork a child per job (RQ) and ``os.fork()``
    loops end. ``os._exit`` is wrapped once, at the first ``configure``; a process holding no
    record ends at once."""
    metrics: Sequence[str] | None = option(None, env=[("RECALLTRACE_METRICS", _names)])
    """The variants whose scoring jobs are created when a record is stored (their keys, such as
    ``"id_based_context_recall"``); ``None``: all seven. An unknown key is refused by
    ``configure`` with one line. A variant left out can be scored later with ``recalltrace
    backfill``."""
    run_dir: str | None = option(None, env=[("RECALLTRACE_RUN_DIR", _text)])
    """The directory of the processes' ledger files (one small file per process that holds
    records; see docs/reliability.md, *Processes that end without a word*). ``None``:
    ``$XDG_RUNTIME_DIR/recalltrace``, else ``recalltrace-<uid>`` in the temporary directory.
    Processes that share it count each other's records when one is killed."""

    @classmethod
    def from_env(cls, **overrides: Any) -> TracerConfig:
        """Defaults from ``RECALLTRACE_*`` and the standard ``OTEL_*`` variables (each
        option's sources, in :attr:`dataclasses.Field.metadata`), then ``overrides`` (keyword
        arguments named like the fields; ``None`` values are ignored). A variable that cannot
        be read is ignored with one warning naming it."""
        config = cls()
        inherited = _inherited()
        for name, spec in cls.__dataclass_fields__.items():
            for variable, parse in spec.metadata.get("env", ()):
                raw = os.environ.get(variable, "").strip()
                if not raw:
                    continue
                try:
                    value = parse(raw)
                except ValueError as exc:
                    logger.warning("ignoring %s=%r: %s", variable, raw, exc)
                    continue
                if value is _UNSET:
                    continue
                setattr(config, name, value)
                break
        if inherited is not None:
            _apply_inherited(config, inherited)
        for name, value in overrides.items():
            if name not in cls.__dataclass_fields__:
                raise TypeError(f"unknown tracer option {name!r}")
            if value is not None:
                setattr(config, name, value)
        config.validate()
        return config

    def validate(self) -> None:
        """Raise ``ValueError`` for options that cannot work."""
        for app, rate in {"": self.sample_rate, **dict(self.sample_rates)}.items():
            if not 0.0 <= float(rate) <= 1.0:
                where = f" for app {app!r}" if app else ""
                raise ValueError(f"sample rate{where} must be within 0..1, got {rate!r}")
        if self.max_queue_size < 1:
            raise ValueError("max_queue_size must be at least 1")
        if self.max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if self.flush_interval <= 0:
            raise ValueError("flush_interval must be positive")
        if self.storage_process is True and self.sink is not None:
            raise ValueError(
                "storage_process applies to the default sink on database_url; pass either "
                "sink= or storage_process=True, not both"
            )
        if not self.flush_timeout > 0 or not self.shutdown_timeout >= 0:
            raise ValueError("flush_timeout must be positive and shutdown_timeout not negative")
        if self.max_write_attempts < 1:
            raise ValueError("max_write_attempts must be at least 1")
        if not 0 <= self.storage_process_nice <= 19:
            raise ValueError("storage_process_nice must be between 0 and 19")
        if self.max_text_length is not None and self.max_text_length < 1:
            raise ValueError("max_text_length must be positive or None")
        if isinstance(self.tracer_provider, str) and self.tracer_provider not in (
            "auto",
            "global",
            "own",
        ):
            raise ValueError("tracer_provider must be 'auto', 'global', 'own' or a provider")


# -- configuration a child process inherits -------------------------------------------------------
# ``configure()`` leaves its options in one environment variable, which the children
# multiprocessing starts (spawn, forkserver) inherit: a child that never ran ``configure()``
# (the parent configured under ``if __name__ == "__main__":``) then stores where its parent
# does. Only a multiprocessing child of the process that wrote it applies it, and only for
# options whose environment variables the child still sees as the parent saw them (a parent
# that gave a child another RECALLTRACE_DATABASE_URL means it).

INHERITED_ENV = "RECALLTRACE_PARENT_CONFIG"
_SCRUBBING_FIELDS = ("extra_patterns", "default_patterns", "replacement", "rule_files")
_inherited_said = False


def export_for_children(config: TracerConfig) -> None:
    """Leave ``config``'s options where this process's multiprocessing children find them."""
    options: dict[str, Any] = {}
    left: list[str] = []
    seen: dict[str, str | None] = {}
    for spec in fields(TracerConfig):
        sources = spec.metadata.get("env", ())
        value = getattr(config, spec.name)
        if not sources:
            if spec.name == "sink" and value is not None:
                left.append(f"sink={type(value).__name__}")
            continue
        for variable, _ in sources:
            seen[variable] = os.environ.get(variable)
        encoded = _encode(spec.name, value)
        if encoded is _UNSET:
            # What decides where records go or what they keep; anything else (a provider
            # object, say) the child simply makes its own.
            if spec.name == "scrubbing":
                left.append("a scrubbing callback")
            continue
        options[spec.name] = encoded
    os.environ[INHERITED_ENV] = json.dumps(
        {"pid": os.getpid(), "options": options, "env": seen, "left": left}
    )


def _encode(name: str, value: Any) -> Any:
    if name == "scrubbing":
        if value is False:
            return False
        if isinstance(value, ScrubbingOptions):
            if value.callback is not None:
                return _UNSET
            encoded = {f: getattr(value, f) for f in _SCRUBBING_FIELDS}
            encoded["extra_patterns"] = list(value.extra_patterns)
            encoded["rule_files"] = [str(path) for path in value.rule_files]
            encoded["scrub_span_attributes"] = value.scrub_span_attributes
            return encoded
        return _UNSET
    if name == "sample_rates":
        return {str(k): float(v) for k, v in dict(value).items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return _UNSET


def _inherited() -> dict[str, Any] | None:
    """The options the parent left, when this process is a multiprocessing child of it."""
    raw = os.environ.get(INHERITED_ENV)
    if not raw:
        return None
    process = sys.modules.get("multiprocessing.process")
    parent = process.parent_process() if process is not None else None
    if parent is None:
        return None
    try:
        inherited = json.loads(raw)
        if int(inherited["pid"]) != parent.pid or int(inherited["pid"]) == os.getpid():
            return None
    except (ValueError, KeyError, TypeError):
        return None
    return inherited if isinstance(inherited, dict) else None


def _apply_inherited(config: TracerConfig, inherited: dict[str, Any]) -> None:
    global _inherited_said
    seen = inherited.get("env") or {}
    options = inherited.get("options") or {}
    for spec in fields(TracerConfig):
        if spec.name not in options:
            continue
        sources = spec.metadata.get("env", ())
        if any(os.environ.get(variable) != seen.get(variable) for variable, _ in sources):
            continue  # the parent gave this child its own value: the child's environment says
        value = options[spec.name]
        if spec.name == "scrubbing" and isinstance(value, dict):
            value = ScrubbingOptions(
                extra_patterns=tuple(value.get("extra_patterns", ())),
                default_patterns=bool(value.get("default_patterns", True)),
                replacement=str(value.get("replacement", "[REDACTED]")),
                rule_files=tuple(value.get("rule_files", ())),
                scrub_span_attributes=bool(value.get("scrub_span_attributes", False)),
            )
        setattr(config, spec.name, value)
    left = inherited.get("left") or []
    if left and not _inherited_said:
        _inherited_said = True
        where = (
            config.database_url
            or os.environ.get("RECALLTRACE_DATABASE_URL")
            or ("sqlite:///recalltrace.db in " + os.getcwd())
        )
        logger.warning(
            "recalltrace: this process (pid %d) is a child of process %s, configured with %s, "
            "which cannot reach another process: this process stores to %s instead (call "
            "configure() in the child, e.g. in the pool's initializer)",
            os.getpid(),
            inherited.get("pid"),
            ", ".join(str(item) for item in left),
            shown_url(where),
        )


def shown_url(url: str) -> str:
    """``url`` without its password."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        credentials, _, host = rest.rpartition("@")
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in credentials else url
    return url
