"""Records assembled by the storage process: the same records the writer thread assembles, for
every shape a request can take; values that cannot travel exactly stay with the writer thread;
the tracer's options reach the child; a record the child cannot assemble is counted; the child
runs at the CPU priority asked for."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Engine, text

import recalltrace
from recalltrace._storage_process import StorageProcessSink, decode_batch, encode_batch
from recalltrace.storage.records import ReferenceUpdate, TraceRecord, WriteResult
from recalltrace.tracer import ScrubbingOptions, _runtime
from recalltrace.tracer._plain import AssemblyOptions, PlainTrace, assemble_plain
from recalltrace.tracer._scrub import build_scrubber
from recalltrace.tracer._state import TraceState, assemble_record
from tests.integration.test_storage_process import storage_children
from tests.support.tracer_helpers import Passage

SECRET = "AKIAIOSFODNN7EXAMPLE"  # an AWS access key id of the documentation's kind


class _Printable:
    """An application object in metadata: read (printed) on the writer thread."""

    def __str__(self) -> str:
        return "printable object"


class _Unprintable:
    """An application object whose printing raises: left out, with a note."""

    def __str__(self) -> str:
        raise RuntimeError("no text")


class _Label(str):
    """A ``str`` subclass: not exactly plain."""


class _Score(float):
    """A ``float`` subclass, as a NumPy number is."""


def _docs(count: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "id": f"kb-{i}",
            "content": f"document {i} " + "lorem ipsum " * 20,
            "score": 1.0 - i / 100,
            "metadata": {"source": f"s{i}.md", **extra},
        }
        for i in range(count)
    ]


def _ask(retrieve: Callable[[str], Any], generate: Callable[[str], Any] | None = None) -> Any:
    """A request: ``@rag`` around a retrieval returning ``retrieve(question)``."""

    @recalltrace.retrieval
    def search(query: str) -> Any:
        return retrieve(query)

    @recalltrace.generation
    def llm(prompt: str) -> Any:
        assert generate is not None
        return generate(prompt)

    def run(question: Any) -> Any:
        search(question)
        return llm(question) if generate is not None else "an answer"

    return run


@dataclass
class Shape:
    name: str
    run: Callable[[], Any]
    travels: bool = True
    """Whether its values are all exactly plain (else the writer thread assembles it)."""


def _plain_request() -> None:
    recalltrace.rag("shapes")(_ask(lambda q: _docs(10)))("what is plain?")


def _odd_numbers() -> None:
    def retrieve(query: str) -> list[dict[str, Any]]:
        docs = _docs(3, ratio=math.nan, nested={"deep": [1, 2.5, {"inf": math.inf}]})
        docs[0]["score"] = math.nan
        docs[1]["score"] = -math.inf
        return docs

    recalltrace.rag("shapes")(_ask(retrieve))("which numbers?")


def _long_texts() -> None:
    long = "a long sentence about recall. " * 20
    recalltrace.rag("shapes", reference_param="truth", reference_contexts_param="gold")(
        lambda question, truth, gold: _ask(lambda q: [long, long[:10]])(question)
    )(long, long, [long, "short"])


def _unreadable_documents() -> None:
    # One raises on the span, one past what the span holds (read on the writer thread).
    def retrieve(query: str) -> list[Any]:
        passages = [Passage(i, 5) for i in range(100)]
        passages[60] = Passage(60, 60)
        return passages

    recalltrace.rag("shapes")(_ask(retrieve))("which documents?")


def _blank_and_textless() -> None:
    recalltrace.rag("shapes")(_ask(lambda q: [{"id": "only-id"}, {"score": 0.3}, "text"]))("?")


def _streamed_with_usage() -> None:
    @recalltrace.rag("shapes")
    def stream(question: str) -> Iterator[str]:
        _ask(
            lambda q: _docs(2),
            lambda p: {
                "choices": [{"message": {"content": "generated"}}],
                "model": "gpt-x",
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            },
        )(question)
        yield "part one, "
        yield "part two"

    assert "".join(stream("stream it")) == "part one, part two"


def _attributes_and_references() -> None:
    @recalltrace.rag("shapes", metadata={"team": "search", "limits": {"k": 5}}, tags=["beta"])
    def answer(question: str) -> str:
        recalltrace.set_attributes(
            user_id=4242,
            session_id="s-1",
            tags=["eu", 7, _Unprintable()],
            release="2.4.1",
            environment="staging",
            metadata={"object": _Printable(), "list": [1, "two", None]},
        )
        recalltrace.set_reference(
            None,
            reference=f"the key is {SECRET}",
            reference_contexts=["gold context", f"mail ann@example.org, key {SECRET}"],
            reference_context_ids=["kb-1", 2, _Printable()],
        )
        return _ask(lambda q: _docs(4))(question)

    answer(f"is {SECRET} a secret? write to ann@example.org")


def _failed_request() -> None:
    @recalltrace.rag("shapes")
    def answer(question: str) -> str:
        _ask(lambda q: _docs(2))(question)
        raise ValueError("the model timed out")

    with pytest.raises(ValueError):
        answer("will it fail?")


def _structured_question() -> None:
    recalltrace.rag("shapes", input_param="body")(lambda body: _ask(lambda q: _docs(1))("x"))(
        {"question": "structured", "filters": ["a", 1, None]}
    )


def _str_subclass_question() -> None:
    recalltrace.rag("shapes")(_ask(lambda q: _docs(2)))(_Label("a labelled question"))


def _float_subclass_score() -> None:
    def retrieve(query: str) -> list[dict[str, Any]]:
        docs = _docs(2)
        docs[0]["score"] = _Score(0.75)
        return docs

    recalltrace.rag("shapes")(_ask(retrieve))("numpy-like scores?")


def _numpy_numbers() -> None:
    import numpy

    def retrieve(query: str) -> list[dict[str, Any]]:
        docs = _docs(2)
        docs[0]["score"] = numpy.float32(0.5)
        docs[1]["metadata"]["distance"] = numpy.float64(0.25)
        return docs

    recalltrace.rag("shapes")(_ask(retrieve))("numpy numbers?")


SHAPES = [
    Shape("plain", _plain_request),
    Shape("nan-and-infinity", _odd_numbers),
    Shape("texts-cut", _long_texts),
    Shape("unreadable-documents", _unreadable_documents),
    Shape("blank-and-textless-documents", _blank_and_textless),
    Shape("streamed-with-usage", _streamed_with_usage),
    Shape("attributes-and-references", _attributes_and_references),
    Shape("failed-request", _failed_request),
    Shape("structured-question", _structured_question),
    Shape("str-subclass-question", _str_subclass_question, travels=False),
    Shape("float-subclass-score", _float_subclass_score, travels=False),
    # marshal would write a NumPy number as its bytes: it never reaches the pipe
    Shape("numpy-numbers", _numpy_numbers, travels=False),
]


class _KeepingSink:
    """Keeps what the writer hands it (records, or plain traces)."""

    def __init__(self) -> None:
        self.written: list[Any] = []

    def write_traces(self, records: list[Any]) -> None:
        self.written.extend(records)

    def attach_reference(self, update: Any) -> int:
        raise LookupError(update.trace_id)


OPTIONS = AssemblyOptions(200, "1.0.0", "prod")


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[TraceState, Any]]]:
    """The writer hands plain traces over as it does to a storage process (with the options
    ``configure`` gives one; the test of those options is below), to a sink that keeps them;
    each state is kept beside what the writer made of it. Every request is stored, so the
    tracer's ledger stays balanced."""
    recalltrace.configure(
        sink=_KeepingSink(),
        tracer_provider=TracerProvider(),
        max_text_length=OPTIONS.max_text_length,
        release=OPTIONS.release,
        environment=OPTIONS.environment,
        flush_interval=0.05,
    )
    pipeline = _runtime.get().pipeline
    monkeypatch.setattr(pipeline, "remote_assembly", True)
    monkeypatch.setattr(pipeline, "assembly", OPTIONS)
    pairs: list[tuple[TraceState, Any]] = []
    prepare = pipeline.prepare

    def keep(state: TraceState) -> Any:
        handed = prepare(state)
        pairs.append((state, handed))
        return handed

    monkeypatch.setattr(pipeline, "prepare", keep)
    yield pairs
    recalltrace.shutdown(10)


