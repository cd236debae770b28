"""Generic detectors: secrets found by their context and their randomness rather than by a
vendor's format, personal identifiers checked by maintained validators, and encoded text
decoded before it is searched.

- **Credentials in context.** A value under a name that says what it is, in any syntax
  (``db_password: …``, ``"accessToken": "…"``, ``define('DB_PASSWORD', '…')``, ``'password' =>
  '…'``, ``<password>…</password>``, ``<add key="ApiSecret" value="…"/>``, ``X-Api-Key: …``,
  ``Signature=…``); command-line flags (``--token …``, ``--password=…``, ``-w '…'`` after
  ldapsearch, ``-p…`` after mysql, ``-a …`` after redis-cli); ``Authorization`` headers of any
  scheme (``SSWS``, ``Token``, ``Digest … response="…"``, SigV4 ``Signature=…``); cookie
  values; literal arguments of a call that look like credentials (``Client('AC…', '…')``); a
  random token right after "key", "token", "secret", "password" or "login"; and tokens with a
  short vendor-like prefix (``lsv2_pt_…``, ``r8_…``) whose body is random. A value counts as
  random by its Shannon entropy over its characters, with the thresholds of its alphabet: at
  least 3.0 bits a character for hexadecimal text (as detect-secrets' hex plugin), 3.5 for
  other text of 20 characters or more (gitleaks' generic rule), less for shorter values; it
  must also mix letters and digits. A value under a password-like name need not be random,
  only not a word of prose, code or a placeholder.
- **Personal identifiers** (``_personal``): national identity and tax numbers checked by
  python-stdnum, IBANs, dotted card numbers, phone numbers checked by phonenumbers.
- **Encoded and broken text** (``_encoded``): escapes, character references, percent-encoding,
  hexadecimal and string literals decoded, keys broken into pieces joined, each searched by the
  whole scrubber.

Each detector runs only when a cheap literal test on the text passes, and its expressions
start at a literal found by ``str.find`` or are linear. ``rules_for`` gives the engine the
detectors whose gates pass, as rules it runs like its own patterns.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from recalltrace.tracer._scrub import _patterns as P
from recalltrace.tracer._scrub._encoded import SCRUBBER_TYPE, SPLIT_NEEDLES, encoded
from recalltrace.tracer._scrub._personal import ID_CONTEXT_NEEDLES, Hits, Span, personal
from recalltrace.tracer._scrub._personal import lower as _lower
from recalltrace.tracer._scrub._personal import shape as _shape

# -- randomness ----------------------------------------------------------------------------------

_HEX = frozenset("0123456789abcdefABCDEF-")


def entropy(value: str) -> float:
    """Shannon entropy of ``value``, in bits a character."""
    size = len(value)
    return -sum(n / size * math.log2(n / size) for n in Counter(value).values())


def looks_random(value: str, minimum: int = 12) -> bool:
    """Whether ``value`` looks like a generated credential: long enough, letters and digits,
    and an entropy above its alphabet's threshold."""
    size = len(value)
    if size < minimum or size > 512:
        return False
    if not any(c.isdigit() for c in value) or not any(c.isalpha() for c in value):
        return False
    if set(value) <= _HEX:
        return size >= 16 and entropy(value) >= 3.0
    return entropy(value) >= min(3.5, 0.85 * math.log2(size))


def password_shaped(value: str) -> bool:
    """At least 8 characters of three of: lower case, upper case, digits, symbols."""
    if len(value) < 8:
        return False
    classes = (
        any(c.islower() for c in value)
        + any(c.isupper() for c in value)
        + any(c.isdigit() for c in value)
        + any(not c.isalnum() for c in value)
    )
    return classes >= 3


_WORD = r"(?:[A-Z]?[a-z]+|[A-Z]{1,6})"
_WORDY = re.compile(rf"{_WORD}(?:[-']{_WORD})*[.,;:!?)]*")


def prose(value: str) -> bool:
    """A word (or hyphenated words) of a sentence, not a value."""
    return _WORDY.fullmatch(value) is not None


# -- credentials in context ----------------------------------------------------------------------

