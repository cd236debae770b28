"""The scrubber's keyword prefilter (``tracer/_scrub/_prefilter.py``): in long documents it
finds what running every rule over the whole text finds, including matches that reach past a
window or whose anchor is far from the number that gates them."""

from __future__ import annotations

import random

import pytest

import recalltrace
from recalltrace.tracer._scrub import Scrubber, _prefilter
from recalltrace.tracer._scrub._ruleset import FileRule
from tests.reliability.ordinary_corpus import SENTENCES
from tests.reliability.secret_kinds import all_kinds, leaked_kinds

pytestmark = pytest.mark.skipif(not _prefilter.available(), reason="pyahocorasick is absent")


@pytest.fixture(scope="module")
def scrubbers() -> tuple[Scrubber, Scrubber]:
    """A scrubber with the prefilter and one without (every rule over the whole text)."""
    with_prefilter = Scrubber(recalltrace.ScrubbingOptions())
    saved = _prefilter.ahocorasick
    _prefilter.ahocorasick = None
    try:
        whole_text = Scrubber(recalltrace.ScrubbingOptions())
    finally:
        _prefilter.ahocorasick = saved
    assert with_prefilter._prefilter is not None and whole_text._prefilter is None
    return with_prefilter, whole_text


def _document(rng: random.Random, length: int) -> str:
    pieces: list[str] = []
    while sum(map(len, pieces)) < length:
        pieces.append(rng.choice(SENTENCES) + rng.choice((" ", " ", "\n")))
    return "".join(pieces)[:length]


def test_kinds_planted_in_long_documents_leak_no_more(scrubbers: tuple[Scrubber, Scrubber]) -> None:
    with_prefilter, whole_text = scrubbers
    rng = random.Random(20261129)
    kinds = all_kinds()
    for index in range(150):
        document = _document(rng, rng.choice((300, 3000, 8000)))
        planted = [rng.choice(kinds) for _ in range(rng.randint(1, 3))]
        for kind in planted:
            at = rng.randint(0, len(document))
            separator = rng.choice((" ", "\n", ": ", ". "))
            document = document[:at] + separator + kind.text + separator + document[at:]
        leaked = leaked_kinds(with_prefilter.scrub_text(document, "f", []), planted)
        assert not set(leaked) - set(
            leaked_kinds(whole_text.scrub_text(document, "f", []), planted)
        ), (index, leaked)


@pytest.mark.parametrize(
    "secret",
    [
        # Longer than any window: taken whole from the text.
        "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0" * 80 + ".c2lnbmF0dXJlMTIzNDU2Nzg5",
        "postgresql://admin:" + "Zq9" * 100 + "@db.internal:5432/app",
        "jane.doe@" + "sub." * 60 + "example.com",
        # No run of four digits in the number itself (one stands elsewhere in the document).
        "+44 20 79 46 09 58",
    ],
)
def test_long_matches_and_far_gates(scrubbers: tuple[Scrubber, Scrubber], secret: str) -> None:
    with_prefilter, whole_text = scrubbers
    document = _document(random.Random(3), 6000)
    text = f"{document} Build 2024 failed; contact {secret} for the logs. {document}"
    expected = whole_text.scrub_text(text, "f", [])
    assert secret not in expected
    assert with_prefilter.scrub_text(text, "f", []) == expected


def test_generic_detectors_find_the_same_with_the_prefilters_hits(
    scrubbers: tuple[Scrubber, Scrubber],
) -> None:
    """The generic detectors (``_generic``, ``_personal``) read the prefilter's hits instead of
    searching the text for their words; their spans and gates are the same either way."""
    from recalltrace.tracer._scrub import _generic as G
    from recalltrace.tracer._scrub import _patterns as P
    from tests.reliability import secrets_heldout

    with_prefilter, _ = scrubbers
    prefilter = with_prefilter._prefilter
    assert prefilter is not None
    texts = [kind.text for kind in all_kinds()] + [
        kind.text for kind in secrets_heldout.all_kinds()
    ]
    rng = random.Random(20261130)
    finders = (G._CREDENTIALS[1], G._PERSONAL[1], G._ENCODED[1])
    for index in range(240):
        document = _document(rng, rng.choice((300, 3000, 8000)))
        for text in rng.sample(texts, rng.randint(1, 4)):
            at = rng.randint(0, len(document))
            separator = rng.choice((" ", "\n", ": ", ". ", " is "))
            document = document[:at] + separator + text + separator + document[at:]
        view = document if document.isascii() else P.normalise(document)[0]
        scan = _prefilter.Scan(view, prefilter)
        hits = scan.hits
        assert G.rules_for(view, Scrubber, scan) == G.rules_for(view, Scrubber), index
        # The scrubber's own rules (rule-file rules are chosen by the hits since cc30bb3).
        own = [
            rule
            for rule in with_prefilter._default_rules_for(
                view, None, _prefilter.Scan(view, prefilter)
            )
            if not isinstance(rule, FileRule)
        ]
        assert own == [
            rule
            for rule in with_prefilter._default_rules_for(view)
            if not isinstance(rule, FileRule)
        ], index
        for finder in finders:
            found = [hit.span() for hit in finder.finditer(view, hits)]  # type: ignore[call-arg]
            assert found == [hit.span() for hit in finder.finditer(view)], (index, finder)


