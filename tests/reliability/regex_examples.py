"""Format-valid fake secrets generated from rule expressions.

The rule sets the scrubber ships describe each token format by a regular expression; an example
of each is generated from the expression itself (random characters where it allows a choice,
from a fixed seed), then checked to match. None is a real secret."""

from __future__ import annotations

import random
import re
import string
from re import _constants as C  # type: ignore[attr-defined]
from re import _parser as P  # type: ignore[attr-defined]
from typing import Any

_PRINTABLE = string.ascii_letters + string.digits + "_-+/=.~:"
_CATEGORIES = {
    C.CATEGORY_DIGIT: string.digits,
    C.CATEGORY_WORD: string.ascii_letters + string.digits + "_",
    C.CATEGORY_SPACE: " ",
    C.CATEGORY_NOT_DIGIT: string.ascii_letters,
    C.CATEGORY_NOT_WORD: " ",
    C.CATEGORY_NOT_SPACE: string.ascii_letters + string.digits,
}


def _class_chars(items: list[tuple[Any, Any]]) -> str:
    negate = False
    chars: list[str] = []
    for op, value in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            chars.append(chr(value))
        elif op is C.RANGE:
            low, high = value
            chars.extend(chr(c) for c in range(low, min(high, low + 200) + 1))
        elif op is C.CATEGORY:
            chars.extend(_CATEGORIES.get(value, string.ascii_letters))
    if negate:
        excluded = set(chars)
        return "".join(c for c in string.ascii_letters + string.digits if c not in excluded)
    # Printable ASCII only: a class like [\x60'"\s] offers a space or a quote.
    printable = [c for c in chars if c.isprintable() and c.isascii()]
    return "".join(printable or chars)


def _emit(parsed: Any, rng: random.Random, groups: dict[int, str]) -> str:
    out: list[str] = []
    for op, value in parsed:
        if op is C.LITERAL:
            out.append(chr(value))
        elif op is C.NOT_LITERAL:
            out.append(rng.choice([c for c in string.ascii_letters if ord(c) != value]))
        elif op is C.ANY:
            out.append(".")  # hosts and separators written with an unescaped dot
        elif op is C.IN:
            out.append(rng.choice(_class_chars(value)))
        elif op is C.BRANCH:
            out.append(_emit(rng.choice(value[1]), rng, groups))
        elif op is C.SUBPATTERN:
            group, _, _, sub = value
            text = _emit(sub, rng, groups)
            if group:
                groups[group] = text
            out.append(text)
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
            low, high, sub = value
            if high is C.MAXREPEAT:
                high = low + 12
            count = (
                low if low > 0 and op is C.MIN_REPEAT else low + rng.randint(0, min(6, high - low))
            )
            if low == 0 and op is C.MIN_REPEAT:
                count = 0
            out.extend(_emit(sub, rng, groups) for _ in range(count))
        elif op is C.GROUPREF:
            out.append(groups.get(value, ""))
        elif op in (C.AT, C.ASSERT, C.ASSERT_NOT):
            continue
        elif op is C.CATEGORY:
            out.append(rng.choice(_CATEGORIES.get(value, string.ascii_letters)))
    return "".join(out)


def example(pattern: re.Pattern[str], seed: int, tries: int = 40) -> re.Match[str] | None:
    """A match of ``pattern`` on a generated text, or ``None`` if none of ``tries`` texts
    generated from it matches (an expression whose lookarounds the generator cannot honour)."""
    parsed = P.parse(pattern.pattern, pattern.flags)
    for attempt in range(tries):
        rng = random.Random(seed * 1000 + attempt)
        text = _emit(parsed, rng, {})
        found = pattern.search(text)
        if found is not None:
            return found
    return None