def _holds_bytes(value: Any) -> bool:
    if isinstance(value, (bytes, bytearray)):
        return True
    if isinstance(value, dict):
        return any(_holds_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_bytes(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        return any(_holds_bytes(getattr(value, name)) for name in value.__dataclass_fields__)
    return False


@pytest.mark.parametrize("shape", SHAPES, ids=[shape.name for shape in SHAPES])
def test_the_storage_process_assembles_the_record_the_writer_thread_would(
    captured: list[tuple[TraceState, Any]], shape: Shape
) -> None:
    """For every shape of request, the record assembled from the plain values (after their trip
    through the pipe's encoding) equals the record the writer thread assembles from the state;
    a state holding a value that is not exactly plain is assembled by the writer thread."""
    shape.run()
    assert recalltrace.flush(30)
    ((state, handed),) = captured
    if not shape.travels:
        assert isinstance(handed, TraceRecord)
        assert not _holds_bytes(handed)
        return
    assert isinstance(handed, PlainTrace)
    assert handed.trace_id == state.hex_id() and handed.app_name == "shapes"
    # Late ground truth merged while it waits for the child, as into the state.
    update = ReferenceUpdate(trace_id=handed.trace_id, reference_contexts=["late context"])
    handed.merge_reference(update)
    state.merge_reference(update)

    expected = assemble_record(
        state,
        build_scrubber(ScrubbingOptions()),
        OPTIONS.max_text_length,
        release=OPTIONS.release,
        environment=OPTIONS.environment,
    )
    (crossed,) = decode_batch(encode_batch([handed]))
    assert isinstance(crossed, PlainTrace)
    record = assemble_plain(crossed.values, build_scrubber(ScrubbingOptions()), OPTIONS)
    assert record == expected
    assert record.reference_contexts == ["late context"]
    assert SECRET not in repr(record)


def test_what_the_shapes_hold_is_kept(captured: list[tuple[TraceState, Any]]) -> None:
    """The equality above compares real content: the shapes' records hold what they were
    given (cuts, notes, scrubbed secrets, usage, the streamed answer)."""
    for shape in SHAPES:
        shape.run()
    assert recalltrace.flush(30)
    records = {}
    for shape, (_state, handed) in zip(SHAPES, captured, strict=True):
        if isinstance(handed, PlainTrace):
            handed = assemble_plain(handed.values, build_scrubber(ScrubbingOptions()), OPTIONS)
        records[shape.name] = handed
    cut = records["texts-cut"]
    assert cut.user_input is not None and len(cut.user_input) == 200
    assert any("truncated user_input" in note for note in cut.notes)
    unreadable = records["unreadable-documents"]
    assert [c.content for c in unreadable.retrieved_contexts].count("") == 2
    assert any("could not be read" in note for note in unreadable.notes)
    streamed = records["streamed-with-usage"]
    assert streamed.response == "part one, part two"
    assert streamed.metadata["llm"][0]["total_tokens"] == 18
    attributes = records["attributes-and-references"]
    assert (attributes.user_id, attributes.release, attributes.environment) == (
        "4242",
        "2.4.1",
        "staging",
    )
    assert attributes.metadata["object"] == "printable object"
    assert attributes.tags == ["beta", "eu", "7"]
    assert any("tags[2]" in note for note in attributes.notes), attributes.notes
    assert attributes.reference is not None and SECRET not in attributes.reference
    assert records["plain"].release == "1.0.0"
    assert records["failed-request"].error is True
    odd = records["nan-and-infinity"]
    assert odd.retrieved_contexts[0].score is None
    assert any("NaN or infinite" in note for note in odd.notes)


def test_the_tracers_options_reach_the_storage_process(
    postgres_url: str, pg_engine: Engine
) -> None:
    """Stored through the child: texts cut at ``max_text_length`` (noted), the configured
    release and environment, secrets scrubbed, every document in order."""
    recalltrace.configure(
        database_url=postgres_url,
        storage_process=True,
        tracer_provider=TracerProvider(),
        flush_interval=0.05,
        max_text_length=40,
        release="9.9.9",
        environment="canary",
    )
    try:
        pipeline = _runtime.get().pipeline
        assert pipeline.remote_assembly
        assert pipeline.assembly == AssemblyOptions(40, "9.9.9", "canary")
        assert pipeline.place("assemble") == pipeline.place("scrub") == "storage process"
        recalltrace.rag("assembled-in-child")(_ask(lambda q: _docs(12)))(
            f"my key is {SECRET} and this question goes on and on"
        )
        assert recalltrace.flush(60)
        (child,) = storage_children(os.getpid())
    finally:
        recalltrace.shutdown(10)
    assert child
    with pg_engine.connect() as conn:
        trace = conn.execute(
            text(
                "SELECT trace_id, user_input, notes, release, environment FROM traces "
                "WHERE app_name = 'assembled-in-child'"
            )
        ).one()
        contexts = conn.execute(
            text(
                "SELECT content, context_id FROM retrieved_contexts WHERE trace_id = :t "
                "ORDER BY position"
            ),
            {"t": trace[0]},
        ).all()
    assert SECRET not in trace[1] and len(trace[1]) <= 40
    assert any("truncated user_input" in note for note in trace[2])
    assert (trace[3], trace[4]) == ("9.9.9", "canary")
    assert [row[1] for row in contexts] == [f"kb-{i}" for i in range(12)]
    assert all(len(row[0]) == 40 for row in contexts)


def test_a_trace_the_child_cannot_assemble_is_counted_and_the_rest_stored(
    tmp_path: Path,
) -> None:
    """The child names what it could not assemble (and logs why); the writer counts those as
    dropped (``assembly_error``) and the rest of the batch as stored."""
    url = f"sqlite:///{tmp_path / 'child.db'}"
    sink = StorageProcessSink(url, assembly=AssemblyOptions(None, None, None))
    good = _plain_trace(1)
    broken = PlainTrace("f" * 32, "shapes", [int("f" * 32, 16), "too", "few", "values"])
    try:
        assert sink.write_traces([good, broken]) == WriteResult(stored=1, unassembled=("f" * 32,))
    finally:
        sink.dispose()

    stored: list[list[str]] = []

    class NamingSink:
        def write_traces(self, records: list[Any]) -> WriteResult:
            stored.append([r.trace_id for r in records if r.trace_id != "f" * 32])
            return WriteResult(stored=len(stored[-1]), unassembled=("f" * 32,))

        def attach_reference(self, update: Any) -> int:
            return 0

    recalltrace.configure(sink=NamingSink(), tracer_provider=TracerProvider())
    pipeline = _runtime.get().pipeline
    prepare = pipeline.prepare
    pipeline.prepare = lambda state: (  # type: ignore[method-assign]
        broken if state.app_name == "broken" else prepare(state)
    )
    before = recalltrace.ledger()
    recalltrace.rag("broken")(lambda q: "x")("q")
    recalltrace.rag("fine")(lambda q: "x")("q")
    assert recalltrace.flush(30)
    after = recalltrace.ledger()
    recalltrace.shutdown(10)
    assert after.stored - before.stored == 1
    assert after.dropped.get("assembly_error", 0) - before.dropped.get("assembly_error", 0) == 1
    assert after.seen - before.seen == 2 and after.pending == 0
    assert sum(len(batch) for batch in stored) == 1


def _plain_trace(number: int) -> PlainTrace:
    values = [
        number, 0, 0, "shapes", "svc", 1_700_000_000 * 10**9, 1.5, False, "question", "answer",
        [("text", "kb-1", 0.5, {})], [], None, None, None, {}, [], None, None, None, None, [],
    ]  # fmt: skip
    return PlainTrace(format(number, "032x"), "shapes", values)


def _nice_of(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])


@pytest.mark.parametrize("nice", [None, 10, 19])
def test_the_storage_process_runs_at_the_priority_asked_for(
    tmp_path: Path, nice: int | None
) -> None:
    """By default the application's own; ``storage_process_nice`` lowers it by that much."""
    options: dict[str, Any] = {} if nice is None else {"storage_process_nice": nice}
    recalltrace.configure(
        database_url=f"sqlite:///{tmp_path / 'nice.db'}",
        storage_process=True,
        tracer_provider=TracerProvider(),
        **options,
    )
    try:
        recalltrace.rag("nice")(lambda q: "x")("q")
        assert recalltrace.flush(60)
        (child,) = storage_children(os.getpid())
        assert _nice_of(child) == min(19, _nice_of(os.getpid()) + (nice or 0))
    finally:
        recalltrace.shutdown(10)


def test_an_impossible_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="storage_process_nice must be between 0 and 19"):
        recalltrace.configure(storage_process=True, storage_process_nice=25)
