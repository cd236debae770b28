"""Scores posted to Arize Phoenix as span annotations, so its trace view shows them.

Each stored score becomes one annotation on the request's root span: the variant as its
name, the value as its score, :attr:`ScoreResult.label` as its label, the reason as its
explanation, ``LLM`` or ``CODE`` as the annotator kind. Posting happens on a thread of its
own and never holds up scoring. Phoenix's REST API is used with ``sync=true``, so a span
Phoenix does not have is answered with 404 instead of being dropped silently: such an
annotation waits (the span may still be on its way to Phoenix) and is retried until
``span_wait_s``. Every annotation not posted is counted with its reason; each reason is
logged once when first seen, and :meth:`PhoenixAnnotations.close` logs the exact counts.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from recalltrace.scorers._result import ScoreResult

logger = logging.getLogger(__name__)

#: The annotation identifier: a newer score of the same variant replaces the older one.
IDENTIFIER = "recalltrace"

# Reasons an annotation is not posted.
NO_SPAN = "the record has no OpenTelemetry span id"
SPAN_MISSING = "Phoenix does not have the request's span"
QUEUE_FULL = "too many annotations waiting (Phoenix slower than scoring)"
NOT_SENT_BY_EXIT = "Phoenix could not be reached before the worker stopped"


@dataclass
class _Pending:
    body: dict[str, Any]
    first_try: float = 0.0
    ready_at: float = 0.0
    waits: int = 0
    why: str = NOT_SENT_BY_EXIT


@dataclass
class AnnotationStats:
    """What a :class:`PhoenixAnnotations` did."""

    posted: int = 0
    not_posted: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        """One line: how many were posted, how many not and why."""
        line = f"Phoenix annotations: {self.posted} posted"
        missed = sum(self.not_posted.values())
        if missed:
            reasons = "; ".join(f"{n} {reason}" for reason, n in self.not_posted.most_common())
            line += f", {missed} not posted ({reasons})"
        return line


class PhoenixAnnotations:
    """Post scores to a Phoenix server (``endpoint``: its base URL, e.g.
    ``http://127.0.0.1:6006``) as span annotations.

    ``api_key`` is sent as a bearer token (Phoenix with authentication on). At most
    ``max_pending`` annotations wait in memory; more are counted, not queued.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        span_wait_s: float = 120.0,
        max_pending: int = 10_000,
        batch_size: int = 100,
    ) -> None:
        self.url = endpoint.rstrip("/") + "/v1/span_annotations?sync=true"
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.span_wait_s = span_wait_s
        self.max_pending = max_pending
        self.batch_size = batch_size
        self.stats = AnnotationStats()
        self._pending: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._deadline: float | None = None
        self._said: set[str] = set()
        self._backoff = 0.0
        self._last_error = ""
        self._thread = threading.Thread(target=self._run, name="recalltrace-phoenix", daemon=True)
        self._thread.start()

    # -- the worker's side --------------------------------------------------------------------

    def send(
        self,
        result: ScoreResult,
        *,
        record_id: str,
        app_name: str,
        otel_span_id: str | None,
    ) -> None:
        """Queue one score; never blocks, never raises."""
        if not otel_span_id:
            self._not_posted(NO_SPAN, 1)
            return
        metadata: dict[str, Any] = {
            "record_id": record_id,
            "app": app_name,
            "status": result.status,
            "version": result.version,
        }
        if result.model:
            metadata["model"] = result.model
        body = {
            "span_id": otel_span_id,
            "name": result.metric,
            "annotator_kind": "LLM" if result.model else "CODE",
            "identifier": IDENTIFIER,
            "result": {
                "score": result.value,
                "label": result.label,
                "explanation": result.reason,
            },
            "metadata": metadata,
        }
        with self._cond:
            if self._closing or len(self._pending) >= self.max_pending:
                self._not_posted(QUEUE_FULL, 1)
                return
            self._pending.append(_Pending(body))
            self._cond.notify()

    def close(self, timeout_s: float) -> AnnotationStats:
        """Post what waits, for at most ``timeout_s`` seconds; count the rest, log the
        summary once, and return the stats."""
        with self._cond:
            self._closing = True
            self._deadline = time.monotonic() + timeout_s
            self._cond.notify()
        self._thread.join(timeout_s + self.timeout_s + 1.0)
        with self._cond:
            left = list(self._pending)
            self._pending.clear()
            for pending in left:
                reason = pending.why
                if reason == NOT_SENT_BY_EXIT and self._last_error:
                    reason += f" ({self._last_error})"
                self.stats.not_posted[reason] += 1
        if self.stats.not_posted:
            logger.warning("%s", self.stats.summary())
        else:
            logger.info("%s", self.stats.summary())
        return self.stats

    # -- the posting thread -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if batch:
                try:
                    self._post_batch(batch)
                except Exception as exc:  # never let the thread die with annotations held
                    self._say(f"posting to Phoenix failed unexpectedly: {exc!r}")
                    self._not_posted(f"unexpected error: {type(exc).__name__}", len(batch))

    def _next_batch(self) -> list[_Pending] | None:
        """The annotations due now (waiting for the earliest one if none is); ``None`` when
        closing and nothing is left that can still be posted in time."""
        with self._cond:
            while True:
                now = time.monotonic()
                if self._closing and (not self._pending or now >= (self._deadline or now)):
                    return None
                due = [p for p in self._pending if p.ready_at <= now]
                if due:
                    batch = due[: self.batch_size]
                    chosen = {id(p) for p in batch}
                    self._pending = deque(p for p in self._pending if id(p) not in chosen)
                    return batch
                wake = min((p.ready_at for p in self._pending), default=now + 1.0)
                if self._closing and self._deadline is not None:
                    wake = min(wake, self._deadline)
                self._cond.wait(max(0.01, wake - now))

    def _post_batch(self, batch: list[_Pending]) -> None:
        status, text = self._post([p.body for p in batch])
        now = time.monotonic()
        if status == 200:
            with self._cond:
                self.stats.posted += len(batch)
            self._backoff = 0.0
            return
        if status == 404:
            if len(batch) > 1:
                # Phoenix refuses the whole batch when one span is missing: find which.
                for pending in batch:
                    self._post_batch([pending])
                return
            self._span_missing(batch[0], now)
            return
        if status is None or status >= 500 or status == 429:
            # Phoenix down, overloaded or restarting: keep them and try again later.
            self._backoff = min(max(self._backoff * 2, 1.0), 30.0)
            self._last_error = text
            self._say(f"Phoenix at {self.url} cannot take annotations now ({text}); retrying")
            with self._cond:
                for pending in batch:
                    pending.ready_at = now + self._backoff
                self._pending.extendleft(reversed(batch))
            return
        reason = f"refused by Phoenix (HTTP {status}: {text})"
        self._say(f"Phoenix at {self.url} {reason}")
        self._not_posted(f"refused by Phoenix (HTTP {status})", len(batch))

    def _span_missing(self, pending: _Pending, now: float) -> None:
        if not pending.first_try:
            pending.first_try = now
        if now - pending.first_try >= self.span_wait_s:
            self._not_posted(SPAN_MISSING, 1)
            return
        pending.waits += 1
        pending.why = SPAN_MISSING
        pending.ready_at = now + min(2.0 * pending.waits, 15.0)
        with self._cond:
            self._pending.append(pending)

    def _post(self, data: list[dict[str, Any]]) -> tuple[int | None, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self.url, data=json.dumps({"data": data}).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
                return int(response.status), "OK"
        except urllib.error.HTTPError as exc:
            detail = exc.read(300).decode("utf-8", "replace").strip().splitlines()
            return int(exc.code), detail[0] if detail else str(exc.reason)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            return None, f"{type(exc).__name__}: {reason}"

    def _not_posted(self, reason: str, count: int) -> None:
        with self._cond:
            self.stats.not_posted[reason] += count
        self._say(f"annotations not posted to Phoenix: {reason}")

    def _say(self, message: str) -> None:
        key = message.split(" (", 1)[0]
        if key not in self._said:
            self._said.add(key)
            logger.warning("%s", message)
