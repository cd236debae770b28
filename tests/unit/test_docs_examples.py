"""The docs' examples and pointers as a reader uses them: tracing.md's extractor for
Pinecone-style matches stores their text, the matches returned as they are carry a note, and
every test helper the docs point to exists."""

from __future__ import annotations

import re
from typing import Any

import recalltrace
from recalltrace.testing import capture
from tests.support import ROOT

PINECONE = {
    "matches": [
        {"id": "kb-1", "score": 0.92, "metadata": {"text": "Reset your password from sign-in."}},
        {"id": "kb-7", "score": 0.81, "metadata": {"text": "Passwords expire every 90 days."}},
    ],
    "namespace": "help-center",
}


def test_the_documented_extractor_stores_the_text_of_pinecone_matches() -> None:
    @recalltrace.retrieval(
        extractor=lambda response: [
            {"id": m["id"], "score": m["score"], "text": m["metadata"]["text"]}
            for m in response["matches"]
        ]
    )
    def search(query: str) -> dict[str, Any]:
        return PINECONE

    @recalltrace.rag
    def answer(question: str) -> str:
        search(question)
        return "From the sign-in page."

    with capture() as captured:
        answer("How do I reset my password?")
        record = captured.record()
    assert [c.content for c in record.retrieved_contexts] == [
        "Reset your password from sign-in.",
        "Passwords expire every 90 days.",
    ]
    assert [c.id for c in record.retrieved_contexts] == ["kb-1", "kb-7"]
    assert not [n for n in record.notes if "no readable text" in n], record.notes


def test_matches_without_readable_text_carry_a_note() -> None:
    @recalltrace.retrieval(extractor=lambda response: response["matches"])
    def search(query: str) -> dict[str, Any]:
        return PINECONE

    @recalltrace.rag
    def answer(question: str) -> str:
        search(question)
        return "From the sign-in page."

    with capture() as captured:
        answer("How do I reset my password?")
        record = captured.record()
    assert [c.id for c in record.retrieved_contexts] == ["kb-1", "kb-7"]
    assert [c.content for c in record.retrieved_contexts] == ["", ""]
    (note,) = [n for n in record.notes if "no readable text" in n]
    assert note.startswith("2 retrieved document(s) had an id but no readable text"), note
    assert "extractor=" in note


def test_every_test_helper_the_docs_name_exists() -> None:
    named: set[str] = set()
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = doc.read_text(encoding="utf-8")
        named.update(re.findall(r"\btests/[\w/]+\.py\b", text))
        named.update(
            module.replace(".", "/") + ".py"
            for module in re.findall(r"\b(?:python -m |from )(tests(?:\.\w+)+)", text)
        )
    assert named, "the docs name no test helper"
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, missing