# The words that name a credential. Strong ones (passwords, secrets) take any value that is not
# prose, code or a placeholder; the others take random values only.
_STRONG = ("pass", "pwd", "secret", "credential", "cookie")
_NAME_WORDS: tuple[str, ...] = ("pass", "pwd", "secret", "token", "key", "auth", "credential")
_NAME_WORDS += ("signature", "cookie", "session", "sid", "dsn")
_ASSIGN = re.compile(
    r"(?i:pass(?:word|wd|phrase|code)?|pwd|secret|token|api[_\-]?key|apikey|access[_\-]?key|key"
    r"|auth|credentials?|signature|cookie|session[_\-]?id|sid|dsn)"
    r"(?:[_\-.]?(?i:key|token|secret|base|value|string|hex|b64|id|sid)){0,2}(?:[_\-]?\d{1,4})?"
    r"(?:\\{0,7}[\"'`])?[^\S\n]{0,3}(?:=>|:=|\+?=|:(?!//)|\\{0,7}[\"'][^\S\n]*,)[^\S\n]{0,3}"
    r"(\\{0,7}[\"'`])?([^\s\"'`,;<>\\]{4,256})"
)
_XML_TAG = re.compile(r"<([A-Za-z_][\w:.\-]{0,40})>([^<\s]{4,256})</\1>")
_XML_ATTRIBUTE = re.compile(
    r"(?i:key|name)=\\*[\"']([^\"'<>\n\\]{1,64})\\*[\"'][^\S\n]+(?i:value)=\\*[\"']"
    r"([^\"'<>\n\\]{4,256})\\*[\"']"
)
_SECRET_NAME = re.compile(r"(?i)pass|pwd|secret|token|key|auth|credential|signature|cookie")


def _boundary(text: str, index: int) -> bool:
    """Whether a name word may start at ``index``: after a non-letter, a separator, or a
    change to upper case (``accessToken``)."""
    if index == 0:
        return True
    before = text[index - 1]
    if not before.isalnum():
        return True
    return before.islower() or before.isdigit() if text[index].isupper() else False


def _strong(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _STRONG)


def _value_ok(strong: bool, value: str, quoted: bool, operator: str) -> bool:
    if P.reference_or_placeholder(value) or value.endswith(("(", "[")):
        return False
    if "://" in value and "@" not in value:
        return False  # a URL (a redirect, an endpoint), not a credential
    if value.isdigit():
        return strong and len(value) >= 6
    if not strong and (" " in value or "(" in value):
        return False  # _RECENT_KEY = "-CAST(extract(epoch ...": code, not a key
    if strong:
        if len(value) < 6 and not password_shaped(value):
            return False
        return not prose(value) or (quoted and "=" in operator)
    return looks_random(value.split("=", 1)[-1] if value.count("=") == 1 else value)


def _quoted_end(text: str, start: int, quote: str) -> int:
    """The end of a quoted value opened before ``start``: its closing quote on the line."""
    end = text.find(quote, start)
    line = text.find("\n", start)
    if end < 0 or (0 <= line < end) or end - start > 256:
        return -1
    return end


_SEPARATOR = re.compile(r"[=:,>]")  # within reach of a name, or no assignment follows it


def places(lowered: str, word: str, hits: Hits | None) -> Iterable[int]:
    """Where ``word`` starts in ``lowered``, ascending: from the keyword prefilter's ``hits``
    (``word`` is one of its needles, ``NEEDLES``) or found by ``str.find``."""
    if hits is not None:
        return hits.get(word, ())
    found = []
    index = lowered.find(word)
    while index >= 0:
        found.append(index)
        index = lowered.find(word, index + 1)
    return found


def _assignments(text: str, lowered: str, hits: Hits | None) -> Iterator[Span]:
    seen: set[int] = set()
    for word in _NAME_WORDS:
        for index in places(lowered, word, hits):
            if (
                index not in seen
                and _boundary(text, index)
                and _SEPARATOR.search(text, index, index + 48) is not None
            ):
                seen.add(index)
                match = _ASSIGN.match(text, index)
                if match is not None:
                    span = _assignment_span(text, match)
                    if span is not None:
                        yield span
    if "</" in text:
        for match in _XML_TAG.finditer(text):
            if _SECRET_NAME.search(match.group(1)) and _value_ok(
                _strong(match.group(1)), match.group(2), True, "="
            ):
                yield match.span(2)
    if "value=" in lowered:
        for match in _XML_ATTRIBUTE.finditer(text):
            if _SECRET_NAME.search(match.group(1)) and _value_ok(
                _strong(match.group(1)), match.group(2), True, "="
            ):
                yield match.span(2)


