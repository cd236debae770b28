"""The scrubber's compiled gate (``tracer/_scrub/_compiled.py``): the same redactions with and
without it on every corpus, its cache, and the scrubber without Hyperscan."""

from __future__ import annotations

import copy
import json
import os
import random
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

import recalltrace
from benchmarks.scrub import records
from recalltrace.storage.records import ContextRecord, TraceRecord
from recalltrace.tracer._scrub import Scrubber, _compiled
from tests.reliability import secret_kinds, secrets_heldout
from tests.reliability.ordinary_corpus import SENTENCES

pytest.importorskip("hyperscan")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scrubbers() -> tuple[Scrubber, Scrubber]:
    gated = Scrubber(recalltrace.ScrubbingOptions())
    assert gated._gate.wait(timeout=900), "the compiled gate was not built"
    plain = Scrubber(recalltrace.ScrubbingOptions())
    plain.compiled_gate = False
    return gated, plain


def _planted(texts: list[str], ascii_only: bool, seed: int) -> list[TraceRecord]:
    """Records of ten documents of about 1 KB of ordinary sentences, each holding one of
    ``texts`` at a random place."""
    rng = random.Random(seed)
    sentences = [s for s in SENTENCES if s.isascii()] if ascii_only else list(SENTENCES)
    out = []
    for first in range(0, len(texts), 10):
        documents = []
        for text in texts[first : first + 10]:
            words = rng.sample(sentences, 12)
            words.insert(rng.randrange(len(words) + 1), text)
            documents.append(ContextRecord(" ".join(words), id=f"d{len(documents)}"))
        out.append(
            TraceRecord(
                trace_id=f"{seed:08x}{first:024x}",
                app_name="support-bot",
                service_name="rag-api",
                started_at=datetime.now(timezone.utc),
                duration_ms=1.0,
                user_input="How are keys rotated?",
                response="Every 90 days.",
                retrieved_contexts=documents,
                metadata={"tenant": "acme"},
            )
        )
    return out


def _names(rules: list[object]) -> list[str]:
    return [rule[0] if isinstance(rule, tuple) else rule.name for rule in rules]  # type: ignore[attr-defined]


def _same(gated: Scrubber, plain: Scrubber, batch: list[TraceRecord]) -> int:
    """Assert both scrubbers leave each record the same; the rules the gate skipped."""
    skipped = 0
    for record in batch:
        text = "\n".join(context.content for context in record.retrieved_contexts)
        view = text if text.isascii() else recalltrace.tracer._scrub.P.normalise(text)[0]
        assert _names(gated._group_rules(text)) == _names(plain._group_rules(text))
        skipped += len(gated._gate.skipped(view) or ())
        ours, theirs = copy.deepcopy(record), copy.deepcopy(record)
        for scrubber in (gated, plain):
            scrubber._clean_contents.clear()
            scrubber._clean.clear()
        gated.scrub_record(ours)
        plain.scrub_record(theirs)
        assert ours == theirs
    return skipped


@pytest.mark.parametrize("ascii_only", [True, False])
def test_the_same_redactions_with_and_without_the_gate(
    scrubbers: tuple[Scrubber, Scrubber], ascii_only: bool
) -> None:
    gated, plain = scrubbers
    kinds = [kind.text for kind in secret_kinds.all_kinds()]
    kinds += [kind.text for kind in secrets_heldout.all_kinds()]
    ordinary = list(SENTENCES)
    batch = _planted(kinds, ascii_only, 1) + _planted(ordinary, ascii_only, 2)
    assert len(batch) > 40
    assert any(len("\n".join(c.content for c in r.retrieved_contexts)) > 8192 for r in batch)
    assert _same(gated, plain, batch) > 0  # the gate did skip rules


@pytest.mark.parametrize("prose", [False, True])
def test_the_same_redactions_on_the_benchmark_documents(
    scrubbers: tuple[Scrubber, Scrubber], prose: bool
) -> None:
    gated, plain = scrubbers
    batch = records(4, 5_000, prose, seed=3) + records(2, 50_000, prose, seed=4)
    assert _same(gated, plain, batch) > 0


def _variants(text: str) -> list[str]:
    """``text``, with accented letters, and with no-break and ideographic spaces (which
    Python's ``\\s`` and ``\\w`` take, as it takes the letters)."""
    accented = text.translate(str.maketrans("eaou", "éàöû"))
    spaced = text.replace(" ", "\u00a0", 3).replace(":", ":\u3000", 1).replace("=", "=\u2003", 1)
    return [text, accented, spaced, "ß" + text + "é"]


def test_a_rule_that_matches_a_text_is_never_skipped(scrubbers: tuple[Scrubber, Scrubber]) -> None:
    """The gate's invariant, rule by rule on short texts (where one character decides a
    match): whatever a rule's expression finds, its rewrite finds too."""
    gate = scrubbers[0]._gate
    database = gate._gate
    assert isinstance(database, _compiled.Gate)
    texts = [kind.text for kind in secret_kinds.all_kinds()]
    texts += [kind.text for kind in secrets_heldout.all_kinds()]
    texts += list(SENTENCES)
    regexes = [rule[1] if isinstance(rule, tuple) else rule.regex for rule in gate._rules]
    checked = 0
    for text in texts:
        for variant in _variants(text):
            view = (
                variant if variant.isascii() else recalltrace.tracer._scrub.P.normalise(variant)[0]
            )
            if not _compiled.readable(view):
                continue
            may = database.may_match(view)
            for index, regex in enumerate(regexes):
                if regex.search(view) is not None:
                    checked += 1
                    assert index in may, (regex.pattern, view)
    assert checked > 1000


