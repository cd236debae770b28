"""Reading documents and generations of every supported shape, by duck typing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import recalltrace
from recalltrace.storage.records import ContextRecord
from recalltrace.tracer._extract import (
    Usage,
    flat_json,
    metadata_json,
    read_answer,
    read_chunk_text,
    read_document,
    read_documents,
    read_generation_text,
    read_model,
    read_usage,
)
from tests.support.tracer_helpers import Traced, in_request, traced_session


@pytest.fixture
def traced() -> Iterator[Traced]:
    yield from traced_session()


# -- look-alikes of framework types (the tracer never imports the frameworks) -------------------


class Document:
    """Shaped like langchain_core.documents.Document."""

    def __init__(self, page_content: str, metadata: dict[str, Any] | None = None, id=None):
        self.page_content = page_content
        self.metadata = metadata or {}
        self.id = id


class TextNode:
    """Shaped like llama_index.core.schema.TextNode."""

    def __init__(self, text: str, id_: str, metadata: dict[str, Any] | None = None) -> None:
        self.text = text
        self.id_ = id_
        self.metadata = metadata or {}

    @property
    def node_id(self) -> str:
        return self.id_

    def get_content(self) -> str:
        return self.text


class NodeWithScore:
    """Shaped like llama_index.core.schema.NodeWithScore."""

    def __init__(self, node: TextNode, score: float | None) -> None:
        self.node = node
        self.score = score


@dataclass
class HaystackDocument:
    content: str
    id: str
    score: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class LlamaResponse:
    def __init__(self, response: str, source_nodes: list[NodeWithScore]) -> None:
        self.response = response
        self.source_nodes = source_nodes


# -- documents ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("plain text", ("plain text", None, None, {})),
        (
            {"content": "c", "id": 7, "score": 0.5, "metadata": {"a": 1}},
            ("c", "7", 0.5, {"a": 1}),
        ),
        ({"text": "t", "doc_id": "x"}, ("t", "x", None, {})),
        ({"page_content": "p", "metadata": {"id": "m1"}}, ("p", "m1", None, {"id": "m1"})),
        (Document("lc", {"source": "s.md"}, id="lc-1"), ("lc", "lc-1", None, {"source": "s.md"})),
        (
            Document("lc", {"doc_id": "from-metadata"}),
            ("lc", "from-metadata", None, {"doc_id": "from-metadata"}),
        ),
        ((Document("scored"), 0.25), ("scored", None, 0.25, {})),
        (
            NodeWithScore(TextNode("node text", "n1", {"file": "f"}), 0.8),
            ("node text", "n1", 0.8, {"file": "f"}),
        ),
        (TextNode("bare node", "n2"), ("bare node", "n2", None, {})),
        (HaystackDocument("hay", "h1", 0.3, {"k": "v"}), ("hay", "h1", 0.3, {"k": "v"})),
        (ContextRecord("rec", id="r1", score=1.0), ("rec", "r1", 1.0, {})),
        ({"document": Document("nested", id="n"), "score": 0.4}, ("nested", "n", 0.4, {})),
    ],
    ids=[
        "str",
        "dict-content",
        "dict-text",
        "dict-page_content",
        "langchain",
        "langchain-id-in-metadata",
        "langchain-with-score",
        "llamaindex-scored-node",
        "llamaindex-node",
        "haystack",
        "context-record",
        "nested-dict",
    ],
)
def test_document_shapes(document: Any, expected: tuple[Any, ...]) -> None:
    assert tuple(read_document(document)) == expected


def test_containers_of_documents() -> None:
    nodes = [NodeWithScore(TextNode("a", "1"), 0.9), NodeWithScore(TextNode("b", "2"), 0.1)]
    assert [d.id for d in read_documents(LlamaResponse("answer", nodes))] == ["1", "2"]
    assert [d.content for d in read_documents({"documents": ["x", "y"]})] == ["x", "y"]
    assert [d.content for d in read_documents(("t1", "t2"))] == ["t1", "t2"]
    assert [d.content for d in read_documents("single")] == ["single"]
    assert read_documents(None) == []
    # An iterator is never consumed: the caller would lose it.
    iterator = iter(["a", "b"])
    assert read_documents(iterator) == []
    assert list(iterator) == ["a", "b"]


def test_each_shape_through_the_decorator(traced: Traced) -> None:
    shapes: list[Any] = [
        ["s1"],
        [{"content": "d1", "id": "1", "score": 0.1}],
        [Document("lc", {"source": "x"}, id="lc")],
        [NodeWithScore(TextNode("li", "n"), 0.7)],
        LlamaResponse("r", [NodeWithScore(TextNode("src", "s"), None)]),
    ]

    @recalltrace.retrieval
    def search(index: int) -> Any:
        return shapes[index]

    for index in range(len(shapes)):
        in_request(search, index)
    got = [[(c.content, c.id, c.score) for c in r.retrieved_contexts] for r in traced.records()]
    assert got == [
        [("s1", None, None)],
        [("d1", "1", 0.1)],
        [("lc", "lc", None)],
        [("li", "n", 0.7)],
        [("src", "s", None)],
    ]


def test_user_extractor(traced: Traced) -> None:
    @recalltrace.retrieval(extractor=lambda result: result["hits"])
    def search(query: str) -> dict[str, Any]:
        return {"hits": [{"body": "ignored key", "text": "hit", "id": "h"}], "took": 3}

    result = in_request(search, "q")
    assert result["took"] == 3
    assert [(c.content, c.id) for c in traced.record().retrieved_contexts] == [("hit", "h")]


def test_failing_extractor_never_reaches_the_caller(traced: Traced) -> None:
    def broken(result: Any) -> Any:
        raise RuntimeError("extractor bug")

    @recalltrace.retrieval(extractor=broken)
    def search(query: str) -> list[str]:
        return ["doc"]

    assert in_request(search, "q") == ["doc"]
    record = traced.record()
    assert record.retrieved_contexts == []


def test_failing_document_object_never_reaches_the_caller(traced: Traced) -> None:
    class Hostile:
        @property
        def page_content(self) -> str:
            raise RuntimeError("lazy load failed")

    docs = [Hostile()]

    @recalltrace.retrieval
    def search(query: str) -> list[Any]:
        return docs

    assert in_request(search, "q") is docs
    record = traced.record()
    assert [(c.content, c.id) for c in record.retrieved_contexts] == [("", None)]
    assert any("could not be read" in note for note in record.notes)


# -- generations ----------------------------------------------------------------------------------


class Obj:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


OPENAI_DICT = {
    "model": "gpt-4o-mini-2024-07-18",
    "choices": [{"message": {"role": "assistant", "content": "Hello"}}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}
OPENAI_OBJECT = Obj(
    model="gpt-4o",
    choices=[Obj(message=Obj(content="Hi there"))],
    usage=Obj(prompt_tokens=3, completion_tokens=2, total_tokens=5),
)
ANTHROPIC = Obj(
    model="claude-3-5-haiku",
    content=[Obj(type="text", text="Bonjour"), Obj(type="text", text=" !")],
    usage=Obj(input_tokens=10, output_tokens=4),
)
LANGCHAIN_MESSAGE = Obj(
    content="From LangChain",
    usage_metadata={"input_tokens": 7, "output_tokens": 3, "total_tokens": 10},
    response_metadata={"model_name": "gpt-4.1"},
)


@pytest.mark.parametrize(
    ("value", "text", "model", "usage"),
    [
        ("plain", "plain", None, None),
        (OPENAI_DICT, "Hello", "gpt-4o-mini-2024-07-18", Usage(5, 1, 6)),
        (OPENAI_OBJECT, "Hi there", "gpt-4o", Usage(3, 2, 5)),
        (ANTHROPIC, "Bonjour !", "claude-3-5-haiku", Usage(10, 4, 14)),
        (LANGCHAIN_MESSAGE, "From LangChain", "gpt-4.1", Usage(7, 3, 10)),
        ({"text": "completion"}, "completion", None, None),
        ({"choices": [{"text": "legacy"}]}, "legacy", None, None),
    ],
    ids=["str", "openai-dict", "openai-object", "anthropic", "langchain", "dict", "legacy"],
)
def test_generation_shapes(value: Any, text: str, model: str | None, usage: Usage | None) -> None:
    assert read_generation_text(value) == text
    assert read_model(value) == model
    assert read_usage(value) == usage


def test_stream_chunks() -> None:
    assert read_chunk_text("abc") == "abc"
    assert read_chunk_text({"choices": [{"delta": {"content": "de"}}]}) == "de"
    assert read_chunk_text({"choices": [{"delta": {"role": "assistant"}}]}) is None
    assert read_chunk_text(Obj(choices=[Obj(delta=Obj(content="obj"))])) == "obj"
    assert read_chunk_text(Obj(type="content_block_delta", delta=Obj(text="anth"))) == "anth"
    assert read_chunk_text(Obj(content="lc chunk")) == "lc chunk"


def test_streamed_openai_chunks_accumulate_with_usage(traced: Traced) -> None:
    chunks = [
        {"model": "gpt-x", "choices": [{"delta": {"role": "assistant"}}]},
        {"model": "gpt-x", "choices": [{"delta": {"content": "Hel"}}]},
        {"model": "gpt-x", "choices": [{"delta": {"content": "lo"}}]},
        {"model": "gpt-x", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
    ]

    @recalltrace.generation
    def stream(prompt: str) -> Any:
        yield from chunks

    @recalltrace.rag
    def answer(question: str) -> Any:
        for chunk in stream(question):
            choices = chunk["choices"]
            if choices and "content" in choices[0]["delta"]:
                yield choices[0]["delta"]["content"]

    assert "".join(answer("q")) == "Hello"
    record = traced.record()
    assert record.response == "Hello"
    assert record.metadata["llm"] == [
        {"model": "gpt-x", "prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    ]
    attributes = traced.span("stream").attributes
    assert attributes["output.value"] == "Hello"
    assert attributes["llm.token_count.total"] == 6


def test_answers() -> None:
    assert read_answer("a") == "a"
    assert read_answer({"answer": "x", "sources": []}) == "x"
    assert read_answer(LlamaResponse("llama answer", [])) == "llama answer"
    assert read_answer(OPENAI_DICT) is None  # a dict without an answer key
    assert read_answer(OPENAI_OBJECT) == "Hi there"
    assert read_answer(42) is None


def test_response_falls_back_to_the_last_generation(traced: Traced) -> None:
    @recalltrace.generation
    def generate(prompt: str) -> dict[str, Any]:
        return OPENAI_DICT

    @recalltrace.rag
    def answer(question: str) -> int:
        generate(question)
        return 200

    assert answer("q") == 200
    assert traced.record().response == "Hello"


def test_response_extractor(traced: Traced) -> None:
    @recalltrace.rag(response_extractor=lambda result: result[1])
    def answer(question: str) -> tuple[int, str]:
        return (200, "the answer")

    answer("q")
    assert traced.record().response == "the answer"


def test_elasticsearch_hits_are_read_with_id_score_and_source() -> None:
    from recalltrace.tracer._extract import document_list, read_document

    response = {
        "took": 3,
        "hits": {
            "total": {"value": 2},
            "hits": [
                {
                    "_index": "kb",
                    "_id": "kb-12",
                    "_score": 7.5,
                    "_source": {"title": "Passwords", "body": "Reset it from Settings.", "v": 2},
                },
                {"_index": "kb", "_id": "kb-7", "_score": 3.0, "_source": {"summary": "Expiry"}},
            ],
        },
    }
    docs = [read_document(hit) for hit in document_list(response) or []]
    assert [(d.id, d.score) for d in docs] == [("kb-12", 7.5), ("kb-7", 3.0)]
    assert docs[0].content == "Reset it from Settings."
    assert docs[0].metadata == {"title": "Passwords", "v": 2, "_index": "kb"}
    assert docs[1].content == "Expiry"  # no conventional text field: its string fields


def test_documents_of_an_unknown_shape_are_noted_on_the_record() -> None:
    from tests.support.tracer_helpers import make_traced

    traced = make_traced()

    @recalltrace.retrieval
    def search(query: str) -> list[dict[str, object]]:
        return [{"weird": 1}, {"content": "fine", "id": "a"}, {"other": 2}]

    @recalltrace.rag
    def answer(question: str) -> str:
        search(question)
        return "ok"

    try:
        answer("q")
        record = traced.record()
        assert any(
            note.startswith("2 retrieved document(s) had neither text nor an id (positions 0, 2)")
            for note in record.notes
        ), record.notes
    finally:
        recalltrace.shutdown(2)


# -- JSON written directly -------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [
        {},
        {"source": 'handbook/é"quoted"\n\u2028\x00', "page": 3, "ratio": 0.1},
        {"yes": True, "no": False, "none": None, "big": 10**30, "tiny": -1.5e-300},
        {"emoji": "\U0001f600", "tab": "\t", "slash": "a/b\\c"},
    ],
)
def test_metadata_json_writes_what_the_encoder_writes(metadata: dict[str, Any]) -> None:
    assert flat_json(metadata) == json.dumps(metadata, ensure_ascii=False)
    assert metadata_json(metadata) == json.dumps(metadata, ensure_ascii=False)


@pytest.mark.parametrize(
    "metadata",
    [{"nan": float("nan")}, {"inf": float("inf")}, {"nested": {"a": 1}}, {"list": [1]}, {1: "a"}],
)
def test_metadata_json_leaves_other_shapes_to_the_encoder(metadata: dict[Any, Any]) -> None:
    assert flat_json(metadata) is None
    assert metadata_json(metadata) == json.dumps(metadata, ensure_ascii=False, default=str)
