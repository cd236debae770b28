"""A "password ... is" phrase stays within its sentence: two ordinary sentences joined (as in a
retrieved document) are not taken for a password and its value."""

from __future__ import annotations

import pytest

import recalltrace
from recalltrace.tracer._scrub import Scrubber

_FIRST = "The password policy requires twelve characters and a passphrase manager."
_SECOND = (
    "The status page is status.example.com and the API is api.eu-central-1.example.com.",
    "See https://wiki.example.com/security for the rotation schedule.",
    "The default region is eu-central-1 and the bucket is logs-2026.",
    "Its owner was the platform team: ask in #platform.",
)


@pytest.mark.parametrize("second", _SECOND)
@pytest.mark.parametrize("joint", [" ", "\n", "  ", " \n"])
def test_a_phrase_does_not_reach_into_the_next_sentence(second: str, joint: str) -> None:
    scrubber = Scrubber(recalltrace.ScrubbingOptions())
    text = _FIRST + joint + second
    assert scrubber.scrub_text(text, "f", []) == text
    assert scrubber.scrub_text("The password is Tr0ub4dor&3x.", "f", []) != (
        "The password is Tr0ub4dor&3x."
    )
