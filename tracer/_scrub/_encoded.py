"""Encoded and broken text, decoded or joined and searched by the whole scrubber (see
``_generic``, which runs it as the ``encoded_credential`` detector).

- ``\\u`` and ``\\x`` escape runs, HTML character references, percent-encoding and
  hexadecimal are decoded; the encoded run is redacted when something is found in it.
- Text inside a string literal (a JSON value's ``\\n``, ``\\"`` and ``\\u`` escapes) is decoded
  around its escapes and searched, the findings mapped back to the original offsets.
- A key with a known prefix broken into three to five pieces by spaces is joined, one piece at
  a time, until a rule's match runs from its first piece past the last break.
"""

from __future__ import annotations

import functools
import html
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, cast

from recalltrace.tracer._scrub import _patterns as P
from recalltrace.tracer._scrub._personal import Hits, Span
from recalltrace.tracer._scrub._personal import shape as _shape

# -- encoded text --------------------------------------------------------------------------------

_ESCAPES = re.compile(r"(?:\\u[0-9a-fA-F]{4}|\\x[0-9a-fA-F]{2}){8,}")
_ENTITIES = re.compile(r"(?:&#(?:[xX][0-9a-fA-F]{1,6}|\d{1,7});){8,}")
_PERCENT = re.compile(r"[\w.~+\-=&]*(?:%[0-9A-Fa-f]{2}[\w.~+\-=&]*){2,}")
_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_URL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.~+-=&")
_HEX_24 = b"h" * 24


@functools.lru_cache(maxsize=2)
def _default_scrubber(scrubber_type: Callable[[Any], Any]) -> Any:
    """A scrubber of ``scrubber_type`` (the engine's, handed to ``rules_for``) with the
    default options: decoded text is searched by every rule, without the application's
    callback."""
    from recalltrace.tracer._config import ScrubbingOptions

    return scrubber_type(ScrubbingOptions())


_DECODING = threading.local()
# The engine's scrubber class, as ``rules_for`` was handed it (importing it here would make the
# two modules import each other).
SCRUBBER_TYPE: list[Callable[[Any], Any]] = []


def _holds_secret(decoded: str) -> bool:
    """Whether the default scrubber finds something in ``decoded`` (encoded text is not
    decoded again inside it)."""
    if len(decoded) < 8 or not SCRUBBER_TYPE:
        return False
    scrubber = _default_scrubber(SCRUBBER_TYPE[0])
    _DECODING.busy = True
    try:
        return bool(scrubber.scrub_text(decoded, "", None) != decoded)
    finally:
        _DECODING.busy = False


def encoded(text: str, hits: Hits | None = None) -> Iterator[Span]:
    if getattr(_DECODING, "busy", False):
        return
    if "\\" in text:
        yield from _escaped(text)
    if hits is None or any(needle in hits for needle in SPLIT_NEEDLES):
        yield from _split_tokens(text, hits)
    if "\\u" in text or "\\x" in text:
        for match in _ESCAPES.finditer(text):
            decoded = match.group().encode("ascii").decode("unicode_escape", "replace")
            if _holds_secret(decoded):
                yield match.span()
    if "&#" in text:
        for match in _ENTITIES.finditer(text):
            if _holds_secret(html.unescape(match.group())):
                yield match.span()
    if "%" in text:
        done = -1
        for escape in _PERCENT_ESCAPE.finditer(text):
            if escape.start() < done:
                continue
            start = escape.start()
            while start > escape.start() - 256 and start and text[start - 1] in _URL_CHARS:
                start -= 1  # back to where the encoded run begins
            run = _PERCENT.match(text, start)
            if run is None:
                continue
            done = run.end()
            # A secret the other rules see as it stands (a SAS signature) is theirs.
            if _holds_secret(urllib.parse.unquote_plus(run.group())) and not _holds_secret(
                run.group()
            ):
                yield run.span()
    hexes = _shape(text).hex
    start = hexes.find(_HEX_24)
    while start >= 0:
        end = hexes.find(b" ", start)
        end = len(hexes) if end < 0 else end
        found, start = (start, end), hexes.find(_HEX_24, end)
        if (found[1] - found[0]) % 2:
            continue
        yield from _hex_decoded(text, *found)


def _hex_decoded(text: str, start: int, end: int) -> Iterator[Span]:
    """A run of hexadecimal digits that decodes to printable text holding a secret."""
    if text[start] not in "234567" or text[start + 2] not in "234567":
        return  # its first two bytes are not printable ASCII: a hash or an id
    try:
        decoded = bytes.fromhex(text[start:end]).decode("ascii")
    except ValueError:
        return
    if decoded.isprintable() and _holds_secret(decoded):
        yield start, end


