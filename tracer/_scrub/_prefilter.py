"""The keyword prefilter: where in a text each rule may match, found in one pass.

One Aho-Corasick automaton (``pyahocorasick``) holds every rule file's keywords and the anchors
of the scrubber's own value patterns (``TRIGGERS``); a single pass over a text's lower-cased
form finds where each of them stands. A rule-file rule then runs only at its keywords' places
(``RuleFileSet.matches``), and a value pattern either only at the positions its matches must
start from (``starts``: an anchor, or the start of a run of digits, base64 or hex characters
found by a translation of the text's bytes) or only in the windows around its anchors
(``windows``), instead of over the whole text. A match that reaches the end of its window is
taken again from the whole text, so a window never cuts one short. Without ``pyahocorasick``
there is no prefilter and every rule whose gate passes runs over the whole text, as before.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Iterator
from typing import Any

from recalltrace.tracer._scrub import _patterns as P

# ``pyahocorasick``'s module, imported when the first scrubber is built (``import recalltrace``
# imports none of its dependencies); ``None`` when it is not installed.
ahocorasick: Any = False

Hits = dict[str, list[int]]
# How a value pattern is searched: "start" (matches start at an anchor, up to ``before``
# characters ahead of it) or "window" (matches lie within ``before`` characters before an
# anchor and ``after`` past it); the anchors: (lower-case needle, before) pairs, and a run of
# characters of a class (digits, base64, hex) at least so long.
_START, _WINDOW, _NAME_START = "start", "window", "name start"
_BEYOND = 1 << 62
_VENDOR = (
    ("k-", 1),
    ("akia", 0),
    ("asia", 0),
    ("aiza", 0),
    ("ghp_", 0),
    ("gho_", 0),
    ("ghu_", 0),
    ("ghs_", 0),
    ("ghr_", 0),
    ("github_pat_", 0),
    ("xox", 0),
    ("hf_", 0),
    ("k_live_", 1),
    ("k_test_", 1),
)
_SPLIT = (
    *_VENDOR,
    ("glpat-", 0),
    ("npm_", 0),
    ("dapi", 0),
    ("doo_v1_", 0),
    ("dop_v1_", 0),
    ("dor_v1_", 0),
    ("pypi-", 0),
    ("gocspx-", 0),
    ("ya29.", 0),
    ("whsec_", 0),
    ("glc_", 0),
    ("glsa_", 0),
    ("sg.", 0),
    ("age-secret-key-1", 0),
    ("eyj", 0),
)
_GITLAB = ("glpat-", "gldt-", "glptt-", "glrt-", "gloas-", "glcbt-", "glft-", "glimt-")
# Card, social security and phone numbers lie inside a cluster of digits and separators holding
# eight digits at least; an IBAN starts with two letters and two digits after anything but a
# letter, a digit, "_" or "-".
# The runs' length is the digits a match holds at least: 13 for a card, 9 for a social
# security number, 8 for a phone number.
_NUMBER = (_WINDOW, (), 0, ("number", 8))
TRIGGERS: tuple[tuple[tuple[str, str, int, int], tuple[Any, ...]], ...] = (
    (P.BEARER, (_START, (("bearer", 0),), 0, None)),
    (P.JWT, (_START, (("eyj", 0),), 0, None)),
    (P.VENDOR_KEY, (_START, _VENDOR, 0, None)),
    (P.SPLIT_KEY, (_START, _SPLIT, 0, None)),
    (
        P.GITLAB,
        (_START, tuple((w, 0) for w in (*_GITLAB, "glagent-", "glsoat-", "gr1348941")), 0, None),
    ),
    (P.AZURE_KEY, (_START, (("accountkey=", 0),), 0, None)),
    (P.AZURE_SAS, (_START, (("sig=", 1),), 0, None)),
    (P.AWS_SECRET, (_START, (), 0, ("base64", 40))),
    (
        P.SERVICE_KEY,
        (
            _START,
            (("sk", 0), ("sg.", 0), ("npm_", 0), ("key-", 0), ("shp", 0), ("xapp-", 0)),
            0,
            ("hex", 32),
        ),
    ),
    (
        P.ENV_SECRET,
        (
            # A match starts where the configuration name holding its word does (a run of
            # capitals, digits and "_"). Upper case only (the expression's own case): see
            # ``matches``.
            _NAME_START,
            tuple((w, 0) for w in ("TOKEN", "SECRET", "PASSW", "KEY", "CREDENTIAL", "AUTH")),
            0,
            None,
        ),
    ),
    (P.BASIC_AUTH, (_START, (("authorization", 0),), 0, None)),
    (P.KEY_ASSIGNMENT, (_START, tuple((w, 0) for w in P.ANCHORS["api_key"][0]), 0, None)),
    (P.PASSWORD, (_START, tuple((w, 0) for w in P.ANCHORS["password"][0]), 0, None)),
    (P.PASSWORD_PHRASE, (_START, tuple((w, 0) for w in P.PASSWORD_WORDS), 0, None)),
    (P.CURL_USER, (_START, (("-u", 2),), 0, None)),
    (P.JSON_PAIR, (_WINDOW, (('":', 70), ('" :', 70)), 256, None)),
    (P.URL_PASSWORD, (_WINDOW, (("://", 40),), 512, None)),
    (P.URL_PASSWORD_ENCODED, (_START, (("%3a%2f%2f", 0),), 0, None)),
    (P.EMAIL, (_WINDOW, (("@", 66),), 512, None)),
    (P.ENCODED, (_START, (), 0, ("base64", 24))),
    (P.CARD, (_WINDOW, (), 0, ("number", 13))),
    (P.IBAN, (_START, (), 0, ("iban", 0))),
    (P.SSN, (_WINDOW, (), 0, ("number", 9))),
    (P.PHONE, _NUMBER),
)

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# Each byte of a class becomes the class's letter, every other byte a space.
_CLASSES = {
    "digits": bytes(ord("0") if 48 <= i <= 57 else 32 for i in range(256)),
    "base64": bytes(
        ord("b") if chr(i).isascii() and (chr(i).isalnum() or chr(i) in "+/") else 32
        for i in range(256)
    ),
    "hex": bytes(ord("h") if 48 <= i <= 57 or 97 <= i <= 102 else 32 for i in range(256)),
}
_CLASS_LETTER = {"digits": b"0", "base64": b"b", "hex": b"h"}
# What must follow an anchor for its pattern to match there (checked before its window is
# searched): a URL's user and password up to "@"; an address's domain.
_FOLLOWS = {
    "://": re.compile(r"://[^/\s:@]*:[^@\s/]+@"),
    "@": re.compile(r"@(?:[\w\-]{1,63}\.)+(?:[^\W\d_]{2}|xn--)"),
}
_CLUSTER = bytes(ord("n") if chr(i) in "0123456789 -.()+" else ord("x") for i in range(256))
_IBAN_START = bytes(
    ord("0") if 48 <= i <= 57 else ord("a") if chr(i).isalpha() or chr(i) in "_-" else 32
    for i in range(256)
)


def available() -> bool:
    global ahocorasick
    if ahocorasick is False:
        try:
            ahocorasick = importlib.import_module("ahocorasick")
        except ImportError:
            ahocorasick = None
    return ahocorasick is not None


class Prefilter:
    """An automaton of every needle: ``scan`` gives, for each needle a lower-cased text holds,
    the positions where it starts (ascending)."""

    def __init__(self, needles: Iterable[str]) -> None:
        automaton = ahocorasick.Automaton()
        for needle in sorted(set(needles)):
            automaton.add_word(needle, (needle, len(needle) - 1))
        automaton.make_automaton()
        self._iter = automaton.iter

    def scan(self, lowered: str) -> Hits:
        hits: Hits = {}
        for end, (needle, back) in self._iter(lowered):
            found = hits.get(needle)
            if found is None:
                hits[needle] = [end - back]
            else:
                found.append(end - back)
        return hits


def needles() -> list[str]:
    return [needle.lower() for _, spec in TRIGGERS for needle, _ in spec[1]]


class Scan:
    """One text's prefilter results, each found when first asked for: its lower-cased form,
    the needles' positions, and the runs of each character class."""

    __slots__ = ("_clusters", "_encoded", "_hits", "_lowered", "_prefilter", "_runs", "view")

    def __init__(self, view: str, prefilter: Prefilter, lowered: str | None = None) -> None:
        self.view, self._prefilter, self._lowered = view, prefilter, lowered
        self._hits: Hits | None = None
        self._encoded: bytes | None = None
        self._runs: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self._clusters: list[tuple[int, int, int]] | None = None

    @property
    def lowered(self) -> str:
        if self._lowered is None:
            self._lowered = P.lower(self.view)
        return self._lowered

    @property
    def hits(self) -> Hits:
        if self._hits is None:
            self._hits = self._prefilter.scan(self.lowered)
        return self._hits

    def runs(self, kind: str, length: int) -> list[tuple[int, int]]:
        """The (start, end) of each run of ``kind`` characters at least ``length`` long."""
        known = self._runs.get((kind, length))
        if known is not None:
            return known
        if self._encoded is None:
            # One byte per character (any other than ASCII becomes "?"): offsets agree.
            self._encoded = self.view.encode("ascii", "replace")
        if kind == "number":
            out = [
                (start, end) for start, end, digits in self._number_clusters() if digits >= length
            ]
        elif kind == "iban":
            starts = self._encoded.translate(_IBAN_START)
            out = [(0, 0)] if starts.startswith(b"aa00") else []
            index = starts.find(b" aa00")
            while index >= 0:
                out.append((index + 1, index + 1))
                index = starts.find(b" aa00", index + 5)
        else:
            out = self._class_runs(kind, length)
        self._runs[(kind, length)] = out
        return out

    def _number_clusters(self) -> list[tuple[int, int, int]]:
        """The clusters of digits and separators (" -.()+") at least 9 long holding at least 8
        digits (a card, social security or phone number the scrubber redacts has as many), with
        the digits each holds."""
        if self._clusters is not None:
            return self._clusters
        assert self._encoded is not None
        clusters = self._encoded.translate(_CLUSTER)
        digits = self._encoded.translate(_CLASSES["digits"])
        out: list[tuple[int, int, int]] = []
        find = clusters.find
        start = find(b"nnnnnnnnn")
        while start >= 0:
            end = find(b"x", start)
            end = len(clusters) if end < 0 else end
            count = digits.count(b"0", start, end)
            if count >= 8:
                out.append((start, end, count))
            start = find(b"nnnnnnnnn", end)
        self._clusters = out
        return out

    def _class_runs(self, kind: str, length: int) -> list[tuple[int, int]]:
        assert self._encoded is not None
        classes = self._encoded.translate(_CLASSES[kind])
        needle = _CLASS_LETTER[kind] * length
        out: list[tuple[int, int]] = []
        find = classes.find
        index = find(needle)
        while index >= 0:
            end = find(b" ", index + length)
            if end < 0:
                end = len(classes)
            out.append((index, end))
            index = find(needle, end)
        return out


