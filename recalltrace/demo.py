"""``recalltrace demo``: a small traced RAG application, scored end to end.

A help desk for a fictional cloud-storage service: a corpus of short articles, questions with
reference answers and reference article ids, a BM25 retriever and an extractive answerer of its own.
Every request goes through ``@recalltrace.rag`` / ``@recalltrace.retrieval`` /
``@recalltrace.generation`` into the database; half of the references are known at call time, the
other half arrive later through ``recalltrace.set_reference``, as ground truth often does. Then one
worker pass scores the traces and the command prints what a user would look at first.

Runs on the embedded SQLite default with no server and no API key; the LLM variants score when
a judge model is given (``--judge-model``, any LiteLLM model string).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import Any

import recalltrace

APP_NAME = "lumen-help-desk"
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

    def __init__(self, articles: list[Article], *, top_k: int = 3) -> None:
        self.articles = articles
        self.top_k = top_k
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
                "metadata": {"title": a.title},
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
        return self.compose(question, self.search(question))


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``recalltrace demo``."""
    from recalltrace.cli._args import int_range
    from recalltrace.cli.worker import add_judge_arguments

    parser.add_argument(
        "--top-k",
        type=int_range(1, 100),
        default=3,
        help="articles retrieved per question (default 3)",
    )
    add_judge_arguments(parser)


def run_demo(args: argparse.Namespace) -> int:
    """Trace the demo app's requests, score them once, print the summary and the worst."""
    import logging
    from datetime import datetime, timedelta, timezone

    from rich.console import Console

    from recalltrace.cli.worker import judge_config_from_args
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
    url = resolve_database_url(args.database_url or DEFAULT_DATABASE_URL)
    exported = os.environ.get(DATABASE_URL_ENV)
    if args.database_url is None and exported:
        console.print(
            f"Not using {DATABASE_URL_ENV} ({redact_url(resolve_database_url(exported))}): the "
            "demo writes to its own file; pass --database-url to choose the database."
        )
    judge = judge_config_from_args(args, concurrency=8)
    if judge is not None:
        # Before anything is traced: a judge that cannot be reached would only be found after
        # every call's retries, with the LLM variants scoring nothing.
        check_judge_reachable(judge.model, judge.api_base)
    upgrade(url)
    console.print(f"[bold]recalltrace demo[/] on {redact_url(url)}")

    started = datetime.now(timezone.utc) - timedelta(seconds=1)
    data = load_dataset()
    app = HelpDesk([Article(d["id"], d["title"], d["text"]) for d in data["documents"]],
                   top_k=args.top_k)  # fmt: skip
    recalltrace.configure(database_url=url, service_name="recalltrace-demo", sample_rate=1.0)
    late: list[tuple[str, dict[str, Any]]] = []
    for number, item in enumerate(data["questions"]):
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
        f"Traced {len(data['questions'])} help-desk requests "
        f"({len(late)} with references attached afterwards)."
    )

    from recalltrace import _wiring
    from recalltrace.scorers.catalog import CATALOG
    from recalltrace.scorers.worker import Worker, WorkerOptions

    logging.getLogger("recalltrace.worker").setLevel(logging.ERROR)
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
    if worker.stopped_by is not None:
        # Interrupted: what was scored is stored, but the run did not finish.
        console.print(
            f"Interrupted by {worker.stopped_by}: scored {stats.scored} before stopping; "
            "the rest stays queued for `recalltrace worker`."
        )
        return 130 if worker.stopped_by == "SIGINT" else 143
    console.print(
        f"Scored {stats.scored} results ({stats.skipped} skipped, {stats.failed} failed)."
    )
    _print_results(console, url, started, worker.not_configured, list(CATALOG))
    if stats.paused:
        # The last line, and the exit code, say that the LLM variants did not score.
        from recalltrace.cli.worker import EXIT_JUDGE_PAUSED

        console.print(
            f"The judge was paused {stats.paused} time(s) (see the JUDGE PAUSED line above): "
            "the LLM variants are not scored; their jobs stay queued for `recalltrace worker`.",
            soft_wrap=True,
        )
        return EXIT_JUDGE_PAUSED
    return 0


JUDGE_PROBE_TIMEOUT_S = 5.0
"""How long the demo waits for a judge's server to accept a connection."""


def judge_endpoint(model: str, api_base: str | None) -> str | None:
    """The base URL the judge is called at: ``api_base``, or the default LiteLLM knows for a
    local provider (Ollama); ``None`` for hosted providers, whose address is not checked."""
    if api_base:
        return api_base
    if model.startswith("ollama"):
        return "http://localhost:11434"  # LiteLLM's default for its Ollama providers
    try:
        import litellm

        default = litellm.get_llm_provider(model)[3]
    except Exception:  # an unknown provider is LiteLLM's to refuse, on the first call
        default = None
    return str(default) if default else None


def check_judge_reachable(model: str, api_base: str | None) -> None:
    """Refuse, in one line, a judge whose server does not accept a connection."""
    import socket
    from urllib.parse import urlsplit

    from recalltrace.cli import CommandError

    endpoint = judge_endpoint(model, api_base)
    if endpoint is None:
        return
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise CommandError(f"--judge-api-base {endpoint!r} has no valid port") from None
    host = parts.hostname or "localhost"
    try:
        socket.create_connection((host, port), timeout=JUDGE_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CommandError(
            f"cannot reach the judge {model} at {endpoint} ({reason}): start it (for Ollama: "
            "`ollama serve`), set --judge-api-base, or run the demo without --judge-model"
        ) from None


def _print_results(
    console: Any, url: str, since: Any, not_configured: list[str], metrics: list[str]
) -> None:
    from rich.table import Table

    from recalltrace._wiring import history as open_history
    from recalltrace.scorers.catalog import CATALOG
    from recalltrace.storage.db import create_engine_from_url, redact_url

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
        hint = f"recalltrace trace show {worst[0].trace_id}"
        if not url.startswith("sqlite:///./"):
            hint += f" --database-url '{redact_url(url)}'"
        console.print(f"Look closer: {hint}")
    console.print("History: recalltrace scores summary --since 1d")
    if not_configured:
        console.print(
            "The LLM variants are not configured. Enable them with a judge model, e.g.\n"
            "  recalltrace demo --judge-model ollama/llama3.1\n"
            "(any LiteLLM model string; hosted models read their usual API key variables)"
        )
    engine.dispose()
