"""``recalltrace demo``: the options, the judge's reachability check and the exit code around
:func:`recalltrace.demo.run_demo`, which traces and scores the demo application."""

from __future__ import annotations

import argparse

from recalltrace.cli._args import EXIT_OK, CommandError, int_range
from recalltrace.cli.worker import EXIT_JUDGE_PAUSED, add_judge_arguments, judge_config_from_args


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo``."""
    demo = sub.add_parser(
        "demo", help="run a small traced RAG app on the embedded database and score it"
    )
    demo.add_argument(
        "--database-url",
        metavar="URL",
        default=None,
        help="database URL (default: sqlite:///./recalltrace.db; the demo does not follow "
        "$RECALLTRACE_DATABASE_URL)",
    )
    demo.add_argument(
        "--top-k",
        type=int_range(1, 100),
        default=3,
        help="articles retrieved per question (default 3)",
    )
    demo.add_argument(
        "--ui",
        action="store_true",
        help="then serve the web pages on the demo's database (`recalltrace ui`; Ctrl-C stops it)",
    )
    demo.add_argument(
        "--ui-port",
        type=int_range(0, 65535, what="a port"),
        default=8710,
        metavar="N",
        help="the port of --ui (default: 8710, on 127.0.0.1)",
    )
    add_judge_arguments(demo)
    demo.set_defaults(handler=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from recalltrace.demo import run_demo

    if args.ui:
        from recalltrace.cli.ui import require_ui_extra

        require_ui_extra()  # before the demo runs, not after
    judge = judge_config_from_args(args, concurrency=8)
    if judge is not None:
        # Before anything is traced: a judge that cannot be reached would only be found after
        # every call's retries, with the LLM variants scoring nothing.
        check_judge_reachable(judge.model, judge.api_base)
    outcome = run_demo(database_url=args.database_url, top_k=args.top_k, judge=judge)
    if outcome.stopped_by is not None:
        return 130 if outcome.stopped_by == "SIGINT" else 143
    if args.ui:
        from recalltrace.cli.ui import serve
        from recalltrace.storage.db import DEFAULT_DATABASE_URL, resolve_database_url

        # The demo's requests are minutes old: the last day, by the hour.
        url = resolve_database_url(args.database_url or DEFAULT_DATABASE_URL)
        serve(url, port=args.ui_port, first_page="/?since=1d&bucket=hour")
    if outcome.judge_paused:
        return EXIT_JUDGE_PAUSED
    return EXIT_OK


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