# Expressions and texts in which a character other than ASCII decides the match.
_OTHER_CASES = [
    (r"key=\w{4}z", "key=ééééz"),
    (r"[^\W_]{3}z", "éééz z"),
    (r"(?i)[a-z]{3}\d", "\u212a\u017fa٣"),
    (r"\d{3}-x", "٣٣٣-x"),
    (r"pass\s+(\S+)", "pass\u00a0word"),
    (r"(?i)token=k", "token=\u212a"),
    ("(?i)to\u212aen", "token"),
    (r"(?i)skip", "\u017fkip"),
    (r"contraseña: \w+", "contraseña: x"),
    (r"(?i)Ä{2}", "ää"),
    (r"\Bname", "éname"),
    (r"\w\b-", "é-"),
    ("[à-ÿ]{2}", "éé"),
    (r"x.y", "x→y"),
]


def test_characters_other_than_ascii_match_as_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECALLTRACE_CACHE_DIR", str(tmp_path))
    rules = [(f"r{i}", re.compile(pattern), 0) for i, (pattern, _) in enumerate(_OTHER_CASES)]
    gate = _compiled.RuleGate(rules, set(), None)
    assert gate.wait(120)
    database = gate._gate
    assert isinstance(database, _compiled.Gate)
    for index, (pattern, text) in enumerate(_OTHER_CASES):
        assert re.search(pattern, text) is not None, pattern
        assert index in database.may_match(text), (pattern, text)
        assert index not in database.may_match("plain words only"), pattern


def test_every_rule_has_a_rewrite_hyperscan_compiles(scrubbers: tuple[Scrubber, Scrubber]) -> None:
    gate = scrubbers[0]._gate._gate
    assert isinstance(gate, _compiled.Gate)
    assert len(gate.included) == len(scrubbers[0]._gate._rules)


def test_rewrites_read_python_syntax() -> None:
    assert _compiled.superset(r"ab{,3}c", False) == r"ab{0,3}c"
    assert _compiled.superset(r"(?<![a-z])key(?=:)", False) == "[kK\\x1a]ey"
    assert _compiled.superset(r"\btoken\b$", True) == "to[kK\\x1a]en"
    assert _compiled.superset(r"x{40,100}", False) == "x{32,}"
    assert _compiled.superset(r"(a)\1", False) is None
    assert _compiled.superset(r"[^\W_]\w", False) == r"(?:[^\W_]|\x1a)[\w\x1a]"


_CHILD = """
import json, re, sys
from recalltrace.tracer._scrub import _compiled
gate = _compiled.RuleGate(
    [("a", re.compile(r"ab+c"), 0), ("b", re.compile(r"x{,3}y"), 0)], set(), None
)
ready = gate.wait(120)
text = "abbc " * 2000
print(json.dumps({"ready": ready, **_compiled.counts, "skipped": len(gate.skipped(text) or ()),
                  "kept": len(gate.skipped(text + " xxy") or ())}))
"""


def _child(cache: Path) -> dict[str, object]:
    env = {**os.environ, "RECALLTRACE_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_second_process_loads_the_database_and_a_damaged_one_is_compiled(
    tmp_path: Path,
) -> None:
    first = _child(tmp_path)
    assert first == {"ready": True, "compiled": 1, "loaded": 0, "skipped": 1, "kept": 0}
    assert _child(tmp_path)["loaded"] == 1
    (stored,) = tmp_path.glob("scrub-gate-*.hsdb")
    data = stored.read_bytes()
    stored.write_bytes(data[: len(data) // 2] + b"\0" * (len(data) - len(data) // 2))
    again = _child(tmp_path)
    assert (again["compiled"], again["loaded"], again["ready"]) == (1, 0, True)
    assert _child(tmp_path)["loaded"] == 1  # written again whole
    stored.write_bytes(b"garbage")
    assert _child(tmp_path)["compiled"] == 1


def test_an_unwritable_cache_is_compiled_around(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    result = _child(blocked / "cache")
    assert (result["ready"], result["compiled"], result["skipped"]) == (True, 1, 1)


def test_the_scrubber_works_without_hyperscan() -> None:
    code = (
        "import sys; sys.modules['hyperscan'] = None\n"
        "import recalltrace\n"
        "from recalltrace.tracer._scrub import Scrubber\n"
        "s = Scrubber(recalltrace.ScrubbingOptions())\n"
        "text = 'deploy notes ' * 1000 + 'password=Hunter2!xyzQ' + ' more' * 100\n"
        "s._group_rules(text)\n"
        "assert s._gate.wait(1) is False\n"
        "print('Hunter2' in s.scrub_text(text, 'x', None))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
