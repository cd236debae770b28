"""Personal identifiers found in text, and the shapes of a text the scrubber's generic
detectors search first (see ``_generic``).

National identity and tax numbers of several countries are checked by python-stdnum after a
context word ("SSN", "CPF", "Steuer-ID", "passport", ...), looked for only before a number
shaped like one, or alone for the formats that cannot be mistaken (a CPF's dots and dash, an
Italian codice fiscale, a Chinese identity number); IBANs in any case and spacing (mod-97);
card numbers with dots (Luhn and an issuer's prefix); phone numbers checked by phonenumbers,
international ones alone, national ones in the formats of France and Japan or after a context
word. python-stdnum and phonenumbers are imported on first use.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Callable, Iterator

from recalltrace.tracer._scrub import _patterns as P

Span = tuple[int, int]
Hits = dict[str, list[int]]  # the keyword prefilter's: each needle's places, ascending

# -- shapes of a text ---------------------------------------------------------------------------
# Translations of a text's bytes (non-ASCII characters as "?", so offsets are kept), each a
# single pass in C: character classes (digits 0, capitals A, small letters a), runs of letters
# and digits, runs of hexadecimal digits. Searching them for a literal finds the few places a
# detector's expression is then run from.
_CLASSES = bytes(
    48 if 48 <= i <= 57 else 65 if 65 <= i <= 90 else 97 if 97 <= i <= 122 else i
    for i in range(256)
)
_ALNUM_RUNS = bytes(116 if chr(i).isalnum() and i < 128 else 32 for i in range(256))
_HEX_RUNS = bytes(104 if chr(i) in "0123456789abcdefABCDEF" else 32 for i in range(256))


class _Shape:
    __slots__ = ("_alnum", "_classes", "_hex", "_raw")

    def __init__(self, text: str) -> None:
        self._raw = text.encode("ascii", "replace")
        self._classes: bytes | None = None
        self._alnum: bytes | None = None
        self._hex: bytes | None = None

    @property
    def classes(self) -> bytes:
        if self._classes is None:
            self._classes = self._raw.translate(_CLASSES)
        return self._classes

    @property
    def alnum(self) -> bytes:
        if self._alnum is None:
            self._alnum = self._raw.translate(_ALNUM_RUNS)
        return self._alnum

    @property
    def hex(self) -> bytes:
        if self._hex is None:
            self._hex = self._raw.translate(_HEX_RUNS)
        return self._hex


@functools.lru_cache(maxsize=4)
def lower(text: str) -> str:
    """``text`` lower-cased, its length kept (remembered for the detectors that run in turn)."""
    return P.lower(text)


@functools.lru_cache(maxsize=4)
def shape(text: str) -> _Shape:
    """The shapes of ``text``, remembered for the few detectors that run on it in turn."""
    return _Shape(text)


# -- personal identifiers -----------------------------------------------------------------------

# Searched in lower-cased text, without word boundaries (they make the search ten times
# slower): a short word must stand alone (checked after).
_ID_CONTEXT = re.compile(
    r"ssn|social[ \-]security|s[ée]curit[ée] sociale|nir|insee|steuer|idnr|bsn|burgerservice"
    r"|cpf|dni|nie|nif|aadhaa?r|pesel|personnummer|codice fiscale|sin|social insurance|tfn"
    r"|tax file|national insurance|nino|身份证|passport|passeport|reisepass|pasaporte"
    r"|id number|id no|national id|tax id|cpr|hetu|henkilötunnus|fødselsnummer|fodselsnummer"
    r"|rijksregister"
)
# A beginning of every match of ``_ID_CONTEXT`` (needles of the keyword prefilter): where no
# needle starts before a number, no context word can be found there.
ID_CONTEXT_NEEDLES = (
    "ssn",
    "social",
    "sécurit",
    "securit",
    "nir",
    "insee",
    "steuer",
    "idnr",
    "bsn",
    "burgerservice",
    "cpf",
    "dni",
    "nie",
    "nif",
    "aadha",
    "pesel",
    "personnummer",
    "codice fiscale",
    "sin",
    "tfn",
    "tax file",
    "national insurance",
    "nino",
    "身份证",
    "passport",
    "passeport",
    "reisepass",
    "pasaporte",
    "id n",
    "national id",
    "tax id",
    "cpr",
    "hetu",
    "henkilötunnus",
    "fødselsnummer",
    "fodselsnummer",
    "rijksregister",
)
_ID_CANDIDATE = re.compile(r"(?<![\w])[0-9A-Z][0-9A-Z .\-/]{5,24}[0-9A-Z](?![\w])")


@functools.lru_cache(maxsize=1)
def _validators() -> tuple[Callable[[str], bool], ...]:
    """The checks of national identifiers (python-stdnum, imported on first use: importing
    recalltrace stays cheap)."""
    from stdnum.au import tfn
    from stdnum.be import nn
    from stdnum.br import cpf
    from stdnum.ca import sin
    from stdnum.cn import ric
    from stdnum.de import idnr
    from stdnum.dk import cpr
    from stdnum.es import dni, nie
    from stdnum.fi import hetu
    from stdnum.fr import nir
    from stdnum.in_ import aadhaar
    from stdnum.it import codicefiscale
    from stdnum.nl import bsn
    from stdnum.no import fodselsnummer
    from stdnum.pl import pesel
    from stdnum.se import personnummer
    from stdnum.us import ssn

    modules = (ssn, nir, idnr, bsn, cpf, dni, nie, codicefiscale, aadhaar, ric, personnummer)
    return tuple(
        module.is_valid for module in (*modules, pesel, sin, tfn, cpr, hetu, nn, fodselsnummer)
    )


_NINO = re.compile(r"[A-Z]{2}\d{6}[A-D]")  # only after "national insurance" or "NINO"
_PASSPORT = re.compile(r"[A-Z0-9]{6,9}")
_ID_ALONE = re.compile(
    r"(?<![\w.])(?:\d{3}\.\d{3}\.\d{3}-\d{2}|[A-Z]{6}\d{2}[A-EHLMPRST]\d{2}[A-Z]\d{3}[A-Z]"
    r"|\d{17}[\dX])(?![\w])"
)


def _valid_id(candidate: str, passport: bool) -> bool:
    compact = re.sub(r"[ .\-/]", "", candidate)
    if len(compact) < 6:
        return False
    if passport and _PASSPORT.fullmatch(compact) and sum(c.isdigit() for c in compact) >= 5:
        return True
    if _NINO.fullmatch(compact):
        return True
    return any(_valid(validator, compact) for validator in _validators())


def _valid(validator: Callable[[str], bool], compact: str) -> bool:
    try:
        return validator(compact)
    except Exception:  # a validator's own failure is not a match
        return False


# Numbers an identifier may be: three digits and more digits or separators; or two letters
# and three pairs of digits (a British National Insurance number).
_ID_SHAPES = (re.compile(b"000[0 .\\-/]{3,22}[0A]"), re.compile(b"AA ?00 ?00 ?00"))
_ID_ALONE_SHAPES = (b"000.000.000-00", b"0" * 17)
_CODICE_SHAPE = re.compile(b"AAAAAA00A00A000A")


def _identifiers(text: str, hits: Hits | None = None) -> Iterator[Span]:
    """Identifiers after a context word, in a text that holds a number shaped like one; and
    those whose format cannot be mistaken, anywhere. With the prefilter's ``hits``, the
    context words are looked for only before a number that has a needle of one before it."""
    shapes = shape(text)
    starts: list[int] | None = None
    if hits is not None:
        starts = sorted(p for needle in ID_CONTEXT_NEEDLES for p in hits.get(needle, ()))
    lowered = ""
    searched = 0  # context words are looked for before each number, each stretch once
    contexts: dict[int, re.Match[str]] = {}
    done: set[int] = set()
    numbers = (
        match.start() for pattern in _ID_SHAPES for match in pattern.finditer(shapes.classes)
    )
    for number in sorted(numbers):
        lowered = lowered or lower(text)
        window = max(0, number - 60, searched - 30)
        if starts is not None and bisect.bisect_left(starts, window) == bisect.bisect_left(
            starts, number
        ):
            contexts_before: Iterator[re.Match[str]] = iter(())  # no needle starts there
        else:
            contexts_before = _ID_CONTEXT.finditer(lowered, window, number)
        for context in contexts_before:
            start, end = context.span()
            if end - start <= 5 and not _short_context(text, start, end):
                continue  # "sin" in "using" or "np.sin(", "nie" in "nieuw"
            contexts[start] = context
        searched = number
        for start, context in list(contexts.items()):
            if number - context.end() > 48:
                del contexts[start]  # too far behind this number, and so every later one
            elif start not in done and number >= context.end():
                done.add(start)
                yield from _identifier_after(text, context)
    if any(needle in shapes.classes for needle in _ID_ALONE_SHAPES) or _CODICE_SHAPE.search(
        shapes.classes
    ):
        for match in _ID_ALONE.finditer(text):
            if _valid_id(match.group(), False):
                yield match.span()


_LABEL_AFTER = re.compile(r"[^\S\n]*(?:[:#=]|no\b|nr\b|number\b)", re.IGNORECASE)


def _short_context(text: str, start: int, end: int) -> bool:
    """Whether a short context word ("SSN", "sin") stands as a label: a word of its own,
    written in capitals or followed by ":", "#", "=", "no" or "number"."""
    if (
        text[start - 1 : start].isalnum()
        or text[start - 1 : start] == "."
        or (text[end : end + 1].isalpha())
    ):
        return False
    return text[start:end].isupper() or _LABEL_AFTER.match(text, end) is not None


def _identifier_after(text: str, context: re.Match[str]) -> Iterator[Span]:
    """The first valid identifier within 48 characters after a context word, on its line."""
    passport = "pas" in context.group()
    stop = text.find("\n", context.end())
    stop = min(stop if stop >= 0 else len(text), context.end() + 48)
    for candidate in _ID_CANDIDATE.finditer(text, context.end(), stop):
        start, end = candidate.span()
        # A label may stand between the context word and the number ("Steuer-ID 8609...",
        # "SSN no 123-..."): its leading pieces are dropped one by one too.
        for _ in range(3):
            span = _trimmed_id(text, start, end, passport)
            if span is not None:
                yield span
                return
            cut = min(
                (i for i in (text.find(" ", start, end), text.find("-", start, end)) if i > 0),
                default=-1,
            )
            if cut < 0 or not text[start:cut].isalpha():
                break
            start = cut + 1


def _trimmed_id(text: str, start: int, end: int, passport: bool) -> Span | None:
    """The longest valid identifier at ``start``, dropping trailing pieces one by one."""
    for _ in range(4):
        if _valid_id(text[start:end], passport):
            return start, end
        cut = max(text.rfind(" ", start, end), text.rfind("-", start, end))
        if cut <= start:
            return None
        end = cut
    return None


_CARD_SEPARATED = re.compile(r"(?<![\w.])\d{4}([.])\d{4}\1\d{4}\1\d{1,7}(?![\w]|\.\d)")
_CARD_PREFIX = re.compile(r"4|5[1-5]|2[2-7]|3[47]|3[0689]|6(?:011|4[4-9]|5|2)|35|5[06-9]|6")


def card_issuer_ok(digits: str) -> bool:
    """Whether ``digits`` start with a card issuer's prefix for their length (a 13-digit
    millisecond timestamp begins with 1 and is no card)."""
    return 13 <= len(digits) <= 19 and _CARD_PREFIX.match(digits) is not None


def _cards(text: str) -> Iterator[Span]:
    if b"0000.0000.0000.0" not in shape(text).classes:
        return
    for match in _CARD_SEPARATED.finditer(text):
        digits = match.group().replace(".", "")
        if card_issuer_ok(digits) and P.luhn_ok(digits):
            yield match.span()


_IBAN = re.compile(
    r"(?i)(?<![\w])[a-z]{2}\d{2}(?:[ ]?[a-z0-9]{4}){2,7}(?:[ ]?[a-z0-9]{1,4})?(?!\w)"
)


_IBAN_SHAPES = (re.compile(b"AA00(?: ?[0Aa]{4}){2}"), re.compile(b"aa00(?: ?[0Aa]{4}){2}"))


def _ibans(text: str) -> Iterator[Span]:
    classes = shape(text).classes
    for candidate in (found for pattern in _IBAN_SHAPES for found in pattern.finditer(classes)):
        match = _IBAN.match(text, candidate.start())
        if match is not None and P.iban_ok(match.group()):
            yield match.span()


_PHONE_INTERNATIONAL = re.compile(r"\+\d[\d \-.()]{6,22}\d(?!\w)")
_PHONE_NATIONAL = re.compile(r"0\d[\d \-.()]{6,16}\d(?![\w\-]|\.\d)")
_NOT_BEFORE_PHONE = frozenset("+-.:/_")
_PHONE_FORMATS = re.compile(r"0[1-9](?:([ .])\d{2})(?:\1\d{2}){3}|0\d{1,4}-\d{1,4}-\d{4}")
_PHONE_CONTEXT = re.compile(
    r"(?i)phone|\btel\b|tél|mobile|\bcell|\bcall\b|\bhandy|telefon|téléphone|portable|móvil"
    r"|celular|電話|携帯|\bfax\b|whatsapp|\bsms\b|\bappel|\bring\b|contact|numéro"
)
_REGIONS = ("FR", "JP", "GB", "DE", "AU", "IN", "BR", "ES", "IT", "NL", "US", "CA", "CH", "BE")


def _phone_valid(number: str, region: str | None) -> bool:
    import phonenumbers  # on first use: importing recalltrace stays cheap

    try:
        return bool(phonenumbers.is_valid_number(phonenumbers.parse(number, region)))
    except phonenumbers.NumberParseException:
        return False


def _phones(text: str) -> Iterator[Span]:
    if "+" in text:
        for match in _PHONE_INTERNATIONAL.finditer(text):
            before = text[match.start() - 1 : match.start()]
            if before and (before.isalnum() or before in "+_"):
                continue
            number = match.group().rstrip(".-( ")
            for _ in range(3):
                if _phone_valid(number, None):
                    yield match.start(), match.start() + len(number)
                    break
                cut = max(number.rfind(" "), number.rfind("-"))
                if cut < 5:
                    break
                number = number[:cut]
    for match in _PHONE_NATIONAL.finditer(text):
        number = match.group()
        before = text[match.start() - 1 : match.start()]
        if before and (before.isalnum() or before in _NOT_BEFORE_PHONE):
            continue
        if sum(c.isdigit() for c in number) < 9:
            continue  # 06.12.2026 is a date
        if _PHONE_FORMATS.fullmatch(number) is None:
            line_start = text.rfind("\n", 0, match.start()) + 1
            before = text[max(line_start, match.start() - 40) : match.start()]
            if _PHONE_CONTEXT.search(before) is None:
                continue
        if any(_phone_valid(number, region) for region in _REGIONS):
            yield match.span()


def personal(text: str, hits: Hits | None = None) -> Iterator[Span]:
    """The personal identifiers in ``text`` (``hits``: see ``_identifiers``)."""
    yield from _identifiers(text, hits)
    if "." in text:
        yield from _cards(text)
    yield from _ibans(text)
    yield from _phones(text)
