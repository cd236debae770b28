"""Values of metadata scrubbed beyond their text: numbers, and the notes.

Numbers are scrubbed as the text they stand for.
A card number kept as an ``int`` (or an integral ``float``) in a record's or a document's
metadata is a card number all the same: :meth:`Scrubber.scrub_value` scrubs the digits of such
a number with the text detectors, and a number whose text would be redacted is stored as the
redacted text. Numbers of fewer than six digits (counts, ages, years) are no secret any
detector finds and are left as they are.

A timestamp is not a card, though it may pass the card's checksum (one in ten does): the
detectors take 13 to 19 digits, and a number of those lengths is kept when a card cannot have
its shape. Cards of 13 digits are Visa's and begin with 4, while epoch milliseconds from 2001
to 2096 begin with 1, 2 or 3; and 1 begins only the 15-digit airline cards (UATP), while
epoch microseconds (16 digits) and nanoseconds (19 digits) of this century begin with 1.

Notes name metadata keys (a value that JSON cannot hold is noted with its key path), so a key
path under a sensitive key quotes what that key held, which the metadata itself stores
redacted: the strings redacted whole under sensitive keys are redacted in the notes too.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recalltrace.tracer._scrub import Scrubber

MIN_DIGITS = 6


def number_text(value: Any) -> str | None:
    """The digits of an ``int`` or integral ``float`` of at least six digits (the sign left
    out), else ``None`` (booleans and other types included)."""
    kind = type(value)
    if kind is float:
        if not math.isfinite(value) or not value.is_integer():
            return None
        value = int(value)
    elif kind is not int:
        return None
    text = str(abs(value))
    return text if len(text) >= MIN_DIGITS else None


def cannot_be_card(digits: str) -> bool:
    """Whether ``digits`` (a number's text) cannot be a card number by its length and first
    digit, as epoch timestamps in milliseconds, microseconds or nanoseconds cannot."""
    if len(digits) == 13:
        return digits[0] != "4"
    return digits[0] == "1" and len(digits) != 15


def only_cards(notes: list[str]) -> bool:
    """Whether every redaction noted in ``notes`` is a card number's."""
    return bool(notes) and all(line.startswith("scrubbed card_number ") for line in notes)


def scrub_number(
    scrubber: Scrubber, value: Any, path: str, notes: list[str] | None, rules: Any
) -> Any:
    """A number scrubbed as its digits: their redacted text when the text detectors redact
    them (a timestamp is not taken for a card), else the number itself."""
    digits = number_text(value)
    if digits is None:
        return value
    found: list[str] = []
    scrubbed = scrubber.scrub_text(digits, path, found, rules)
    if scrubbed == digits or (cannot_be_card(digits) and only_cards(found)):
        return value
    if notes is not None:
        notes.extend(line for line in found if line not in notes)
    return scrubbed


def scrub_notes(
    scrubber: Scrubber, notes: list[str], hidden: list[str], replacement: str
) -> list[str]:
    """``notes`` scrubbed as text, and without the strings of ``hidden`` (of at least four
    characters: what sensitive keys held)."""
    pieces = sorted({piece for piece in hidden if len(piece) >= 4}, key=len, reverse=True)
    result = []
    for note in notes:
        note = scrubber.scrub_text(note, "notes", None)
        for piece in pieces:
            if piece in note:
                note = note.replace(piece, replacement)
        result.append(note)
    return result
