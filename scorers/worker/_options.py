"""How a worker runs: :class:`WorkerOptions`, and the parsers its flags and the ``recalltrace
worker`` command line share (one parser per kind of value, each raising ``ValueError`` with a
line that names the value and what was expected)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from recalltrace.scorers._judge import JudgeConfig
from recalltrace.scorers.budget import JudgeBudget
from recalltrace.scorers.catalog import metric_info


def positive_int(raw: str) -> int:
    """Parse a whole number of at least 1 (``ValueError`` naming the problem otherwise)."""
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"expected a whole number, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"expected a whole number of at least 1, got {raw!r}")
    return value


def positive_seconds(raw: str) -> float:
    """Parse a positive, finite number of seconds (``ValueError`` otherwise)."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {raw!r}") from None
    if not 0 < value < 1e9:  # also refuses nan and inf
        raise ValueError(f"expected a positive number of seconds, got {raw!r}")
    return value


def http_url(raw: str) -> str:
    """Parse an ``http://`` or ``https://`` URL with a host (``ValueError`` otherwise)."""
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL with a host, got {raw!r}")
    return raw.strip()


def positive_number(raw: str) -> float:
    """Parse a positive, finite number (``ValueError`` otherwise)."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"expected a number, got {raw!r}") from None
    if not 0 < value < math.inf:  # also refuses nan
        raise ValueError(f"expected a positive number, got {raw!r}")
    return value


def non_negative_seconds(raw: str) -> float:
    """Parse 0 or a positive, finite number of seconds (``ValueError`` otherwise)."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {raw!r}") from None
    if not 0 <= value < math.inf:  # also refuses nan
        raise ValueError(f"expected 0 or more seconds, got {raw!r}")
    return value


def port(raw: str) -> int:
    """Parse a TCP port number from 0 (any free port) to 65535 (``ValueError`` otherwise)."""
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"expected a port number, got {raw!r}") from None
    if not 0 <= value <= 65535:
        raise ValueError(f"expected a port from 0 to 65535, got {raw!r}")
    return value


def flag_option(
    default: Any,
    *,
    flag: str,
    parse: Callable[[str], Any],
    metavar: str,
    help: str,
) -> Any:
    """A :class:`WorkerOptions` field that is also a ``recalltrace worker`` flag: the command
    line is built from these (name, parser, default and help are written here only)."""
    return field(
        default=default,
        metadata={"flag": flag, "parse": parse, "metavar": metavar, "help": help},
    )