_JWK_PRIVATE = re.compile(r'\\*"(?:d|p|q|dp|dq|qi|k)\\*"\s*:\s*\\*"([A-Za-z0-9_\-]{16,4096})')
_PUTTY = re.compile(
    r"Private-Lines:[^\S\n]*\d{1,3}[^\S\n]*(?:\r?\n|\\n)((?:[A-Za-z0-9+/=]{4,}(?:\r?\n|\\n)?)+)"
)


def _key_files(text: str) -> Iterator[Span]:
    """The private members of a JSON Web Key; the private lines of a PuTTY key file."""
    if '"kty' in text or 'kty\\"' in text:
        for match in _JWK_PRIVATE.finditer(text):
            yield match.span(1)
    if "Private-Lines" in text:
        for match in _PUTTY.finditer(text):
            yield match.span(1)


def _assignment_span(text: str, match: re.Match[str]) -> Span | None:
    start, end = match.span(2)
    quote = match.group(1)
    if quote:
        closing = _quoted_end(text, start, quote[-1])
        if closing < 0:
            return None
        while end < closing and text[closing - 1] == "\\":
            closing -= 1
        end = closing
    value = text[start:end]
    operator = text[match.start() : match.start(2)]
    name = operator.rstrip("\"'`\\ \t=:>+,")
    if not _value_ok(_strong(name), value, bool(quote), operator):
        return None
    return start, end


_FLAG = re.compile(
    r"--?(token|password|passwd|pass|api-?key|secret|auth-token|access-token|token-secret"
    r"|client-secret|key|auth|w|p|a)(?:=|[^\S\n]+)([\"']?)([^\s\"']{6,256})"
)
_WINDOWS_USER = re.compile(r"(?i:/user):[^\s\"']{1,128}[^\S\n]+([^\s\"'/][^\s\"']{5,255})")
_MYSQL = re.compile(r"-p([^\s\"'-][^\s\"']{3,255})")
# The tools whose one-letter flag takes a password: "-p" of the SQL clients and of a registry
# login (``docker login``, ``podman login``, ``helm registry login``).
_SHORT_FLAG_TOOL = {
    "w": ("ldap",),
    "a": ("redis-cli",),
    "p": ("mysql", "mariadb", "psql", " login"),
}


def _flags(text: str, lowered: str) -> Iterator[Span]:
    for match in _flag_matches(text):
        name, quote, value = match.group(1), match.group(2), match.group(3)
        start, end = match.span(3)
        if quote:
            closing = _quoted_end(text, start, quote)
            end = closing if closing > 0 else end
            value = text[start:end]
        if _flag_value_ok(text, lowered, match.start(), name, value):
            yield start, end
    if "/user:" in lowered:
        # Windows: ``net use Z: \\host\share /user:DOMAIN\name PASSWORD``.
        for match in _WINDOWS_USER.finditer(text):
            value = match.group(1)
            if not P.reference_or_placeholder(value) and password_shaped(value):
                yield match.span(1)
    if "mysql" in lowered or "mariadb" in lowered:
        index = text.find(" -p")
        while index >= 0:
            found = _MYSQL.match(text, index + 1)
            if found is not None and not P.reference_or_placeholder(found.group(1)):
                yield found.span(1)
            index = text.find(" -p", index + 3)


def _flag_matches(text: str) -> Iterator[re.Match[str]]:
    """``_FLAG`` tried where a hyphen follows white space (or starts the text)."""
    if text.startswith("-"):
        first = _FLAG.match(text)
        if first is not None:
            yield first
    for space in (" -", "\t-", "\n-"):
        index = text.find(space)
        while index >= 0:
            match = _FLAG.match(text, index + 1)
            if match is not None:
                yield match
            index = text.find(space, index + 2)


def _flag_value_ok(text: str, lowered: str, index: int, name: str, value: str) -> bool:
    if P.reference_or_placeholder(value) or value.startswith(("-", "/", "./", "~")):
        return False
    if len(name) > 1:
        return not prose(value) and (password_shaped(value) or looks_random(value, 8))
    line_start = lowered.rfind("\n", 0, index) + 1
    line = lowered[line_start:index]
    if not any(tool in line for tool in _SHORT_FLAG_TOOL[name]):
        return False
    return password_shaped(value) or looks_random(value, 8)


