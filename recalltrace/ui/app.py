"""The Starlette application of ``recalltrace ui``: routes, templates, access and headers.

Every page is a GET with its state in the URL (shareable), rendered by a Jinja2 template with
autoescaping on, and names the command that prints the same figures. Database reads run in
Starlette's thread pool (the history API is synchronous). The application never writes: the
engine it is given is opened read-only by :func:`open_read_only`.
"""

from __future__ import annotations

import hmac
import shlex
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from recalltrace.ui import data
from recalltrace.ui.data import BadParameter, Filters

if TYPE_CHECKING:
    from sqlalchemy import Engine

HERE = Path(__file__).parent
TOKEN_COOKIE = "recalltrace_ui_token"
BUCKETS = ("hour", "day")
COMPARE_BY = ("release", "environment", "tag", "app", "service")

# No inline script or style anywhere: the chart's data travels in a JSON block that no
# browser runs, read by the shipped script.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Settings:
    """How the application was started."""

    database_shown: str | None
    """The ``--database-url`` the pages' commands repeat (password hidden), or ``None`` when
    the database came from ``$RECALLTRACE_DATABASE_URL`` or the default."""
    auth_token: str | None = None
    budget: Any | None = None
    """A ``JudgeBudget`` the jobs page measures the judge's spend against."""
    trace_link: str | None = None
    """A URL with ``{otel_trace_id}`` (and optionally ``{otel_span_id}``) linking a request
    to the user's tracing backend."""


