"""``recalltrace demo``: a small traced RAG application, scored end to end.

A help desk for a fictional cloud-storage service: a corpus of short articles, questions with
reference answers and reference article ids, a BM25 retriever and an extractive answerer of its own.
Every request goes through ``@recalltrace.rag`` / ``@recalltrace.retrieval`` /
``@recalltrace.generation`` into the database; half of the references are known at call time, the
other half arrive later through ``recalltrace.set_reference``, as ground truth often does. Then one
worker pass scores the traces and the command prints what a user would look at first.

Two causes are planted for ``recalltrace scores diagnose`` to find: the mobile app's requests
(tag ``mobile-app``) still search a stale snapshot of the help center (index
``help-center-2025-03``, without the articles written since), and one article (``kb-031``) was
published but never indexed, so no request that needs it retrieves it.

Runs on the embedded SQLite default with no server and no API key; the LLM variants score when
a judge model is given (``--judge-model``, any LiteLLM model string).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import recalltrace

if TYPE_CHECKING:
    from recalltrace.scorers import JudgeConfig

APP_NAME = "lumen-help-desk"
ROUNDS = 6
"""Each question is asked this many times, alternately from the web and the mobile app."""
CURRENT_INDEX = "help-center-v7"
STALE_INDEX = "help-center-2025-03"
STALE_MISSING = frozenset(f"kb-{n:03d}" for n in range(13, 31))
"""Articles written after the stale snapshot was taken."""
NEVER_INDEXED = "kb-031"
"""Published, but in no index."""
DIAGNOSED_METRIC = "id_based_context_recall"
_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    {
        "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from",
        "get", "has", "have", "how", "i", "if", "in", "is", "it", "its", "my", "of", "on",
        "or", "so", "than", "that", "the", "their", "then", "there", "this", "to", "was",
        "what", "when", "where", "which", "who", "why", "will", "with", "you", "your",
        "after", "before", "much", "long", "many",
    }
)  # fmt: skip


def _tokens(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]


@dataclass(frozen=True)
class Article:
    """One help-desk article."""

    id: str
    title: str
    text: str


def load_dataset() -> dict[str, Any]:
    """The demo corpus and questions shipped with the package."""
    raw = resources.files("recalltrace").joinpath("demo_lumen_help_desk.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(raw)
    return data


class HelpDesk:
    """A small RAG application: BM25 retrieval over the corpus, then an extractive answer."""

    def __init__(
        self,
        articles: list[Article],
        *,
        top_k: int = 3,
        index: str = CURRENT_INDEX,
        channel: str = "web",
    ) -> None:
        self.articles = articles
        self.top_k = top_k
        self.index = index
        self.channel = channel
        self._docs = [_tokens(f"{a.title} {a.text}") for a in articles]
        self._avg_len = sum(len(d) for d in self._docs) / len(self._docs)
        frequency: Counter[str] = Counter()
        for doc in self._docs:
            frequency.update(set(doc))
        n = len(self._docs)
        self._idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in frequency.items()}
        self.last_trace_id: str | None = None

    @recalltrace.retrieval("bm25-search")
    def search(self, query: str) -> list[dict[str, Any]]:
        """The ``top_k`` articles with the best BM25 score for ``query``."""
        terms = _tokens(query)
        scored = []
        for article, doc in zip(self.articles, self._docs, strict=True):
            counts = Counter(doc)
            score = 0.0
            for term in terms:
                tf = counts.get(term, 0)
                if tf:
                    norm = tf + 1.2 * (0.25 + 0.75 * len(doc) / self._avg_len)
                    score += self._idf.get(term, 0.0) * tf * 2.2 / norm
            if score > 0:
                scored.append((score, article))
        scored.sort(key=lambda pair: -pair[0])
        return [
            {
                "id": a.id,
                "content": a.text,
                "score": round(s, 4),
                "metadata": {"title": a.title, "index": self.index},
            }
            for s, a in scored[: self.top_k]
        ]

    @recalltrace.generation("extractive-answer", model="extractive-demo")
    def compose(self, question: str, passages: list[dict[str, Any]]) -> str:
        """Answer with the two passage sentences that share the most words with the question."""
        wanted = set(_tokens(question))
        sentences = [
            s.strip()
            for p in passages
            for s in re.split(r"(?<=[.!?])\s+", p["content"])
            if s.strip()
        ]
        ranked = sorted(sentences, key=lambda s: -len(wanted & set(_tokens(s))))
        chosen = [s for s in ranked[:2] if wanted & set(_tokens(s))]
        if not chosen:
            return "I could not find this in the help center; a support agent will follow up."
        return " ".join(chosen)

    @recalltrace.rag(
        APP_NAME,
        input_param="question",
        reference_param="reference",
        reference_contexts_param="reference_contexts",
        reference_context_ids_param="reference_ids",
    )
    def answer(
        self,
        question: str,
        reference: str | None = None,
        reference_contexts: list[str] | None = None,
        reference_ids: list[str] | None = None,
    ) -> str:
        """Retrieve, then answer; the references, when given, are ground truth for scoring."""
        self.last_trace_id = recalltrace.current_trace_id()
        recalltrace.set_attributes(tags=self.channel)
        return self.compose(question, self.search(question))


@dataclass(frozen=True)
class DemoOutcome:
    """How a demo run ended (the command line turns it into an exit code)."""

    stopped_by: str | None
    """The signal that interrupted the scoring (``"SIGINT"``, ``"SIGTERM"``), or ``None``."""
    judge_paused: int
    """How many times the judge was paused: the LLM variants did not score when not 0."""


def run_demo(
    *, database_url: str | None = None, top_k: int = 3, judge: JudgeConfig | None = None
) -> DemoOutcome:
    """Trace the demo app's requests, score them once, print the summary and the worst.

    ``database_url`` defaults to ``sqlite:///./recalltrace.db`` (never the exported
    ``RECALLTRACE_DATABASE_URL``); without a ``judge`` only the non-LLM variants score.
    """
    import logging
    from datetime import datetime, timedelta, timezone

    from rich.console import Console

    from recalltrace.storage.db import (
        DATABASE_URL_ENV,
        DEFAULT_DATABASE_URL,
        redact_url,
        resolve_database_url,
    )
    from recalltrace.storage.migrate import upgrade

    console = Console()
    # The demo writes its own traces and scores whatever is due where it writes: it never
    # follows an exported RECALLTRACE_DATABASE_URL (a real deployment's database) unasked.
    url = resolve_database_url(database_url or DEFAULT_DATABASE_URL)
    exported = os.environ.get(DATABASE_URL_ENV)
    if database_url is None and exported:
        console.print(
            f"Not using {DATABASE_URL_ENV} ({redact_url(resolve_database_url(exported))}): the "
            "demo writes to its own file; pass --database-url to choose the database."
        )
    upgrade(url)
    console.print(f"[bold]recalltrace demo[/] on {redact_url(url)}")

    started = datetime.now(timezone.utc) - timedelta(seconds=1)
    data = load_dataset()
    articles = [Article(d["id"], d["title"], d["text"]) for d in data["documents"]]
    indexed = [a for a in articles if a.id != NEVER_INDEXED]
    web = HelpDesk(indexed, top_k=top_k)
    mobile = HelpDesk([a for a in indexed if a.id not in STALE_MISSING], top_k=top_k,
                      index=STALE_INDEX, channel="mobile-app")  # fmt: skip
    from recalltrace.scorers.catalog import NON_LLM_METRICS

    # Without a judge, no job of an LLM variant is created: nothing here could ever run it.
    recalltrace.configure(
        database_url=url,
        service_name="recalltrace-demo",
        sample_rate=1.0,
        metrics=None if judge is not None else NON_LLM_METRICS,
    )
    late: list[tuple[str, dict[str, Any]]] = []
    asked = [
        (item, mobile if (round_ + position) % 2 else web)
        for round_ in range(ROUNDS)
        for position, item in enumerate(data["questions"])
    ]
    for number, (item, app) in enumerate(asked):
        references = {
            "reference": item["reference"],
            "reference_contexts": item["reference_contexts"],
            "reference_ids": item["reference_ids"],
        }
        if number % 2 == 0:
            app.answer(item["question"], **references)
        else:
            # Ground truth that arrives after the request (a reviewer, a labelling queue).
            app.answer(item["question"])
            if app.last_trace_id:
                late.append((app.last_trace_id, references))
    recalltrace.flush(30)
    for trace_id, refs in late:
        recalltrace.set_reference(
            trace_id,
            reference=refs["reference"],
            reference_contexts=refs["reference_contexts"],
            reference_context_ids=refs["reference_ids"],
        )
    recalltrace.flush(30)
    console.print(
        f"Traced {len(asked)} help-desk requests ({len(late)} with references attached afterwards)."
    )

    from recalltrace import _wiring
    from recalltrace.scorers.catalog import CATALOG
    from recalltrace.scorers.worker import Worker, WorkerOptions

    # The worker's progress lines would bury the demo's own: quiet while it scores, then the
    # level is given back (run_demo is a library call too; it leaves logging as it found it).
    scorers_logger = logging.getLogger("recalltrace.scorers")
    level = scorers_logger.level
    scorers_logger.setLevel(logging.ERROR)
    repository = _wiring.open_repository(url)
    worker = Worker(
        WorkerOptions(database_url=url, judge=judge, listen=False, concurrency=8),
        repository=repository,
        warm=_wiring.history(repository.engine).warm_summaries,
    )
    import asyncio

    try:
        stats = asyncio.run(worker.run(once=True))
    finally:
        worker.close()
        scorers_logger.setLevel(level)
    if worker.stopped_by is not None:
        # Interrupted: what was scored is stored, but the run did not finish.
        console.print(
            f"Interrupted by {worker.stopped_by}: scored {stats.scored} before stopping; "
            "the rest stays queued for `recalltrace worker`."
        )
        return DemoOutcome(stopped_by=worker.stopped_by, judge_paused=stats.paused)
    console.print(
        f"Scored {stats.scored} results ({stats.skipped} skipped, {stats.failed} failed)."
    )
    _print_results(console, url, started, worker.not_configured, list(CATALOG))
    if stats.paused:
        # The last line, and the exit code, say that the LLM variants did not score.
        console.print(
            f"The judge was paused {stats.paused} time(s) (see the JUDGE PAUSED line above): "
            "the LLM variants are not scored; their jobs stay queued for `recalltrace worker`.",
            soft_wrap=True,
        )
    return DemoOutcome(stopped_by=None, judge_paused=stats.paused)


def _print_results(
    console: Any, url: str, since: Any, not_configured: list[str], metrics: list[str]
) -> None:
    from rich.table import Table

    from recalltrace._wiring import history as open_history
    from recalltrace.scorers.catalog import CATALOG
    from recalltrace.storage.db import create_engine_from_url

    engine = create_engine_from_url(url)
    history = open_history(engine)
    table = Table(title=f"Context recall of {APP_NAME}, this run")
    table.add_column("variant", no_wrap=True)
    table.add_column("judge", no_wrap=True)
    for column in ("scored", "mean", "skipped", "failed"):
        table.add_column(column, justify="right", no_wrap=True)
    for key in metrics:
        kind = "LLM" if CATALOG[key].uses_llm else "none"
        if key in not_configured:
            table.add_row(key, kind, "-", "not configured", "-", "-", style="dim")
            continue
        stats = history.window(metric=key, since=since, app=APP_NAME)
        mean = "-" if stats.mean is None else f"{stats.mean:.2f}"
        table.add_row(key, kind, str(stats.count), mean, str(stats.skipped), str(stats.failed))
    console.print(table)

    worst = history.worst(limit=4, since=since, app=APP_NAME)
    if worst:
        console.print("[bold]Lowest-scoring traces[/]")
        for row in worst:
            question = history.trace(row.trace_id).user_input or ""
            console.print(f"  [bold]{row.value:.2f}[/] {row.metric}, trace {row.trace_id[:12]}")
            console.print(f"       Q: [italic]{question}[/]")
            console.print(f"       {row.reason}", style="dim")
        hint = _on_database(f"recalltrace trace show {worst[0].trace_id}", url)
        console.print(f"Look closer: {hint}", soft_wrap=True)
    history_command = _on_database("recalltrace scores summary --since 1d", url)
    console.print(f"History: {history_command}", soft_wrap=True)
    if not_configured:
        console.print(
            "The LLM variants are not configured. Enable them with a judge model, e.g.\n"
            "  recalltrace demo --judge-model ollama/llama3.1\n"
            "(any LiteLLM model string; hosted models read their usual API key variables)"
        )
    _print_diagnosis(console, history, url, since)
    engine.dispose()


def _on_database(command: str, url: str) -> str:
    """``command`` as it runs on the demo's database from where the demo ran: with
    ``--database-url`` unless that is the default file and nothing else would be read (an
    exported ``RECALLTRACE_DATABASE_URL`` names another database, which the demo did not use)."""
    import shlex

    from recalltrace.storage.db import DATABASE_URL_ENV, redact_url

    if url.startswith("sqlite:///./") and not os.environ.get(DATABASE_URL_ENV):
        return command
    return f"{command} --database-url {shlex.quote(redact_url(url))}"


def _print_diagnosis(console: Any, history: Any, url: str, since: Any) -> None:
    """The last line: the ``scores diagnose`` command, and the planted causes it names."""

    found = history.diagnose(metric=DIAGNOSED_METRIC, since=since, app=APP_NAME)
    command = _on_database(
        f"recalltrace scores diagnose --metric {DIAGNOSED_METRIC} --since 1d", url
    )
    parts = [
        f"{s.attribute}={s.value} (recall {s.mean:.2f} against {s.rest_mean:.2f} elsewhere, "
        f"{s.count} requests)"
        for s in found.slices[:2]
    ]
    never = [m for m in found.missed or [] if m.retrieved == 0]
    if never:
        listed = ", ".join(m.reference for m in never[:4]) + (" ..." if len(never) > 4 else "")
        parts.append(f"{len(never)} documents needed and never retrieved ({listed})")
    names = " and ".join(parts) if parts else "nothing significant this time"
    console.print(f"Why: {command} names {names}.", soft_wrap=True)
