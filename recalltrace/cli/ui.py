"""``recalltrace ui``: the read-only web pages over the score history (docs/ui.md)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from typing import Any

from recalltrace.cli._args import (
    EXIT_OK,
    CommandError,
    _add_database_option,
    check_sqlite_target,
    int_range,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8710
TOKEN_ENV = "RECALLTRACE_UI_TOKEN"
"""Where the access token may come from instead of ``--auth-token`` (which other users of the
machine can read in the process list)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ui``."""
    ui = sub.add_parser(
        "ui",
        help="read-only web pages: recall over time, requests, releases, diagnosis, jobs",
        description="Serve read-only web pages over the stored scores: recall over time with "
        "release markers, the requests behind it, one request with its evidence, releases "
        "compared, worse slices, and the queue. It binds 127.0.0.1 unless told otherwise; any "
        "other address needs an access token. It never writes to the database.",
    )
    _add_database_option(ui)
    ui.add_argument(
        "--host",
        default=DEFAULT_HOST,
        metavar="ADDRESS",
        help=f"address to listen on (default: {DEFAULT_HOST}; any other than a loopback "
        "address needs --auth-token)",
    )
    ui.add_argument(
        "--port",
        type=int_range(0, 65535, what="a port"),
        default=DEFAULT_PORT,
        metavar="N",
        help=f"port to listen on (default: {DEFAULT_PORT}; 0: any free port)",
    )
    ui.add_argument(
        "--auth-token",
        default=None,
        metavar="TOKEN",
        help=f"require this token on every request (default: ${TOKEN_ENV}): a header "
        "Authorization: Bearer TOKEN, or a cookie set by opening any page with ?token=TOKEN",
    )
    ui.add_argument(
        "--judge-budget",
        default=None,
        metavar="BUDGET",
        help="the workers' judge budget (e.g. 50/day), shown against the spend on the jobs page",
    )
    ui.add_argument(
        "--trace-link",
        default=None,
        metavar="URL",
        help="link each request to your tracing backend: a URL holding {otel_trace_id} "
        "(and optionally {otel_span_id}), e.g. http://jaeger:16686/trace/{otel_trace_id}",
    )
    ui.set_defaults(handler=_cmd_ui)


def require_ui_extra() -> None:
    """Refuse, in one line, to start without the web stack of the ``ui`` extra."""
    missing = []
    for module in ("starlette", "jinja2", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise CommandError(
            f"recalltrace ui needs the ui extra ({', '.join(missing)} missing): "
            "pip install 'recalltrace[ui]'"
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _listen(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise CommandError(f"--host {host!r} is not an address this machine has: {exc}") from None
    family, _kind, _proto, _name, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise CommandError(
            f"cannot listen on {host}:{port}: {reason}; choose another --port"
        ) from None
    sock.set_inheritable(True)
    return sock


def serve(
    database_url: str | None,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    auth_token: str | None = None,
    judge_budget: str | None = None,
    trace_link: str | None = None,
    first_page: str = "/",
) -> int:
    """Serve the pages over ``database_url`` until interrupted (Ctrl-C, SIGTERM)."""
    require_ui_extra()
    token = auth_token if auth_token is not None else os.environ.get(TOKEN_ENV) or None
    if token is not None and not token.strip():
        raise CommandError("--auth-token is empty: give a long random token")
    if not is_loopback(host) and token is None:
        raise CommandError(
            f"--host {host} lets other machines in: give --auth-token TOKEN (or ${TOKEN_ENV}), "
            f"or keep --host {DEFAULT_HOST} behind a reverse proxy that checks who comes in "
            "(docs/ui.md)"
        )
    budget = None
    if judge_budget is not None:
        from recalltrace.scorers.budget import JudgeBudget

        try:
            budget = JudgeBudget.parse(judge_budget)
        except ValueError as exc:
            raise CommandError(f"--judge-budget: {exc}") from None
    if trace_link is not None and (
        "{otel_trace_id}" not in trace_link or not trace_link.startswith(("http://", "https://"))
    ):
        raise CommandError(
            "--trace-link must be an http(s) URL holding {otel_trace_id}, e.g. "
            "http://jaeger:16686/trace/{otel_trace_id}"
        )
    from recalltrace.storage.db import redact_url, resolve_database_url

    url = resolve_database_url(database_url)
    check_sqlite_target(url, creating=False, into_existing=True)

    import uvicorn

    from recalltrace.ui.app import Settings, create_app, open_read_only

    engine = open_read_only(url)
    try:
        from recalltrace.ui.data import history_of

        history_of(engine).app_names(1)  # a database that cannot be read says so now
        settings = Settings(
            database_shown=None if database_url is None else redact_url(url),
            auth_token=token,
            budget=budget,
            trace_link=trace_link,
        )
        app: Any = create_app(engine, settings)
        sock = _listen(host, port)
        bound = sock.getsockname()[1]
        shown_host = f"[{host}]" if ":" in host else host
        print(
            f"recalltrace ui: http://{shown_host}:{bound}{first_page} on {redact_url(url)} "
            "(read-only; Ctrl-C stops it)",
            flush=True,
        )
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5
        )
        server = uvicorn.Server(config)
        try:
            # Ctrl-C: uvicorn finishes the requests under way, then raises the interrupt
            # again (the command exits 130, as after any Ctrl-C).
            server.run(sockets=[sock])
        finally:
            sock.close()
            print("recalltrace ui: stopped", file=sys.stderr, flush=True)
    finally:
        engine.dispose()
    return EXIT_OK


def _cmd_ui(args: argparse.Namespace) -> int:
    return serve(
        args.database_url,
        host=args.host,
        port=args.port,
        auth_token=args.auth_token,
        judge_budget=args.judge_budget,
        trace_link=args.trace_link,
    )