def open_read_only(url: str) -> Engine:
    """An engine on ``url`` that cannot write: a SQLite file opened with ``mode=ro``; a
    Postgres session whose transactions are read-only (``default_transaction_read_only``),
    which a hot standby is anyway."""
    from sqlalchemy.engine import make_url

    from recalltrace.storage.db import create_engine_from_url

    create_engine_from_url(url).dispose()  # a URL it refuses is one line, said by it
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database
        if path and path != ":memory:" and not str(path).startswith("file:"):
            from urllib.parse import quote

            # A URI file name: "?", "#" and "%" in the path are percent-encoded.
            absolute = quote(str(Path(path).resolve()))
            return create_engine_from_url(f"sqlite:///file:{absolute}?mode=ro&uri=true")
        return create_engine_from_url(url)
    return create_engine_from_url(
        url,
        connect_args={"connect_timeout": 10, "options": "-c default_transaction_read_only=on"},
    )


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(HERE / "templates")),
        autoescape=select_autoescape(["html"], default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.filters["when"] = _when
    env.filters["ci"] = _ci
    env.filters["age"] = data.age_text
    env.filters["json_text"] = _json_text
    env.globals["evidence"] = data.evidence
    env.globals["record_columns"] = data.record_columns
    return env


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _ci(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"{interval[0]:.3f} to {interval[1]:.3f}"


def _json_text(value: Any) -> str:
    import json

    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


class Pages:
    """The page handlers, sharing the engine, the templates and the settings."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.env = _environment()

    # -- helpers ---------------------------------------------------------------------------
    def command(self, *words: str) -> str:
        """The command line printing what a page shows."""
        extra = [] if self.settings.database_shown is None else ["--database-url"]
        shown = [*words, *extra]
        text = " ".join(shlex.quote(w) for w in shown)
        if self.settings.database_shown is not None:
            text += " " + shlex.quote(self.settings.database_shown)
        return text

    def render(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> HTMLResponse:
        template = self.env.get_template(name)
        body = template.render(
            request=request,
            path=request.url.path,
            link=_link,
            **context,
        )
        return HTMLResponse(body, status_code=status)

    def problem(self, request: Request, message: str, status: int) -> HTMLResponse:
        return self.render(
            request, "problem.html", {"title": "Cannot show this page", "message": message}, status
        )

    # -- pages -----------------------------------------------------------------------------
    def overview(self, request: Request) -> Response:
        params = request.query_params
        filters = Filters.parse(params)
        bucket = params.get("bucket") or "day"
        if bucket not in BUCKETS:
            raise BadParameter(f"bucket must be hour or day, not {bucket!r}")
        found = data.overview(self.engine, filters, bucket)
        words = ["recalltrace", "scores", "summary", *filters.cli_options(), "--bucket", bucket]
        return self.render(
            request,
            "overview.html",
            {
                "title": "Recall over time",
                "filters": filters,
                "bucket": bucket,
                "view": found,
                "chart": found.chart_data(),
                "commands": [
                    self.command(*words),
                    self.command(
                        *["recalltrace", "scores", "plot", *filters.cli_options()],
                        "--bucket",
                        bucket,
                        "--out",
                        "recall.html",
                    ),
                    self.command("recalltrace", "jobs", "counts"),
                ],
            },
        )

    def traces(self, request: Request) -> Response:
        params = request.query_params
        filters = Filters.parse(params)
        low, high = data.score_range(params)
        sort = data.sort_order(params)
        page = data.page_number(params)
        found = data.traces(self.engine, filters, low=low, high=high, sort=sort, page=page)
        kept = filters.query()
        if low is not None:
            kept["min"] = params["min"]
        if high is not None:
            kept["max"] = params["max"]
        words = ["recalltrace", "scores", "worst", *filters.cli_options()]
        words += ["--limit", str(min(data.PAGE_SIZE * page, 10_000))]
        return self.render(
            request,
            "traces.html",
            {
                "title": "Requests",
                "filters": filters,
                "low": low,
                "high": high,
                "kept": kept,
                "found": found,
                "sorts": data.SORTS,
                "metrics": _metrics(),
                "attributes": data.FILTER_ATTRIBUTES,
                "commands": [self.command(*words)],
                "range_note": low is not None or high is not None,
            },
        )

    def trace(self, request: Request) -> Response:
        from recalltrace.storage.history import TraceNotFound

        given = request.path_params["trace_id"]
        trace_id = data.normalised_trace_id(given)
        if trace_id is None:
            return self.problem(
                request,
                f"{given!r} is not a trace id: give its 32 hex digits (dashes allowed)",
                404,
            )
        try:
            view = data.trace_view(self.engine, trace_id)
        except TraceNotFound as exc:
            return self.problem(request, str(exc), 404)
        link = None
        template = self.settings.trace_link
        if template and view.detail.otel_trace_id:
            link = template.replace("{otel_trace_id}", view.detail.otel_trace_id).replace(
                "{otel_span_id}", view.detail.otel_span_id or ""
            )
        return self.render(
            request,
            "trace.html",
            {
                "title": f"Request {trace_id[:12]}",
                "view": view,
                "d": view.detail,
                "backend_link": link,
                "commands": [self.command("recalltrace", "trace", "show", trace_id)],
            },
        )

    def compare(self, request: Request) -> Response:
        params = request.query_params
        filters = Filters.parse(params)
        by = params.get("by") or "release"
        if by not in COMPARE_BY:
            raise BadParameter(f"by must be one of {', '.join(COMPARE_BY)}, not {by!r}")
        baseline = params.get("baseline") or None
        candidate = params.get("candidate") or None
        if candidate is not None and baseline is None:
            raise BadParameter("candidate needs a baseline to be compared with")
        view = data.compare(self.engine, filters, by=by, baseline=baseline, candidate=candidate)
        if baseline is not None and baseline not in view.groups:
            known = ", ".join(str(g) for g in view.groups if g is not None) or "none"
            raise BadParameter(
                f"baseline {baseline!r}: no scored traces have {by}={baseline} in the window; "
                f"values: {known}"
            )
        commands = []
        shown = [metric for metric, _found in view.comparisons] or [filters.metric or "METRIC"]
        for metric in shown:
            words = ["recalltrace", "scores", "compare", "--metric", metric, "--by", by]
            words += [w for w in filters.cli_options() if w not in ("--metric", filters.metric)]
            if baseline is not None:
                words += ["--baseline", baseline]
            commands.append(self.command(*words))
        return self.render(
            request,
            "compare.html",
            {
                "title": "Compare",
                "filters": filters,
                "by": by,
                "choices": COMPARE_BY,
                "baseline": baseline,
                "candidate": candidate,
                "view": view,
                "commands": commands,
            },
        )

    def diagnose(self, request: Request) -> Response:
        from recalltrace.scorers.catalog import CATALOG

        params = request.query_params
        if not params.get("metric"):
            return self.render(
                request,
                "diagnose.html",
                {
                    "title": "Diagnose",
                    "found": None,
                    "metrics": list(CATALOG),
                    "since": params.get("since") or data.DEFAULT_SINCE,
                    "commands": [
                        self.command("recalltrace", "scores", "diagnose", "--metric", "METRIC")
                    ],
                },
            )
        filters = Filters.parse(params, metric_required=True)
        found = data.diagnose(self.engine, filters)
        window = filters.query()
        return self.render(
            request,
            "diagnose.html",
            {
                "title": f"Diagnose {filters.metric}",
                "found": found,
                "filters": filters,
                "metrics": list(CATALOG),
                "since": filters.since_text,
                "window": window,
                "commands": [
                    self.command("recalltrace", "scores", "diagnose", *filters.cli_options())
                ],
            },
        )

    def agreement(self, request: Request) -> Response:
        params = request.query_params
        filters = Filters.parse(params, default_since="90d")
        threshold = data.unit_number(params, "threshold", 0.5)
        reports = None
        if filters.metric is not None:
            reports = data.agreement(self.engine, filters, threshold)
        words = ["recalltrace", "scores", "agreement", *filters.cli_options(where=False)]
        if filters.metric is None:
            words += ["--metric", "METRIC"]
        return self.render(
            request,
            "agreement.html",
            {
                "title": "Judge against people's labels",
                "filters": filters,
                "threshold": threshold,
                "reports": reports,
                "metrics": _metrics(),
                "commands": [self.command(*words, "--threshold", f"{threshold:g}")],
            },
        )

    def jobs(self, request: Request) -> Response:
        params = request.query_params
        filters = Filters.parse(params)
        view = data.jobs(self.engine, filters, self.settings.budget)
        return self.render(
            request,
            "jobs.html",
            {
                "title": "Scoring jobs",
                "view": view,
                "filters": filters,
                "commands": [
                    self.command("recalltrace", "jobs", "list", *filters.cli_options()),
                    self.command(
                        "recalltrace",
                        "scores",
                        "cost",
                        *filters.cli_options(where=False),
                    ),
                ],
            },
        )


def _metrics() -> list[str]:
    from recalltrace.scorers.catalog import CATALOG

    return list(CATALOG)


def _link(path: str, params: Mapping[str, Any] | None = None, **more: Any) -> str:
    """``path`` with the query of ``params`` and ``more`` (``None`` values left out)."""
    merged = {**(params or {}), **more}
    query = {k: str(v) for k, v in merged.items() if v is not None and v != ""}
    return path + ("?" + urlencode(query) if query else "")


class Guard:
    """Security headers on every answer; with a token, every request must carry it (a bearer
    header, or the cookie that ``?token=`` sets once)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _value in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        if self.token is not None:
            request = Request(scope)
            given = request.query_params.get("token")
            if given is not None:
                if not _same(given, self.token):
                    await _refused(scope, receive, with_headers, "the token is not this UI's")
                    return
                # Set the cookie and drop the token from the address bar (and from the
                # history, logs and Referer headers that would keep it).
                rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
                # One leading slash: "//host/..." would send the browser to another site.
                path = "/" + request.url.path.lstrip("/")
                target = path + ("?" + urlencode(rest) if rest else "")
                response = RedirectResponse(target, status_code=303)
                response.set_cookie(
                    TOKEN_COOKIE, self.token, httponly=True, samesite="strict", path="/"
                )
                await response(scope, receive, with_headers)
                return
            header = request.headers.get("authorization", "")
            bearer = header[7:].strip() if header.lower().startswith("bearer ") else None
            cookie = request.cookies.get(TOKEN_COOKIE)
            if not any(_same(v, self.token) for v in (bearer, cookie) if v is not None):
                await _refused(
                    scope,
                    receive,
                    with_headers,
                    "this UI needs its access token: open it once with ?token=TOKEN, or send "
                    "the header Authorization: Bearer TOKEN",
                )
                return
        await self.app(scope, receive, with_headers)


def _same(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode(), token.encode())


async def _refused(scope: Scope, receive: Receive, send: Send, message: str) -> None:
    response = PlainTextResponse(
        f"recalltrace ui: {message}\n",
        status_code=401,
        headers={"www-authenticate": 'Bearer realm="recalltrace"'},
    )
    await response(scope, receive, send)


def create_app(engine: Engine, settings: Settings) -> ASGIApp:
    """The ASGI application serving the pages over ``engine`` (opened read-only by the
    caller, see :func:`open_read_only`)."""
    pages = Pages(engine, settings)

    def handled(
        page: Callable[[Request], Response],
    ) -> Callable[[Request], Response]:
        def run(request: Request) -> Response:
            try:
                return page(request)
            except BadParameter as exc:
                return pages.problem(request, str(exc), 400)
            except Exception as exc:
                from recalltrace._readings import database_problem

                message = database_problem(exc)
                if message is None:
                    raise
                return pages.problem(request, message, 503)

        return run

    routes = [
        Route("/", handled(pages.overview)),
        Route("/traces", handled(pages.traces)),
        Route("/traces/{trace_id}", handled(pages.trace)),
        Route("/compare", handled(pages.compare)),
        Route("/diagnose", handled(pages.diagnose)),
        Route("/jobs", handled(pages.jobs)),
        Route("/agreement", handled(pages.agreement)),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return pages.problem(request, f"no page at {request.url.path}", 404)

    app = Starlette(routes=routes, exception_handlers={404: not_found})
    return Guard(app, settings.auth_token)