def _secret_spans(text: str) -> list[Span]:
    """Where the default scrubber finds something in ``text`` (decoded or joined text, not
    decoded again inside it)."""
    if not SCRUBBER_TYPE:
        return []
    scrubber = _default_scrubber(SCRUBBER_TYPE[0])
    _DECODING.busy = True
    try:
        return cast("list[Span]", scrubber.spans(text))
    finally:
        _DECODING.busy = False


# String-literal escapes (JSON's, and C's \x): text written inside a JSON string or a quoted
# log field reads "password = \"…\"\n" where the scrubber's rules expect quotes and lines.
_STRING_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2})|([nrtbf\"'\\/]))")
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f"}


def unescaped(text: str) -> tuple[str, list[int]] | None:
    """``text`` with its string escapes decoded, and where each decoded character starts in
    ``text`` (one more entry: ``len(text)``); ``None`` when it holds none."""
    pieces: list[str] = []
    offsets: list[int] = []
    last = 0
    for match in _STRING_ESCAPE.finditer(text):
        start = match.start()
        pieces.append(text[last:start])
        offsets.extend(range(last, start))
        code, byte, simple = match.groups()
        if simple is not None:
            char = _SIMPLE_ESCAPES.get(simple, simple)
        else:
            point = int(code or byte, 16)
            char = "\ufffd" if 0xD800 <= point <= 0xDFFF else chr(point)
        pieces.append(char)
        offsets.append(start)
        last = match.end()
    if not offsets:
        return None
    pieces.append(text[last:])
    offsets.extend(range(last, len(text) + 1))
    return "".join(pieces), offsets


def _escaped(text: str) -> Iterator[Span]:
    """What the scrubber finds in ``text`` once its string escapes are decoded, in ``text``'s
    offsets: the text around the escapes (256 characters each side, out to white space) is
    decoded and searched, the rest was searched as it stands."""
    windows: list[list[int]] = []
    for match in _STRING_ESCAPE.finditer(text):
        start, end = max(0, match.start() - 256), min(len(text), match.end() + 256)
        if windows and start <= windows[-1][1]:
            windows[-1][1] = end
        else:
            windows.append([start, end])
    for start, end in windows:
        while start > 0 and not text[start - 1].isspace():
            start -= 1
        while end < len(text) and not text[end].isspace():
            end += 1
        decoded = unescaped(text[start:end])
        if decoded is None:
            continue
        plain, offsets = decoded
        for found_start, found_end in _secret_spans(plain):
            yield start + offsets[found_start], start + offsets[found_end]


_SPLIT_PIECES = re.compile(
    P.SPLIT_PREFIXES + r"[A-Za-z0-9_\-.]{2,}(?:[^\S\n]{1,2}[A-Za-z0-9_\-+/=.]{4,}){2,5}"
)


# Where a known prefix may stand (in lower case: needles of the keyword prefilter).
SPLIT_NEEDLES: tuple[str, ...] = (
    "k-",
    "k_",
    "gh",
    "github_pat_",
    "xox",
    "glpat-",
    "hf_",
    "akia",
    "asia",
    "aiza",
    "npm_",
)
SPLIT_NEEDLES += ("dapi", "_v1_", "pypi-", "gocspx-", "ya29.", "whsec_", "glc_", "glsa_", "sg.")
SPLIT_NEEDLES += ("age-secret-key-1", "eyj")
_SPLIT_BACK = 3  # a needle stands at most this far into its prefix ("dop_v1_")


def _split_matches(text: str, hits: Hits | None) -> Iterator[re.Match[str]]:
    if hits is None:
        yield from _SPLIT_PIECES.finditer(text)
        return
    starts = sorted({p for needle in SPLIT_NEEDLES for p in hits.get(needle, ())})
    done = -1
    for place in starts:
        for start in range(max(done, place - _SPLIT_BACK), place + 1):
            match = _SPLIT_PIECES.match(text, start)
            if match is not None:
                done = match.end()
                yield match
                break


def _split_tokens(text: str, hits: Hits | None = None) -> Iterator[Span]:
    """A key with a known prefix broken into three pieces or more by spaces (two pieces are the
    engine's ``split_key``): the pieces are joined, one more at a time, until a rule's match
    in the joined text runs from the first piece past the last break."""
    for match in _split_matches(text, hits):
        pieces = match.group().split()
        rest = "".join(pieces[1:])
        if not (any(c.isdigit() for c in rest) and any(c.isalpha() for c in rest)):
            continue
        for count in range(3, len(pieces) + 1):
            joined = "".join(pieces[:count])
            last_break = len(joined) - len(pieces[count - 1])
            if any(
                start < len(pieces[0]) and end > last_break for start, end in _secret_spans(joined)
            ):
                # The source span: from the first piece to the end of the last one joined.
                end = match.start()
                for piece in pieces[:count]:
                    end = text.index(piece, end) + len(piece)
                yield match.start(), end
                break