@dataclass
class WorkerOptions:
    """How a worker runs. Every field has a default fit for one laptop or one of many hosts.

    The fields made with :func:`flag_option` are the worker's command-line flags too.
    """

    database_url: str | None = None
    """Database URL; ``None`` means ``$RECALLTRACE_DATABASE_URL`` or the SQLite default."""
    metrics: Sequence[str] | None = None
    """Variants to score; default: all seven with a judge, the non-LLM ones without."""
    judge: JudgeConfig | None = None
    """The judge of the LLM variants (any LiteLLM model); ``None`` leaves them unscored."""
    scorer_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Extra options per variant key, passed to ``scorers.get`` (e.g. a threshold)."""
    concurrency: int = flag_option(
        16,
        flag="--concurrency",
        parse=positive_int,
        metavar="N",
        help="most jobs scored at once by this process",
    )
    """Most jobs being scored at once by this process."""
    batch_size: int = flag_option(
        32,
        flag="--batch-size",
        parse=positive_int,
        metavar="N",
        help="most jobs claimed in one statement",
    )
    """Most jobs claimed in one statement."""
    lease_s: float = flag_option(
        120.0,
        flag="--lease",
        parse=positive_seconds,
        metavar="S",
        help="seconds a claimed job is held; extended while it runs, given back if the worker dies",
    )
    """Lease of a claimed job; extended every third of it while the job runs."""
    poll_interval_s: float = flag_option(
        2.0,
        flag="--poll-interval",
        parse=positive_seconds,
        metavar="S",
        help="longest sleep when no job is due (Postgres wakes the worker earlier)",
    )
    """Longest sleep when no job is due (Postgres wakes earlier through LISTEN/NOTIFY)."""
    max_attempts: int = flag_option(
        3,
        flag="--max-attempts",
        parse=positive_int,
        metavar="N",
        help="attempts (invalid answers, errors) before a job is failed for good",
    )
    """Attempts (invalid answers, errors) before a job is failed for good."""
    retry_backoff_s: float = 5.0
    """First retry delay; doubled per attempt with jitter, capped at ``retry_backoff_max_s``."""
    retry_backoff_max_s: float = 600.0
    transient_max_age_s: float = 6 * 3600.0
    """How long a job may keep failing transiently before it is failed."""
    terminal_pause_s: float = 300.0
    """How long the variants of a judge stay paused after a terminal (configuration) error."""
    once_deadline_s: float = flag_option(
        900.0,
        flag="--deadline",
        parse=positive_seconds,
        metavar="S",
        help="with --once: after S seconds stop claiming, let running jobs finish within the "
        "grace period, give back the rest and exit, counting what is left unscored",
    )
    """A one-shot run's longest time before it stops claiming (plus ``grace_period_s``)."""
    grace_period_s: float = flag_option(
        30.0,
        flag="--grace-period",
        parse=positive_seconds,
        metavar="S",
        help="on SIGTERM/SIGINT, seconds running jobs may take to finish before the rest is "
        "given back",
    )
    """On SIGTERM/SIGINT: how long running jobs may finish before the rest is given back."""
    reference_ttl_s: float | None = flag_option(
        None,
        flag="--reference-ttl",
        parse=positive_seconds,
        metavar="S",
        help="skip jobs that waited longer than S seconds for a late reference (default: the "
        "deadline set when the trace was stored, one day unless configured)",
    )
    """Skip jobs that have waited longer than this for a late reference; ``None`` keeps the
    deadline each job was created with (the writer's ``reference_ttl``, one day by default)."""
    maintenance_interval_s: float = 5.0
    """How often expired leases and expired waits are swept and the queue gauges refreshed."""
    summaries_interval_s: float | None = flag_option(
        60.0,
        flag="--summaries-interval",
        parse=positive_seconds,
        metavar="S",
        help="every S seconds, store the history summaries of the hour and day buckets that "
        "have ended (Postgres), so no `scores summary` run computes them",
    )
    """How often the summaries of ended buckets are stored in the background (see
    ``History.warm_summaries``); ``None`` leaves them to the first query that reads them."""
    status_interval_s: float | None = flag_option(
        60.0,
        flag="--status-interval",
        parse=positive_seconds,
        metavar="S",
        help="a long-running worker logs one status line (scored, skipped, failed, queue, lag) "
        "every S seconds",
    )
    judge_budget: JudgeBudget | None = flag_option(  # noqa: RUF009 (a dataclass field)
        None,
        flag="--judge-budget",
        parse=JudgeBudget.parse,
        metavar="LIMIT",
        help="most the judge model may spend per period, across all workers on this database: "
        "50/day (US dollars, LiteLLM's prices), 200k tokens/day, 2.5/hour; when reached, LLM "
        "variants pause until the next period and non-LLM variants go on (default: no limit)",
    )
    """A cap on the judge model's spend per period, shared by every worker through the
    database (see :mod:`recalltrace.scorers.budget`)."""
    phoenix_url: str | None = flag_option(
        None,
        flag="--phoenix",
        parse=http_url,
        metavar="URL",
        help="post every score to this Arize Phoenix server (e.g. http://127.0.0.1:6006) as an "
        "annotation of the request's span; PHOENIX_API_KEY, when set, is sent as a bearer token "
        "(default: no annotations)",
    )
    """Post every stored score to this Phoenix server as a span annotation (see
    :class:`~recalltrace.scorers.phoenix.PhoenixAnnotations`)."""
    phoenix_api_key: str | None = None
    """Bearer token for Phoenix; ``None`` reads ``PHOENIX_API_KEY``."""
    listen: bool = True
    """Wake on Postgres LISTEN/NOTIFY when new jobs arrive."""
    worker_id: str | None = None
    """Name of this worker in leases; default ``host:pid:random``."""
    freeze_gc: bool = True
    """With a judge: freeze the objects alive after LiteLLM's import out of the garbage
    collector's generations (see :func:`scorers.load_judge_backend`). Turn off when the worker
    runs inside a process that must keep collecting reference cycles among objects it
    created before the worker started."""
    litellm_http: bool = True
    """With a judge: send OpenAI and OpenAI-compatible chat requests through LiteLLM's own
    HTTP handler instead of the OpenAI SDK, for about a third less CPU per judge call (see
    :func:`scorers.load_judge_backend`). Process-wide; a value of
    ``EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER`` already in the environment wins."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.lease_s <= 0 or self.poll_interval_s <= 0:
            raise ValueError("lease_s and poll_interval_s must be positive")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.metrics is not None:
            for key in self.metrics:
                metric_info(key)  # raises with the list of known keys
        if self.phoenix_url is not None:
            http_url(self.phoenix_url)
