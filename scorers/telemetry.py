"""OpenTelemetry metrics and evaluation events of the scoring worker and its judge calls.

Instruments are created on whatever meter and logger providers are passed in (or the global
ones), so an application that already configured OpenTelemetry keeps its exporters.
:func:`setup_telemetry` builds providers for a stand-alone worker from the standard ``OTEL_*``
variables, a Prometheus scrape port, or the console.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import _logs, metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from recalltrace.scorers._judge import JudgeCallRecord
from recalltrace.scorers._result import ScoreResult

if TYPE_CHECKING:
    from recalltrace.storage.contracts import QueueStats

logger = logging.getLogger(__name__)

#: Explicit buckets of the recall histogram: one every 0.1.
SCORE_BUCKETS: tuple[float, ...] = tuple(round(i / 10, 1) for i in range(11))
#: GenAI semantic-convention buckets of ``gen_ai.client.token.usage``.
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(4**i) for i in range(14))
#: GenAI semantic-convention buckets of ``gen_ai.client.operation.duration`` (seconds).
DURATION_BUCKETS: tuple[float, ...] = tuple(0.01 * 2**i for i in range(14))

METER_NAME = "recalltrace.worker"

# Attribute names.
ATTR_METRIC = "rag.metric"
ATTR_APP = "rag.app"
ATTR_OUTCOME = "rag.job.outcome"
ATTR_REQUEST_MODEL = "gen_ai.request.model"
ATTR_OPERATION = "gen_ai.operation.name"
ATTR_PROVIDER = "gen_ai.provider.name"
ATTR_SYSTEM = "gen_ai.system"
ATTR_TOKEN_TYPE = "gen_ai.token.type"
ATTR_ERROR_TYPE = "error.type"

EVALUATION_EVENT = "gen_ai.evaluation.result"
BUDGET_EVENT = "rag.judge.budget_reached"


def model_name(model: str) -> str:
    """The model as the GenAI conventions name it: LiteLLM's ``provider/`` prefix removed
    (``openai/gpt-4o-mini`` -> ``gpt-4o-mini``); the provider goes in
    ``gen_ai.provider.name``."""
    return model.split("/", 1)[1] if "/" in model else model


#: Every value of ``rag.job.outcome``.
JOB_OUTCOMES: tuple[str, ...] = ("scored", "skipped", "failed", "retried")


@dataclass
class WorkerTelemetry:
    """The worker's instruments.

    ``rag.context_recall`` (histogram, unit ``1``, buckets every 0.1) by ``rag.metric``,
    ``rag.app`` and ``gen_ai.request.model``; ``rag.worker.jobs`` (counter) by outcome;
    ``rag.scoring.duration`` (histogram, s); ``rag.queue.depth`` and ``rag.queue.oldest_due_age``
    (observable gauges); ``rag.judge.paused`` (counter of pauses after terminal judge errors);
    ``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration`` for every judge call;
    and one ``gen_ai.evaluation.result`` event per score through the logs API.
    """

    meter_provider: metrics.MeterProvider | None = None
    logger_provider: _logs.LoggerProvider | None = None
    queue: QueueStats | None = None
    """The latest queue figures of the variants this worker runs (its exit line and status)."""
    queues: dict[str, QueueStats] | None = None
    """The latest queue figures of every variant in the database, refreshed by the worker's
    maintenance loop: what the queue gauges report (nothing until the first refresh)."""

    def __post_init__(self) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            own_version = version("recalltrace")
        except PackageNotFoundError:  # running from a source tree
            own_version = "0"
        provider = self.meter_provider or metrics.get_meter_provider()
        meter = provider.get_meter(METER_NAME, own_version)
        self.recall = meter.create_histogram(
            "rag.context_recall",
            unit="1",
            description="Context-recall scores of sampled traces, by variant.",
            explicit_bucket_boundaries_advisory=SCORE_BUCKETS,
        )
        self.jobs = meter.create_counter(
            "rag.worker.jobs",
            unit="{job}",
            description="Scoring jobs handled, by outcome (scored, skipped, failed, retried).",
        )
        self.scoring_duration = meter.create_histogram(
            "rag.scoring.duration",
            unit="s",
            description="Wall time to score one job, judge calls included.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.judge_paused = meter.create_counter(
            "rag.judge.paused",
            unit="{pause}",
            description="Times scoring with a judge model was paused by a configuration error.",
        )
        self.budget_reached = meter.create_counter(
            "rag.judge.budget_reached",
            unit="{period}",
            description="Periods in which the judge budget was reached and LLM variants paused.",
        )
        # The currency in the name and as an annotation unit: Prometheus names are lower case,
        # and an exporter appends a plain unit as it is ("_USD").
        self.judge_cost = meter.create_counter(
            "rag.judge.cost.usd",
            unit="{USD}",
            description="Judge cost from LiteLLM's price list (calls of unknown price excluded).",
        )
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens used per judge call, by token type.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.operation_duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="Duration of judge calls.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        meter.create_observable_gauge(
            "rag.queue.depth",
            callbacks=[self._observe_depth],
            unit="{job}",
            description="Scoring jobs by state: due (queued), running, waiting, failed.",
        )
        meter.create_observable_gauge(
            "rag.queue.oldest_due_age",
            callbacks=[self._observe_age],
            unit="s",
            description="Age of the oldest due job: the scoring lag to alert on.",
        )
        logs = self.logger_provider or _logs.get_logger_provider()
        self._events = logs.get_logger(METER_NAME, own_version)

    # -- gauges -------------------------------------------------------------------------
    def _observe_depth(self, _options: CallbackOptions) -> Iterable[Observation]:
        observations = []
        for metric, q in sorted((self.queues or {}).items()):
            for state, value in (
                ("due", q.due),
                ("running", q.running),
                ("waiting", q.waiting),
                ("failed", q.failed),
            ):
                observations.append(
                    Observation(value, {"rag.job.state": state, ATTR_METRIC: metric})
                )
        return observations

    def _observe_age(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(q.oldest_due_age_s or 0.0, {ATTR_METRIC: metric})
            for metric, q in sorted((self.queues or {}).items())
        ]

    # -- recording ----------------------------------------------------------------------
    def initialise(self, metrics: Iterable[str], judge_model: str | None) -> None:
        """Create every known series at zero before the first event, so that ``increase()``
        sees the first pause and failure ratios are 0 rather than empty."""
        for metric in metrics:
            for outcome in JOB_OUTCOMES:
                self.jobs.add(0, {ATTR_OUTCOME: outcome, ATTR_METRIC: metric})
        if judge_model:
            self.judge_paused.add(0, {ATTR_REQUEST_MODEL: model_name(judge_model)})
            self.budget_reached.add(0, {ATTR_REQUEST_MODEL: model_name(judge_model)})

    def record_job(self, outcome: str, metric: str) -> None:
        """Count one job outcome: ``scored``, ``skipped``, ``failed`` or ``retried``."""
        self.jobs.add(1, {ATTR_OUTCOME: outcome, ATTR_METRIC: metric})

    def record_score(
        self,
        result: ScoreResult,
        *,
        app_name: str,
        trace_id: str,
        judge_model: str | None,
        duration_s: float | None,
        otel_trace_id: str | None = None,
        otel_span_id: str | None = None,
    ) -> None:
        """Record a stored score: the histogram, the duration, and the evaluation event."""
        attributes: dict[str, Any] = {ATTR_METRIC: result.metric, ATTR_APP: app_name}
        if judge_model:
            attributes[ATTR_REQUEST_MODEL] = model_name(judge_model)
        if result.status == "scored" and result.value is not None:
            self.recall.record(result.value, attributes)
        if duration_s is not None:
            self.scoring_duration.record(duration_s, {ATTR_METRIC: result.metric})
        self.emit_evaluation(
            result,
            app_name=app_name,
            trace_id=trace_id,
            otel_trace_id=otel_trace_id,
            otel_span_id=otel_span_id,
        )

    def emit_evaluation(
        self,
        result: ScoreResult,
        *,
        app_name: str,
        trace_id: str,
        otel_trace_id: str | None = None,
        otel_span_id: str | None = None,
    ) -> None:
        """Emit one ``gen_ai.evaluation.result`` event linked to the request it judges: the
        OpenTelemetry trace and the request's root span (``trace_id``, the record's own id,
        is an attribute; records stored before records had their own ids use it as the trace
        id, which it was)."""
        attributes: dict[str, Any] = {
            "gen_ai.evaluation.name": result.metric,
            "gen_ai.evaluation.explanation": result.reason,
            "gen_ai.evaluation.score.label": result.label,
            "rag.score.status": result.status,
            "rag.metric.version": result.version,
            "rag.record.id": trace_id,
            ATTR_APP: app_name,
        }
        if result.value is not None:
            attributes["gen_ai.evaluation.score.value"] = result.value
        if result.model:
            attributes[ATTR_REQUEST_MODEL] = model_name(result.model)
        try:
            trace_int = int(otel_trace_id or trace_id, 16)
        except ValueError:
            trace_int = 0
        try:
            span_int = int(otel_span_id, 16) if otel_span_id else 0
        except ValueError:
            span_int = 0
        # Scores are linked to the request they judge: its trace, and its root span when known.
        context = None
        if trace_int:
            context = set_span_in_context(
                NonRecordingSpan(
                    SpanContext(
                        trace_id=trace_int,
                        span_id=span_int,
                        is_remote=True,
                        trace_flags=TraceFlags(TraceFlags.SAMPLED),
                    )
                )
            )
        now = time.time_ns()
        record = _logs.LogRecord(
            timestamp=now,
            observed_timestamp=now,
            event_name=EVALUATION_EVENT,
            attributes=attributes,
            context=context,
        )
        self._events.emit(record)

    def record_call(self, call: JudgeCallRecord) -> None:
        """Record one judge HTTP attempt with the GenAI metric names and attributes."""
        base: dict[str, Any] = {
            ATTR_OPERATION: call.operation,
            ATTR_REQUEST_MODEL: model_name(call.model),
        }
        if call.provider:
            base[ATTR_PROVIDER] = call.provider
            base[ATTR_SYSTEM] = call.provider
        duration_attrs = dict(base)
        if call.error_type:
            duration_attrs[ATTR_ERROR_TYPE] = call.error_type
        self.operation_duration.record(call.latency_s, duration_attrs)
        if call.prompt_tokens is not None:
            self.token_usage.record(call.prompt_tokens, {**base, ATTR_TOKEN_TYPE: "input"})
        if call.completion_tokens is not None:
            self.token_usage.record(call.completion_tokens, {**base, ATTR_TOKEN_TYPE: "output"})
        if call.cost_usd:
            self.judge_cost.add(call.cost_usd, base)

    def record_budget_reached(self, model: str, unit: str, spent: float, budget: float) -> None:
        """Count a period in which the judge budget was reached, and emit an event saying so."""
        self.budget_reached.add(1, {ATTR_REQUEST_MODEL: model_name(model)})
        now = time.time_ns()
        self._events.emit(
            _logs.LogRecord(
                timestamp=now,
                observed_timestamp=now,
                event_name=BUDGET_EVENT,
                attributes={
                    ATTR_REQUEST_MODEL: model_name(model),
                    "rag.judge.budget.unit": unit,
                    "rag.judge.budget.spent": spent,
                    "rag.judge.budget.limit": budget,
                },
            )
        )

    def record_pause(self, model: str, error_type: str | None) -> None:
        """Count a pause of ``model`` after a terminal error. One series per model (the one
        :meth:`initialise` creates at 0): the error type is in the worker's log line, not a
        label, so that ``increase()`` sees the first pause of a bad key at deploy time."""
        del error_type  # said in the log line; a label would start a new series at 1
        self.judge_paused.add(1, {ATTR_REQUEST_MODEL: model_name(model)})


_CUMULATIVE_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
_GATEWAY_SERIES = ("push_time_seconds", "push_failure_time_seconds")


def pushed_totals(
    gateway: str,
    job: str,
    grouping_key: dict[str, str],
    timeout_s: float,
    *,
    any_sample: bool = False,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The cumulative samples (counters and histograms) the Pushgateway holds for one group,
    keyed by sample name and labels (without the group's own labels); with ``any_sample``,
    every sample of the group. Empty when the group does not exist."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    group = {"job": job, **grouping_key}
    with urllib.request.urlopen(gateway.rstrip("/") + "/metrics", timeout=timeout_s) as reply:
        text = reply.read().decode("utf-8", "replace")
    totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in _GATEWAY_SERIES:
                continue
            if any(sample.labels.get(k) != v for k, v in group.items()):
                continue
            if not any_sample and (
                family.type not in ("counter", "histogram", "summary")
                or not sample.name.endswith(_CUMULATIVE_SUFFIXES)
            ):
                continue
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in group))
            totals[(sample.name, labels)] = sample.value
    return totals


class _RunningTotals:
    """A collector that reads ``registry`` and adds ``before`` to its cumulative samples."""

    def __init__(
        self, registry: Any, before: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    ) -> None:
        self._registry = registry
        self._before = before

    def collect(self) -> Any:
        from prometheus_client.metrics_core import Metric

        for family in self._registry.collect():
            if family.type not in ("counter", "histogram", "summary") or not self._before:
                yield family
                continue
            totals = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                value = sample.value
                if sample.name.endswith(_CUMULATIVE_SUFFIXES):
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    value += self._before.get(key, 0.0)
                totals.add_sample(
                    sample.name, sample.labels, value, sample.timestamp, sample.exemplar
                )
            yield totals


@dataclass
class TelemetrySetup:
    """Providers built by :func:`setup_telemetry`; call :meth:`shutdown` at exit."""

    meter_provider: Any
    logger_provider: Any
    prometheus_port: int | None = None
    pushgateway: str | None = None
    """The Prometheus Pushgateway :meth:`push` sends the metrics to."""

    def push(self, *, job: str, grouping_key: dict[str, str], timeout_s: float = 10.0) -> None:
        """Send every metric to the Pushgateway, replacing what it held for ``job`` and
        ``grouping_key``; raises on any failure.

        A push replaces the group, so counters and histograms are pushed as running totals:
        this run's counts added to what the group held before (read from the gateway first),
        the way a long-running process's counters grow. Prometheus then sums runs with
        ``increase()`` as it would for one process; a gateway restart is a counter reset, which
        ``increase()`` handles. Gauges (the queue) are pushed as they are now. Runs of one
        group must not overlap (give concurrent runs their own ``instance``)."""
        from prometheus_client import REGISTRY, CollectorRegistry, push_to_gateway

        if self.pushgateway is None:
            raise ValueError("no Pushgateway configured")
        before = pushed_totals(self.pushgateway, job, grouping_key, timeout_s)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_RunningTotals(REGISTRY, before))
        push_to_gateway(
            self.pushgateway,
            job=job,
            grouping_key=grouping_key,
            registry=registry,
            timeout=timeout_s,
        )

    def push_baseline(
        self, *, job: str, grouping_key: dict[str, str], timeout_s: float = 10.0
    ) -> bool:
        """Push the metrics as they are at the start of a run (every count 0) when the
        gateway holds nothing for this group yet, so that Prometheus scrapes a zero before the
        first run's totals and ``increase()`` counts that run too. True when it pushed; raises
        on failure like :meth:`push`."""
        if self.pushgateway is None:
            raise ValueError("no Pushgateway configured")
        if pushed_totals(self.pushgateway, job, grouping_key, timeout_s, any_sample=True):
            return False
        self.push(job=job, grouping_key=grouping_key, timeout_s=timeout_s)
        return True

    def shutdown(self) -> None:
        """Flush and stop every exporter."""
        for provider in (self.meter_provider, self.logger_provider):
            try:
                provider.shutdown()
            except Exception:  # exporters already failing must not block the exit
                logger.debug("telemetry shutdown failed", exc_info=True)


def setup_telemetry(
    *,
    prometheus_port: int | None = None,
    prometheus_host: str = "127.0.0.1",
    console: bool = False,
    otlp: bool | None = None,
    extra_metric_readers: Sequence[Any] = (),
    set_global: bool = True,
    pushgateway: str | None = None,
    otlp_exporters: Callable[[str], Any] | None = None,
) -> TelemetrySetup:
    """Build meter and logger providers for a stand-alone worker.

    ``otlp_exporters(signal)`` (``"metrics"``, ``"logs"``) returns the OTLP exporter the
    environment asks for, or ``None`` (the command line passes the one that reads the standard
    ``OTEL_*`` variables, HTTP or gRPC); it may raise ``ValueError`` for a configuration it
    cannot honour. ``otlp=True`` exports both over OTLP/HTTP whatever it says; ``False``
    never exports over OTLP.
    ``prometheus_port`` serves a scrape endpoint on ``prometheus_host`` (loopback by default;
    ``0`` picks a free port, reported back); a busy port raises ``OSError``. ``pushgateway``
    (a URL) prepares the same series for :meth:`TelemetrySetup.push` (batch runs).
    The resource honours ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``.
    """
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogRecordExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource

    defaults = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "recalltrace-worker"}
    resource = Resource.create(defaults)
    readers: list[Any] = list(extra_metric_readers)
    bound_port: int | None = None
    if prometheus_port is not None or pushgateway is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        # One reader serves both: it turns the instruments into the registry's series.
        readers.append(PrometheusMetricReader())
    if prometheus_port is not None:
        from prometheus_client import REGISTRY, start_http_server

        server, _thread = start_http_server(
            prometheus_port, addr=prometheus_host, registry=REGISTRY
        )
        bound_port = int(server.server_port)
    metric_exporter, log_exporter = _otlp_exporters(otlp, otlp_exporters)
    if metric_exporter is not None:
        readers.append(PeriodicExportingMetricReader(metric_exporter))
    if console:
        readers.append(
            PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=10_000)
        )
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    logger_provider = LoggerProvider(resource=resource)
    if log_exporter is not None:
        logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
    if console:
        logger_provider.add_log_record_processor(
            BatchLogRecordProcessor(ConsoleLogRecordExporter())
        )
    if set_global:
        metrics.set_meter_provider(meter_provider)
        _logs.set_logger_provider(logger_provider)
    return TelemetrySetup(meter_provider, logger_provider, bound_port, pushgateway)


def _otlp_exporters(
    otlp: bool | None, factory: Callable[[str], Any] | None
) -> tuple[Any | None, Any | None]:
    """The metric and log exporters: both over HTTP when ``otlp`` is true, none when it is
    false, else what ``factory`` returns for each."""
    if otlp:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(), OTLPLogExporter()
    if otlp is False or factory is None:
        return None, None
    return factory("metrics"), factory("logs")