def test_the_gates_words_are_needles() -> None:
    """Every gate ``_holds`` looks up in the hits is a needle of the automaton."""
    from recalltrace.tracer import _scrub as S
    from recalltrace.tracer._scrub import _generic as G

    words = {*_prefilter.needles(), *G.NEEDLES, *S._GATE_NEEDLES}
    for _, gates, _ in S._GATED:
        assert {gate.lower() for gate in gates} <= words


def test_curl_rules_find_the_same_when_their_flag_is_looked_for_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gitleaks' curl rules are tried at a "curl" only when their flag is within reach."""
    from recalltrace.tracer._scrub import _ruleset, rule_files
    from recalltrace.tracer._scrub._ruleset import BUILTIN_RULE_FILES

    files = rule_files(tuple(str(path) for path in BUILTIN_RULE_FILES))
    rules = [rule for rule in files.rules if _ruleset._flags_needed(rule.regex)]
    assert len(rules) == 2
    rng = random.Random(7)
    lines = [
        "curl -s https://api.example.com/v1/items",
        "  -H 'Authorization: Bearer Zx81kQp0Lm2Nv7Rt4Ws9' \\",
        '  --header "Authorization: Basic dXNlcjpwYXNzd29yZDEyMw==" \\',
        "  -u admin:S3cr3tPassw0rd \\",
        "  --user 'deploy:Kp9!mQ2#vL5x' \\",
        "",
        "\r",
        "  --data @payload.json \\",
        "The curl call above fails when the proxy is down.",
        *rng.sample(SENTENCES, 20),
    ]
    documents = ["\n".join(rng.choices(lines, k=rng.randint(5, 40))) for _ in range(300)]

    def found() -> list[list[tuple[int, int]]]:
        return [
            [match.span() for match in files.matches(rule, text, text.lower())]
            for text in documents
            for rule in rules
        ]

    checked = found()
    monkeypatch.setattr(_ruleset, "_flags_needed", lambda regex: ())
    assert checked == found()
    assert sum(map(len, checked)) > 100


def test_value_patterns_match_as_over_the_whole_text(scrubbers: tuple[Scrubber, Scrubber]) -> None:
    """Configuration names (from the start of the name holding the word) and numbers (in the
    clusters holding as many digits as a match does) are matched as over the whole text."""
    import re

    from recalltrace.tracer._scrub import _patterns as P

    with_prefilter, _ = scrubbers
    prefilter = with_prefilter._prefilter
    assert prefilter is not None
    texts = [kind.text for kind in all_kinds()]
    texts += ["MY_APP_API_KEY=Zq81kQp0Lm2Nv7Rt4Ws9", "DB9_PASSWORD: 'hunter2hunter2'"]
    texts += ["+1 415 555 0132 or +44 20 7946 0958", "tel. (415) 555-0132", "id 078-05-1120"] * 3
    texts += [
        "card 4111 1111 1111 1111 or 4111-1111-1111-1111",
        "SSN 123-45-6789",
        "xAUTH_TOKEN=abc",
    ]
    rng = random.Random(5)
    specs = dict(_prefilter.TRIGGERS)
    patterns = [P.ENV_SECRET, P.CARD, P.SSN, P.PHONE]
    counts = dict.fromkeys((pattern[0] for pattern in patterns), 0)
    for index in range(200):
        document = _document(rng, rng.choice((300, 3000)))
        for text in rng.sample(texts, rng.randint(1, 5)):
            at = rng.randint(0, len(document))
            document = (
                document[:at] + rng.choice((" ", "\n", "_", "x")) + text + " " + document[at:]
            )
        view = document if document.isascii() else P.normalise(document)[0]
        for pattern in patterns:
            regex = re.compile(pattern[1], pattern[3])
            scan = _prefilter.Scan(view, prefilter)
            found = [m.span() for m in _prefilter.matches(regex, specs[pattern], scan)]
            assert found == [m.span() for m in regex.finditer(view)], (index, pattern[0])
            counts[pattern[0]] += len(found)
    assert min(counts.values()) > 5, counts