_AUTHORIZATION = re.compile(
    r"authorization\\?[\"']?[^\S\n]*[:=][^\S\n]*\\?[\"']?([A-Za-z][\w\-]{1,30})[^\S\n]+"
    r"([^\s\"',;]{6,512})"
)
# The parameters of a scheme that carry its secret: Digest's response, SigV4's and OAuth 1's
# signatures, Hawk's mac.
_PARAMETER = re.compile(r"(?i:response|signature|sig|mac)=\\?\"?([A-Za-z0-9+/=_\-]{16,512})")


# A scheme whose parameters follow it quoted (``Digest username="ops", …``, ``Hawk id="…"``).
_AUTH_PARAMETERS = re.compile(
    r"authorization\\?[\"']?[^\S\n]*[:=][^\S\n]*\\?[\"']?[a-z][\w\-]{1,30}[^\S\n]+"
    r"[a-z]+(?:[_\-][a-z]+)*=\\?[\"']"
)


def _authorization(text: str, lowered: str) -> Iterator[Span]:
    for match in _anchored(_AUTH_PARAMETERS, text, lowered, "authorization"):
        line_end = text.find("\n", match.start())
        stop = line_end if line_end >= 0 else len(text)
        for parameter in _PARAMETER.finditer(text, match.start(), stop):
            yield parameter.span(1)
    for match in _anchored(_AUTHORIZATION, text, lowered, "authorization"):
        value = match.group(2)
        if P.PARAMETER_NAME.match(text, match.start(2)):
            continue  # a parameter's name: its value is searched above
        if "=" in value.rstrip("="):
            # A scheme with parameters (Digest, AWS4-HMAC-SHA256): its signature is the secret.
            line_end = text.find("\n", match.start())
            stop = line_end if line_end >= 0 else len(text)
            for parameter in _PARAMETER.finditer(text, match.start(2), stop):
                yield parameter.span(1)
        elif not P.reference_or_placeholder(value):
            yield match.span(2)


# A cookie header's value: pieces joined by "; " (a sentence after "Cookie:" ends it).
_COOKIE = re.compile(
    r"cookie\\?[\"']?[^\S\n]*:[^\S\n]*([^\s\"]{3,1024}(?:;[^\S\n]*[^\s\";]{1,1024})*)"
)
_COOKIE_PAIR = re.compile(r"([^\s=;,]{1,64})=([^;\s,\"]{6,1024})")
_COOKIE_ATTRIBUTES = frozenset(["path", "domain", "expires", "max-age", "samesite", "version"])


def _anchored(
    regex: re.Pattern[str], text: str, lowered: str, word: str
) -> Iterator[re.Match[str]]:
    """The matches of ``regex`` (written in lower case) that start where ``word`` stands."""
    index = lowered.find(word)
    while index >= 0:
        match = regex.match(lowered, index)
        if match is not None:
            yield match
        index = lowered.find(word, index + 1)


def _cookies(text: str, lowered: str) -> Iterator[Span]:
    for match in _anchored(_COOKIE, text, lowered, "cookie"):
        for pair in _COOKIE_PAIR.finditer(text, match.start(1), match.end(1)):
            if pair.group(1).lower() in _COOKIE_ATTRIBUTES or prose(pair.group(2)):
                continue
            yield pair.span(2)


_CALLEE = re.compile(r"([A-Za-z_][\w.]{0,60})\($")
_LITERAL = re.compile(r"([\"'])([A-Za-z0-9_\-+/=.$:]{16,256})\\*\1")
_CALL_CONTEXT = re.compile(r"(?i)client|auth|key|token|secret|credential|login|connect|api|sdk")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


# A quote, then 16 characters a literal may hold: where a ``_LITERAL`` match may start.
_LITERAL_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_LITERAL_CHARS |= frozenset(b"_-+/=.$:")
_LITERAL_SHAPE = bytes(
    ord("q") if i in b"\"'" else ord("t") if i in _LITERAL_CHARS else 32 for i in range(256)
)
_LITERAL_START = b"q" + b"t" * 16


