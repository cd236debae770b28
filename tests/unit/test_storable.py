"""Making a record storable: the quick check of the usual record agrees with the value-by-value
walk, and no text position escapes it."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from datetime import datetime, timezone
from typing import Any

import pytest

from recalltrace.storage._storable import _storable_walk, json_safe, json_text, storable_record
from recalltrace.storage.records import ContextRecord, TraceRecord

NUL = "\x00"
SURROGATE = "\udc80"  # a byte that was not UTF-8, decoded with surrogateescape


def _record(**changes: Any) -> TraceRecord:
    base = TraceRecord(
        trace_id="ab" * 16,
        app_name="support-bot",
        service_name="api",
        started_at=datetime(2026, 11, 27, tzinfo=timezone.utc),
        duration_ms=12.5,
        user_input="How do refunds work?",
        response="Refunds take five days.",
        retrieved_contexts=[
            ContextRecord("Refunds take five days.", "doc-1", 0.9, {"source": "faq", "page": 3}),
            ContextRecord("Shipping is free.", None, None, {}),
        ],
        reference="Five days.",
        reference_contexts=["Refunds take five days."],
        reference_context_ids=["doc-1"],
        metadata={"route": "/ask", "attempt": 1, "cached": False, "latency": 0.25},
        notes=["a note"],
        release="v1",
        environment="prod",
        user_id="u-1",
        session_id="s-1",
        tags=["beta", "eu"],
    )
    return dataclasses.replace(base, **changes)


def _context(index: int, **changes: Any) -> dict[str, Any]:
    contexts = list(_record().retrieved_contexts)
    contexts[index] = dataclasses.replace(contexts[index], **changes)
    return {"retrieved_contexts": contexts}


NAMES = (
    "app_name",
    "service_name",
    "user_input",
    "response",
    "reference",
    "release",
    "environment",
    "user_id",
    "session_id",
)
CONTEXTS = "retrieved_contexts"

# Every text position storable_record examines, each with a bad character planted in it, and
# the position its note names.
PLANTED: list[tuple[str, Any, str]] = [
    *[(name, lambda bad, name=name: {name: f"x{bad}y"}, name) for name in NAMES],
    ("reference text", lambda bad: {"reference_contexts": ["ok", bad]}, "reference_contexts"),
    ("reference id", lambda bad: {"reference_context_ids": [bad]}, "reference_context_ids"),
    ("metadata key", lambda bad: {"metadata": {f"k{bad}": 1}}, "metadata"),
    ("metadata value", lambda bad: {"metadata": {"k": f"v{bad}"}}, "metadata"),
    ("nested metadata", lambda bad: {"metadata": {"k": {"deep": [bad]}}}, "metadata"),
    ("tag", lambda bad: {"tags": ["beta", f"t{bad}"]}, "tags"),
    ("context content", lambda bad: _context(1, content=bad), f"{CONTEXTS}[1].content"),
    ("context id", lambda bad: _context(0, id=f"doc{bad}"), f"{CONTEXTS}[0].id"),
    ("context metadata", lambda bad: _context(0, metadata={"s": bad}), f"{CONTEXTS}[0].metadata"),
    ("context key", lambda bad: _context(0, metadata={bad: 1}), f"{CONTEXTS}[0].metadata"),
]


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
@pytest.mark.parametrize(("label", "plant", "where"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_bad_character_anywhere_is_replaced_and_noted(
    label: str, plant: Any, where: str, bad: str
) -> None:
    record = _record(**plant(bad))
    stored = storable_record(record)
    assert stored is not record
    assert stored == _storable_walk(record)
    assert any(f"in {where}" in note for note in stored.notes), stored.notes
    assert bad not in repr(dataclasses.asdict(stored)).replace("\\x00", NUL)


def test_a_bad_character_in_a_note_is_replaced() -> None:
    record = _record(notes=[f"seen {NUL} here"])
    stored = storable_record(record)
    assert stored.notes == ["seen \ufffd here"]
    assert stored == _storable_walk(record)


@pytest.mark.parametrize(
    "changes",
    [
        {"app_name": "a" * 201},
        {"user_id": "u" * 300},
        {"tags": ["t" * 201]},
        {"tags": ["beta", "beta"]},
        {"tags": ["", "beta"]},
        {"tags": ("beta", "eu")},
        {"tags": ["beta", ["not", "hashable"]]},
        _context(0, id="d" * 501),
    ],
    ids=[
        "app_name",
        "user_id",
        "tag",
        "duplicate tag",
        "empty tag",
        "tags tuple",
        "unhashable tag",
        "context id",
    ],
)
def test_what_the_walk_changes_besides_characters_is_changed_alike(changes: dict[str, Any]) -> None:
    record = _record(**changes)
    stored = storable_record(record)
    assert stored == _storable_walk(record)
    assert stored != record


def test_a_plain_record_is_kept_as_it_is() -> None:
    record = _record(user_input="¿Cómo funcionan los reembolsos? 返金")
    assert storable_record(record) is record
    assert _storable_walk(record) is record


def _random_text(rng: random.Random) -> str:
    alphabet = ["a", "b", " ", "é", "返", "\ufffd", "😀", NUL, SURROGATE]
    weights = [30, 30, 10, 3, 3, 1, 1, 1, 1]
    return "".join(rng.choices(alphabet, weights, k=rng.randint(0, 12)))


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 2 else 6)
    if kind == 0:
        return _random_text(rng)
    if kind == 1:
        return rng.randint(-5, 5)
    if kind == 2:
        return rng.choice([0.5, math.nan, math.inf, -0.0])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return rng.choice([(1, "a"), {"x", "y"}, b"raw"])
    if kind == 5:
        return _random_text(rng)
    if kind == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_random_key(rng): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _random_key(rng: random.Random) -> Any:
    return rng.choice([_random_text(rng), _random_text(rng), 7, None])


def test_the_quick_check_agrees_with_the_walk_on_random_records() -> None:
    rng = random.Random(20261127)
    kept = changed = 0
    for _ in range(3000):
        texts = {name: _random_text(rng) or None for name in ("user_input", "response")}
        record = _record(
            **texts,
            app_name=_random_text(rng) * rng.choice([1, 1, 40]),
            tags=[_random_text(rng) for _ in range(rng.randint(0, 3))],
            metadata={_random_key(rng): _random_value(rng) for _ in range(rng.randint(0, 3))},
            retrieved_contexts=[
                ContextRecord(
                    _random_text(rng),
                    rng.choice([None, _random_text(rng), "d" * 600]),
                    None,
                    {_random_key(rng): _random_value(rng) for _ in range(rng.randint(0, 2))},
                )
                for _ in range(rng.randint(0, 3))
            ],
            notes=[_random_text(rng) for _ in range(rng.randint(0, 2))],
        )
        stored = storable_record(record)
        assert stored == _storable_walk(record), record
        if stored is record:
            kept += 1
        else:
            changed += 1
    # Both outcomes are exercised in earnest.
    assert kept > 300 and changed > 300, (kept, changed)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"a": 1, "b": "x", "c": None, "d": True, "e": 0.5}, None),
        ({"a": math.nan, "b": math.inf}, {"a": None, "b": None}),
        ({1: "x", None: "y"}, {"1": "x", "None": "y"}),
        ({"a": (1, 2), "b": {"c": math.nan}}, {"a": [1, 2], "b": {"c": None}}),
        ({"a": b"raw"}, {"a": "b'raw'"}),
    ],
    ids=["flat", "non-finite", "keys", "nested", "object"],
)
def test_json_safe(value: dict[Any, Any], expected: dict[str, Any] | None) -> None:
    assert json_safe(value) == (value if expected is None else expected)


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 7, 10**30, -(2**63)])
    if kind == 3:
        return rng.choice([0.1, -0.0, 1e300, 5e-324, math.nan, math.inf, -math.inf, 2.5])
    if kind in (4, 5):
        alphabet = 'ab "\\/\n\t\x00\x1f\u00e9\u2028\ud7ff\U0001f600東'
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
    if kind == 6:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(5))]
    if kind == 7:
        return tuple(_random_json(rng, depth + 1) for _ in range(rng.randrange(3)))
    return {
        str(_random_json(rng, 3)): _random_json(rng, depth + 1) for _ in range(rng.randrange(5))
    }


def test_json_text_is_json_dumps() -> None:
    """The encoder built once writes exactly what ``json.dumps`` writes (the text Postgres is
    given for a JSON column), for every kind of value a record holds."""
    rng = random.Random(27)
    for _ in range(3000):
        value = _random_json(rng)
        assert json_text(value) == json.dumps(value), value
    with pytest.raises(TypeError):
        json_text({"when": datetime(2026, 11, 27)})
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="Circular reference"):
        json_text(cyclic)
