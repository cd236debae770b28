"""Time specifications of history queries: ``7d``, ``30m``, ``now`` or an ISO timestamp.

Pure functions on text; the command line and the Python API share them.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone


class TimeSpecError(ValueError):
    """A ``--since``/``--until`` value is neither a duration nor a timestamp."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_TIME_HELP = "use a duration like 30m, 1h, 7d, 2w or a timestamp like 2026-11-01T10:00:00Z"
MAX_DURATION = timedelta(days=365 * 1000)
"""Longest duration accepted: far beyond any history, short of the calendar's ends."""


def parse_duration(text: str) -> timedelta:
    """Parse ``30s``, ``30m``, ``1h``, ``7d`` or ``2w`` into a positive ``timedelta``."""
    match = _DURATION.match(text)
    if match is None:
        raise TimeSpecError(f"invalid duration {text!r}: use e.g. 30m, 1h, 7d or 2w")
    amount = float(match.group(1))
    if amount <= 0:
        raise TimeSpecError(f"invalid duration {text!r}: it must be positive")
    seconds = amount * _UNIT_SECONDS[match.group(2).lower()]
    if seconds > MAX_DURATION.total_seconds():
        raise TimeSpecError(
            f"invalid duration {text!r}: longer than {MAX_DURATION.days // 365} years "
            "(to read from the beginning, leave the option out)"
        )
    return timedelta(seconds=seconds)


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """Turn ``now``, a duration (``7d``: that long before now) or an ISO timestamp into UTC.

    Timestamps without an offset, and plain dates (midnight), are taken as UTC. Raises
    :class:`TimeSpecError` naming the bad value.
    """
    stripped = text.strip()
    if stripped.startswith("-") and _DURATION.match(stripped[1:]):
        raise TimeSpecError(
            f"invalid time {text!r}: a duration already counts back from now; "
            f"use {stripped[1:]} for {stripped[1:]} ago"
        )
    if stripped.lower() == "now":
        return (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    if _DURATION.match(stripped):
        reference = now or datetime.now(timezone.utc)
        duration = parse_duration(stripped)
        try:
            return reference.astimezone(timezone.utc) - duration
        except OverflowError:
            raise TimeSpecError(
                f"invalid time {text!r}: that long ago is before the calendar's year 1"
            ) from None
    iso = stripped[:-1] + "+00:00" if stripped[-1:] in ("Z", "z") else stripped
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", iso):
            day = date.fromisoformat(iso)
            parsed = datetime(day.year, day.month, day.day, tzinfo=timezone.utc)
        else:
            parsed = datetime.fromisoformat(iso)
    except ValueError:
        raise TimeSpecError(f"invalid time {text!r}: {_TIME_HELP}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    try:
        return parsed.astimezone(timezone.utc)
    except OverflowError:
        raise TimeSpecError(
            f"invalid time {text!r}: in UTC it falls outside the calendar (years 1 to 9999)"
        ) from None