def matches(regex: re.Pattern[str], spec: tuple[Any, ...], scan: Scan) -> Iterator[re.Match[str]]:
    """The matches of ``regex`` (the whole text's ``finditer``'s, but found only where its
    anchors allow), in order of their start."""
    mode, anchors, after, run = spec
    view, hits = scan.view, scan.hits
    if anchors and anchors[0][0].isupper():  # needles of the expression's own case
        hits = {
            needle: [p for p in hits.get(needle.lower(), ()) if view.startswith(needle, p)]
            for needle, _ in anchors
        }
    runs = scan.runs(*run) if run is not None else []
    if mode is _NAME_START:
        # Back from each word to the start of the name it stands in.
        starts: set[int] = set()
        for needle, _ in anchors:
            for position in hits.get(needle, ()):
                start = position
                while start and view[start - 1] in _NAME_CHARS:
                    start -= 1
                starts.add(start)
        runs = [(start, start) for start in starts]
        mode, anchors = _START, ()
    if mode is _START:
        candidates: set[int] = {start for start, _ in runs}
        for needle, before in anchors:
            for position in hits.get(needle, ()):
                candidates.update(range(max(0, position - before), position + 1))
        last = -1
        for start in sorted(candidates):
            if start < last:
                continue
            match = regex.match(view, start)
            if match is not None:
                last = match.end()
                yield match
        return
    size = len(view)
    spans = list(runs)
    for needle, before in anchors:
        width = len(needle) + after
        follows = _FOLLOWS.get(needle)
        for p in hits.get(needle, ()):
            if follows is None or follows.match(view, p) is not None:
                spans.append((max(0, p - before), p + width))
    if not spans:
        return
    spans.sort()
    last = 0
    merged_start, merged_end = spans[0]
    for start, end in [*spans[1:], (_BEYOND, _BEYOND)]:  # the last one flushes the rest
        if start <= merged_end:
            merged_end = max(merged_end, end)
            continue
        window_end = min(size, merged_end)
        for match in regex.finditer(view, max(merged_start, last), window_end):
            if match.start() < last:
                continue
            if match.end() >= window_end and window_end < size:
                # It may go on past the window (or hold only because the window ends there).
                whole = regex.match(view, match.start())
                if whole is None:
                    continue
                match = whole
            last = match.end()
            yield match
        merged_start, merged_end = start, end