def _literals(text: str) -> Iterator[re.Match[str]]:
    """``_LITERAL.finditer(text)``, tried only where its shape's start stands."""
    shaped = text.encode("ascii", "replace").translate(_LITERAL_SHAPE)
    index = shaped.find(_LITERAL_START)
    while index >= 0:
        match = _LITERAL.match(text, index)
        if match is None:
            index = shaped.find(_LITERAL_START, index + 1)
        else:
            yield match
            index = shaped.find(_LITERAL_START, match.end())


def _call_arguments(text: str) -> Iterator[Span]:
    """Literal arguments of a call (the literal found first, then the call it is in)."""
    for literal in _literals(text):
        value = literal.group(2)
        if not looks_random(value, 16):
            continue
        line_start = text.rfind("\n", 0, literal.start()) + 1
        opening = text.rfind("(", line_start, literal.start())
        if opening < 0 or ")" in text[opening : literal.start()]:
            continue
        callee = _CALLEE.search(text, max(line_start, opening - 61), opening + 1)
        if callee is None:
            continue
        name = callee.group(1)
        context = _CALL_CONTEXT.search(name) is not None
        if not context and not (name.rsplit(".", 1)[-1][:1].isupper() and len(value) >= 20):
            continue
        if _UUID.fullmatch(value) and not context:
            continue
        yield literal.span(2)


_AFTER_WORD = re.compile(
    r"(?i:api[ _\-]?key|key|token|secret|password|passwd|passphrase|credentials?|login)s?"
    r"(?:[^\S\n]+(?i:is|was|set to|=|:))?[^\S\n]+[\"'`]?([A-Za-z0-9+/=_\-.$~]{16,256})"
)
_AFTER_WORDS = ("key", "token", "secret", "passw", "passphrase", "credential", "login")


def _reference_or_path(value: str) -> bool:
    """Code, a placeholder, or a path or file name (``exports/2026/part-0001.parquet``)."""
    if P.reference_or_placeholder(value):
        return True
    tail = value.rsplit("/", 1)[-1]
    return ("/" in value and "." in tail) or tail.rsplit(".", 1)[-1].lower() in P.FILE_SUFFIXES


_WORD_OR_PATH = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/")
# A setting of its own after the word (``KEY_ROTATION_DAYS=90``), not the word's value.
_SETTING = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+=")


def _after_words(text: str, lowered: str, hits: Hits | None) -> Iterator[Span]:
    seen: set[int] = set()
    for word in _AFTER_WORDS:
        for index in places(lowered, word, hits):
            start = index - 4 if word == "key" and lowered.startswith("api", index - 4) else index
            # Not a word of a path or an address (".../oauth2/token"), which is no label.
            if start not in seen and (start == 0 or text[start - 1] not in _WORD_OR_PATH):
                seen.add(start)
                match = _AFTER_WORD.match(text, start)
                if match is not None:
                    value = match.group(1).rstrip(".")
                    if (
                        looks_random(value, 16)
                        and not _reference_or_path(value)
                        and not _SETTING.match(value)
                    ):
                        yield match.start(1), match.start(1) + len(value)


_PREFIXED = re.compile(
    r"(?<![A-Za-z0-9_\-])([A-Za-z][A-Za-z0-9]{0,11}[_\-](?:[A-Za-z0-9]{1,10}[_\-]){0,2})"
    r"([A-Za-z0-9]{28,256}(?:[_\-.$][A-Za-z0-9]{4,256}){0,4})(?![A-Za-z0-9_\-])"
)
_NOT_PREFIXES = frozenset(["sha", "sha1", "sha256", "sha512", "md5", "commit", "trace", "span"])
_NOT_PREFIXES |= {"uuid", "build", "run", "req", "request", "id", "chunk", "doc", "part", "job"}


_RUN_28 = b"t" * 28


def _prefixed(text: str) -> Iterator[Span]:
    runs = _shape(text).alnum
    index = runs.find(_RUN_28)
    while index >= 0:
        end = runs.find(b" ", index)
        end = len(runs) if end < 0 else end
        if index and text[index - 1] in "_-":  # a body follows its prefix's separator
            yield from _prefixed_in(text, max(0, index - 36), end)
        index = runs.find(_RUN_28, end)


def _prefixed_in(text: str, start: int, end: int) -> Iterator[Span]:
    for match in _PREFIXED.finditer(text, start, min(len(text), end + 300)):
        prefix = re.split(r"[_\-]", match.group(1))[0].lower()
        body = match.group(2)
        if prefix in _NOT_PREFIXES:
            continue
        if looks_random(body, 28):
            yield match.span()


