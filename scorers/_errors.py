"""Exceptions raised by scorers and the judge client."""

from __future__ import annotations


class ScorerInputError(TypeError):
    """An input has the wrong type or shape (a ``None`` inside a list, a non-string context).

    Raised before any work is done. Missing or empty inputs are not errors: they give a
    ``skipped`` result (or ``0.0`` where the specification says so).
    """


class JudgeError(Exception):
    """The judge could not be reached or refused the request."""

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        status_code: int | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.model = model
        """The judge model the failing request was for."""
        self.status_code = status_code
        """The HTTP status of the last attempt, when there was one."""
        self.error_type = error_type
        """The class name of the underlying error (e.g. ``RateLimitError``)."""


class TransientJudgeError(JudgeError):
    """Rate limits, timeouts, 408/409/5xx or connection errors outlasted the retry budget.

    The job may be tried again later; ``retry_after_s`` is the server's hint, when it gave one.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        status_code: int | None = None,
        error_type: str | None = None,
        retry_after_s: float | None = None,
        attempts: int = 0,
        unreachable: bool = False,
    ) -> None:
        super().__init__(message, model=model, status_code=status_code, error_type=error_type)
        self.retry_after_s = retry_after_s
        """Seconds the provider asked to wait before the next request, if it said."""
        self.attempts = attempts
        """HTTP attempts made before giving up."""
        self.unreachable = unreachable
        """No attempt got any answer: nothing listens there, or the host is unknown."""


_NO_ANSWER = frozenset(
    {"ConnectError", "APIConnectionError", "ConnectionRefusedError", "ConnectTimeout", "gaierror"}
)


def nothing_answered(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it came from) says no connection could be made at all.

    LiteLLM reports a refused connection as an ``InternalServerError`` with status 500; the
    httpx or OpenAI error underneath names what happened."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError) or type(current).__name__ in _NO_ANSWER:
            return True
        current = current.__cause__ or current.__context__
    return False


class TerminalJudgeError(JudgeError):
    """Retrying cannot help: bad credentials, no permission, unknown model, budget exceeded or a
    request the provider rejects because of the configuration. Fix the configuration first."""
