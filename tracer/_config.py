"""Configuration of the tracer: the options dataclasses and their defaults from the environment.

Nothing here imports OpenTelemetry or storage, so ``import tracer`` stays cheap.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from recalltrace.storage.records import ReferenceUpdate, TraceRecord

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
    """Apply the built-in patterns: API keys, bearer tokens and JWTs, passwords written as
    ``password=...``, e-mail addresses, card numbers (Luhn-checked) and sensitive metadata keys."""
    replacement: str = "[REDACTED]"
    """Text put in place of a redacted match."""
    scrub_span_attributes: bool = False
    """Also scrub the text the tracer puts on OpenTelemetry spans (``input.value``,
    ``output.value``, document contents). Off by default because it runs on the request path;
    the stored record is always scrubbed, on the background writer thread."""


class TraceSink(Protocol):
    """Where finished trace records go. ``storage.Repository`` is the production sink."""

    def write_traces(self, records: Sequence[TraceRecord]) -> None:
        """Store a batch of records in one transaction (idempotent on ``trace_id``)."""

    def attach_reference(self, update: ReferenceUpdate) -> int:
        """Attach late ground truth to a stored trace; raise ``TraceNotFound`` (or any
        ``LookupError``) when the trace is not stored yet."""


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _env_float(name: str, default: float) -> float:
    raw = _env(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        logger.warning("ignoring %s=%r: not a number", name, raw)
        return default


def _env_int(name: str, default: int) -> int:
    raw = _env(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        logger.warning("ignoring %s=%r: not an integer", name, raw)
        return default


def _env_bool(name: str) -> bool | None:
    raw = _env(name)
    if raw is None:
        return None
    return raw.lower() in ("1", "true", "yes", "on")


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
        rates[name.strip()] = float(value)
    return rates


def _service_name_from_env() -> str | None:
    name = _env("RECALLTRACE_SERVICE_NAME") or _env("OTEL_SERVICE_NAME")
    if name:
        return name
    resource_attributes = _env("OTEL_RESOURCE_ATTRIBUTES")
    if resource_attributes:
        for item in resource_attributes.split(","):
            key, sep, value = item.partition("=")
            if sep and key.strip() == "service.name" and value.strip():
                return value.strip()
    return None


@dataclass(slots=True)
class TracerConfig:
    """All tracer options. Build it with :meth:`from_env` to get the environment defaults."""

    database_url: str | None = None
    """Where records are stored. ``None`` means ``RECALLTRACE_DATABASE_URL``, else the SQLite
    file ``./recalltrace.db``."""
    service_name: str | None = None
    """``service.name`` written on every record. ``None`` means ``RECALLTRACE_SERVICE_NAME``,
    ``OTEL_SERVICE_NAME``, ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``, the resource of
    the joined TracerProvider, else ``unknown_service``."""
    sample_rate: float = 1.0
    """Share of traces stored for scoring, 0..1 (``RECALLTRACE_SAMPLE_RATE``). Decided once per
    trace from its trace id, so the set sampled at a higher rate contains the lower one's."""
    sample_rates: Mapping[str, float] = field(default_factory=dict)
    """Per-app rates keyed by the root's name, overriding ``sample_rate``
    (``RECALLTRACE_SAMPLE_RATES="support-bot=0.5,search=1"``)."""
    scrubbing: ScrubbingOptions | Literal[False] = field(default_factory=ScrubbingOptions)
    """Scrubbing options, or ``False`` to store text unchanged (``RECALLTRACE_SCRUBBING=0``)."""
    max_queue_size: int = 2048
    """Bound of the in-memory queue of records waiting for storage, including records kept for
    a retry while storage is down (``RECALLTRACE_MAX_QUEUE_SIZE``). Beyond it records are
    dropped and counted; the caller is never blocked."""
    max_batch_size: int = 256
    """Most records written in one transaction (``RECALLTRACE_MAX_BATCH_SIZE``)."""
    flush_interval: float = 1.0
    """Seconds the writer waits for a batch to fill before writing what it has
    (``RECALLTRACE_FLUSH_INTERVAL``)."""
    shutdown_timeout: float = 5.0
    """Seconds :func:`shutdown` and the exit hook wait for the queue to drain
    (``RECALLTRACE_SHUTDOWN_TIMEOUT``)."""
    max_write_attempts: int = 5
    """Attempts to write a record that storage refuses, with exponential back-off, before it
    is dropped as ``storage_error`` (``RECALLTRACE_MAX_WRITE_ATTEMPTS``). While storage cannot
    be reached at all, records are kept within ``max_queue_size`` without using attempts."""
    retry_backoff: float = 0.5
    """First back-off in seconds after a failed write; doubled per failure, at most 30 s."""
    reference_wait: float = 30.0
    """Seconds a late reference waits for its trace to be stored (it may still be in flight)
    before it is dropped (``RECALLTRACE_REFERENCE_WAIT``)."""
    max_text_length: int | None = 100_000
    """Longest text stored per field; longer text is cut and the cut noted on the record."""
    tracer_provider: TracerProviderChoice | Any = "auto"
    """``"global"``: join the application's global TracerProvider (its exporters get the spans).
    ``"own"``: create an SDK TracerProvider and install it globally if none is installed yet.
    ``"auto"`` (default): join if the application already installed one, else ``"own"``.
    Or pass a TracerProvider instance to use it without touching the global one.
    Environment: ``RECALLTRACE_TRACER_PROVIDER``. An own provider exports to the exporter named
    by ``OTEL_TRACES_EXPORTER`` (``otlp`` or ``console``) when that is set."""
    meter_provider: Any = None
    """MeterProvider for the tracer's own metrics; ``None`` means the global one (no metrics SDK
    is set up by the tracer)."""
    sink: TraceSink | None = None
    """Where records go; ``None`` means ``storage.open_repository(database_url)``, opened lazily
    on the writer thread."""
    enabled: bool = True
    """``False`` turns the decorators into plain calls (``RECALLTRACE_ENABLED=0`` or
    ``OTEL_SDK_DISABLED=true``)."""
    register_atexit: bool = True
    """Drain the queue when the interpreter exits."""

    @classmethod
    def from_env(cls, **overrides: Any) -> TracerConfig:
        """Defaults from ``RECALLTRACE_*`` and the standard ``OTEL_*`` variables, then
        ``overrides`` (keyword arguments named like the fields; ``None`` values are ignored)."""
        config = cls(
            database_url=_env("RECALLTRACE_DATABASE_URL"),
            service_name=_service_name_from_env(),
            sample_rate=_env_float("RECALLTRACE_SAMPLE_RATE", 1.0),
            max_queue_size=_env_int("RECALLTRACE_MAX_QUEUE_SIZE", 2048),
            max_batch_size=_env_int("RECALLTRACE_MAX_BATCH_SIZE", 256),
            flush_interval=_env_float("RECALLTRACE_FLUSH_INTERVAL", 1.0),
            shutdown_timeout=_env_float("RECALLTRACE_SHUTDOWN_TIMEOUT", 5.0),
            max_write_attempts=_env_int("RECALLTRACE_MAX_WRITE_ATTEMPTS", 5),
            reference_wait=_env_float("RECALLTRACE_REFERENCE_WAIT", 30.0),
        )
        rates = _env("RECALLTRACE_SAMPLE_RATES")
        if rates:
            try:
                config.sample_rates = parse_sample_rates(rates)
            except ValueError as exc:
                logger.warning("ignoring RECALLTRACE_SAMPLE_RATES: %s", exc)
        if _env_bool("RECALLTRACE_SCRUBBING") is False:
            config.scrubbing = False
        provider = _env("RECALLTRACE_TRACER_PROVIDER")
        if provider in ("auto", "global", "own"):
            config.tracer_provider = provider
        elif provider is not None:
            logger.warning("ignoring RECALLTRACE_TRACER_PROVIDER=%r", provider)
        if _env_bool("RECALLTRACE_ENABLED") is False or _env_bool("OTEL_SDK_DISABLED"):
            config.enabled = False
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
        if self.max_write_attempts < 1:
            raise ValueError("max_write_attempts must be at least 1")
        if self.max_text_length is not None and self.max_text_length < 1:
            raise ValueError("max_text_length must be positive or None")
        if isinstance(self.tracer_provider, str) and self.tracer_provider not in (
            "auto",
            "global",
            "own",
        ):
            raise ValueError("tracer_provider must be 'auto', 'global', 'own' or a provider")