# -- the rules the engine runs -------------------------------------------------------------------


class _Hit:
    """What the engine reads of a match: its span."""

    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def span(self, group: int = 0) -> Span:
        return self._span


class Finder:
    """A detector in the shape of a compiled expression (``finditer``)."""

    def __init__(self, find: Callable[[str, Hits | None], Iterator[Span]]) -> None:
        self._find = find

    def finditer(self, text: str, hits: Hits | None = None) -> Iterator[_Hit]:
        """The spans found, overlapping ones merged (the engine keeps the first of two spans
        that overlap, and would leave the rest of the second). ``hits``: the keyword
        prefilter's scan of ``text`` lower-cased, holding every needle of ``NEEDLES``."""
        merged: list[list[int]] = []
        for start, end in sorted(set(self._find(text, hits))):
            if merged and start < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return iter([_Hit((start, end)) for start, end in merged])


def _credentials(text: str, hits: Hits | None = None) -> Iterator[Span]:
    lowered = _lower(text)
    if "=" in text or ":" in text or "," in text or "<" in text:
        yield from _assignments(text, lowered, hits)
    if "-" in text or "/user:" in lowered:
        yield from _flags(text, lowered)
    if "authorization" in hits if hits is not None else "uthorization" in lowered:
        yield from _authorization(text, lowered)
    if "cookie" in hits if hits is not None else "cookie" in lowered:
        yield from _cookies(text, lowered)
    if "(" in text and ('"' in text or "'" in text):
        yield from _call_arguments(text)
    yield from _after_words(text, lowered, hits)
    if "kty" in text or "Private-Lines" in text:
        yield from _key_files(text)
    if "_" in text or "-" in text:
        yield from _prefixed(text)


_Rule = tuple[str, "re.Pattern[str]", int]
_CREDENTIALS: _Rule = ("credential", cast("re.Pattern[str]", Finder(_credentials)), 0)
_PERSONAL: _Rule = ("personal_id", cast("re.Pattern[str]", Finder(personal)), 0)
_ENCODED: _Rule = ("encoded_credential", cast("re.Pattern[str]", Finder(encoded)), 0)
# The credential names, and the flags, words and key fields whose values the detectors read.
_GATE_WORDS = (*_NAME_WORDS, "login", "-w ", "-a ", "-p", "/user:", "kty", "private-lines")
# The prefilter's needles the generic detectors read (``hits``): every word they look for.
NEEDLES = (
    *_GATE_WORDS,
    *_NAME_WORDS,
    *_AFTER_WORDS,
    "authorization",
    "cookie",
    *ID_CONTEXT_NEEDLES,
    *SPLIT_NEEDLES,
)


def rules_for(
    text: str, scrubber_type: Callable[[Any], Any] | None = None, scan: Any = None
) -> list[_Rule]:
    """The generic detectors whose cheap gates pass on ``text``; encoded text is decoded and
    searched by a scrubber of ``scrubber_type`` with the default options (none: not searched).
    ``scan``: the keyword prefilter's ``Scan`` of ``text``, whose hits are read when needed."""
    if scrubber_type is not None and not SCRUBBER_TYPE:
        SCRUBBER_TYPE.append(scrubber_type)
    rules: list[_Rule] = []
    shape = _shape(text)
    # What the credential detectors take holds a digit or a symbol (a random value, a
    # password; "-" and "_" too: `--password dckr_pat_QAjR...` has no digit): text of plain
    # words is not searched further.
    if (b"0" in shape.classes or any(symbol in text for symbol in "#$%&*!@^~-_")) and (
        "_" in text
        or "('" in text
        or '("' in text
        or (
            any(word in scan.hits for word in _GATE_WORDS)
            if scan is not None
            else any(word in _lower(text) for word in _GATE_WORDS)
        )
    ):
        rules.append(_CREDENTIALS)
    if b"00" in shape.classes:
        rules.append(_PERSONAL)
    if (
        "\\" in text
        or (
            any(needle in scan.hits for needle in SPLIT_NEEDLES)
            if scan is not None
            else any(needle in _lower(text) for needle in SPLIT_NEEDLES)
        )
        or "&#" in text
        or "%" in text
        or b"h" * 24 in _shape(text).hex
    ):
        rules.append(_ENCODED)
    return rules
