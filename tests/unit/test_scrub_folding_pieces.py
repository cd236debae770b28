"""Folding (``_patterns.normalise``) looks only at the pieces of a text that are not all ASCII;
it folds long texts exactly as the whole-text search it replaced."""

from __future__ import annotations

import random
import re
import unicodedata

from recalltrace.tracer._scrub import _patterns as P
from tests.reliability import secrets_heldout
from tests.reliability.ordinary_corpus import SENTENCES
from tests.reliability.secret_kinds import all_kinds

_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def _reference(text: str) -> tuple[str, list[int] | None]:
    """``normalise`` as it was, searching the whole text."""
    if (
        unicodedata.is_normalized("NFKC", text)
        and P._OTHER_DIGIT.search(text) is None
        and P.INVISIBLE.search(text) is None
        and P._MIXED_SCRIPT.search(text) is None
    ):
        return text, None
    pieces: list[str] = []
    lengths: list[tuple[int, int, int]] = []
    last = 0
    for run in _NON_ASCII.finditer(text):
        pieces.append(text[last : run.start()])
        for index in range(run.start(), run.end()):
            char = text[index]
            folded = unicodedata.normalize("NFKC", char)
            if folded.isdecimal() and not folded.isascii():
                folded = "".join(str(unicodedata.decimal(c)) for c in folded)
            elif char.isspace():
                folded = " "
            elif P.INVISIBLE.match(char):
                folded = ""
            elif char in P._HOMOGLYPHS and P._next_to_latin(text, index):
                folded = P._HOMOGLYPHS[char]
            pieces.append(folded)
            if len(folded) != 1:
                lengths.append((index, 1, len(folded)))
        last = run.end()
    pieces.append(text[last:])
    result = "".join(pieces)
    if not lengths:
        return result, None
    offsets: list[int] = []
    position = 0
    for index, _, size in lengths:
        offsets.extend(range(position, index))
        offsets.extend([index] * size)
        position = index + 1
    offsets.extend(range(position, len(text) + 1))
    return result, offsets


def test_long_texts_fold_as_before() -> None:
    rng = random.Random(11)
    pieces = [*SENTENCES, *(kind.text for kind in all_kinds())]
    pieces += [kind.text for kind in secrets_heldout.all_kinds()]
    # Characters folding acts on, placed at random (a look-alike beside a Latin letter across
    # a piece's edge among them).
    odd = [
        "\u200b",
        "\u00ad",
        "\ufeff",
        "а",
        "о",
        "ѕ",
        "ο",
        "١",
        "٣",
        "\uff41",
        "ﬁ",
        "é",
        "e\u0301",
    ]
    odd += ["\u3000", "\u00a0", "密码", "Ⅻ"]
    for index in range(300):
        text = "".join(
            rng.choice(pieces) + rng.choice((" ", "\n", rng.choice(odd)))
            for _ in range(rng.randint(1, 60))
        )
        for _ in range(rng.randint(0, 4)):
            at = rng.randint(0, len(text))
            text = text[:at] + rng.choice(odd) + text[at:]
        assert P.normalise(text) == _reference(text), index
    for at in range(P._CHUNK - 3, P._CHUNK + 3):
        for odd_char in ("а", "\u200b", "١"):
            text = "x" * at + odd_char + "y" * 50
            assert P.normalise(text) == _reference(text), (at, odd_char)
            text = "x" * at + " " + odd_char + "y"
            assert P.normalise(text) == _reference(text), (at, odd_char)


def test_long_texts_lower_as_before() -> None:
    """``lower`` of a text whose lower case is longer (İ) lower-cases piece by piece, each
    character as it did; a capital sigma keeps its context-free lower case."""
    rng = random.Random(12)
    pieces = [*SENTENCES, "İstanbul", "ΟΔΥΣΣΕΥΣ", "Σ", "ß", "ΑΣ ΒΣ", "ǅ"]
    for index in range(100):
        text = " ".join(rng.choice(pieces) for _ in range(rng.randint(1, 400)))
        expected = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
        if len(text.lower()) == len(text):
            expected = text.lower()
        assert P.lower(text) == expected, index
        assert len(P.lower(text)) == len(text)
