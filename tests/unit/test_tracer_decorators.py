"""The decorators on every kind of function: values, exceptions, streams, spans and traces."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import logging
import sys
import threading
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

import recalltrace
from tests.support.tracer_helpers import Passage, Traced, make_traced, traced_session


@pytest.fixture
def traced() -> Iterator[Traced]:
    yield from traced_session()


DOCS = [
    {"id": "d1", "content": "Paris is the capital of France.", "score": 0.9},
    {"id": "d2", "content": "Berlin is the capital of Germany.", "score": 0.7},
]


class Boom(Exception):
    pass


# -- every function kind returns what it would without the decorator ----------------------------


def test_sync_functions_bare_and_with_arguments(traced: Traced) -> None:
    @recalltrace.retrieval
    def search(query: str) -> list[dict[str, Any]]:
        return DOCS

    @recalltrace.generation(model="gpt-test")
    def generate(prompt: str) -> str:
        return "Paris."

    @recalltrace.rag("capitals")
    def answer(question: str) -> str:
        search(question)
        return generate(f"Context... {question}")

    assert answer("What is the capital of France?") == "Paris."
    record = traced.record()
    assert record.app_name == "capitals"
    assert record.service_name == "test-service"
    assert record.user_input == "What is the capital of France?"
    assert record.response == "Paris."
    assert [(c.id, c.content, c.score) for c in record.retrieved_contexts] == [
        ("d1", DOCS[0]["content"], 0.9),
        ("d2", DOCS[1]["content"], 0.7),
    ]
    assert record.metadata["llm"] == [
        {
            "model": "gpt-test",
            "prompt_tokens": None,
            "completion_tokens": None,
            "total_tokens": None,
        }
    ]
    assert record.error is False
    assert len(record.trace_id) == 32 and int(record.trace_id, 16) > 0
    assert record.started_at.tzinfo is not None and record.duration_ms >= 0
    root = traced.span("capitals")
    # The record has its own id; the OpenTelemetry ids it ran under are kept for linking.
    assert record.trace_id != format(root.context.trace_id, "032x")
    assert record.otel_trace_id == format(root.context.trace_id, "032x")
    assert record.otel_span_id == format(root.context.span_id, "016x")
    assert traced.span("search").parent.span_id == root.context.span_id
    assert traced.span("generate").parent.span_id == root.context.span_id


def test_returned_object_is_the_same_object(traced: Traced) -> None:
    result = {"answer": "yes", "sources": [1, 2]}

    @recalltrace.rag
    def answer(question: str) -> dict[str, Any]:
        return result

    assert answer("q?") is result
    assert traced.record().response == "yes"


def test_coroutines(traced: Traced) -> None:
    @recalltrace.retrieval
    async def search(query: str) -> list[dict[str, Any]]:
        await asyncio.sleep(0)
        return DOCS

    @recalltrace.generation
    async def generate(prompt: str) -> str:
        await asyncio.sleep(0)
        return "Paris."

    @recalltrace.rag
    async def answer(question: str) -> str:
        await search(question)
        return await generate(question)

    assert asyncio.run(answer("capital?")) == "Paris."
    record = traced.record()
    assert (record.app_name, record.user_input, record.response) == ("answer", "capital?", "Paris.")
    assert [c.id for c in record.retrieved_contexts] == ["d1", "d2"]


def test_generators_stream_and_keep_the_return_value(traced: Traced) -> None:
    @recalltrace.retrieval
    def search(query: str) -> Any:
        yield DOCS[0]
        yield [DOCS[1]]

    @recalltrace.generation
    def generate(prompt: str) -> Any:
        yield "Par"
        yield "is."
        return "finished"

    @recalltrace.rag
    def answer(question: str) -> Any:
        list(search(question))
        result = yield from generate(question)
        assert result == "finished"
        return "done"

    gen = answer("capital?")
    assert list(gen) == ["Par", "is."]
    record = traced.record()
    assert record.response == "Paris."
    assert [c.id for c in record.retrieved_contexts] == ["d1", "d2"]
    assert traced.span("generate").attributes["output.value"] == "Paris."

    stop_value = None

    def drive() -> None:
        nonlocal stop_value
        stop_value = yield from generate("again")

    list(drive())
    assert stop_value == "finished"


def test_generator_send_and_throw_pass_through(traced: Traced) -> None:
    seen: list[Any] = []

    @recalltrace.generation
    def echo(prompt: str) -> Any:
        value = yield "ready"
        while True:
            try:
                value = yield f"got {value}"
            except Boom as exc:
                seen.append(exc)
                value = "recovered"

    gen = echo("p")
    assert next(gen) == "ready"
    assert gen.send(1) == "got 1"
    error = Boom("into the generator")
    assert gen.throw(error) == "got recovered"
    assert seen == [error]
    gen.close()
    span = traced.span("echo")
    assert span.status.status_code is not StatusCode.ERROR
    assert span.attributes["output.value"] == "readygot 1got recovered"


def test_async_generators(traced: Traced) -> None:
    @recalltrace.generation
    async def stream(prompt: str) -> Any:
        for chunk in ("Pa", "ri", "s"):
            await asyncio.sleep(0)
            yield chunk

    @recalltrace.rag
    async def answer(question: str) -> Any:
        async for chunk in stream(question):
            yield chunk

    async def main() -> list[str]:
        return [chunk async for chunk in answer("capital?")]

    assert asyncio.run(main()) == ["Pa", "ri", "s"]
    record = traced.record()
    assert record.response == "Paris"
    assert traced.span("stream").attributes["output.value"] == "Paris"


def test_async_generator_asend_athrow(traced: Traced) -> None:
    @recalltrace.generation
    async def echo(prompt: str) -> Any:
        value = yield "ready"
        while True:
            try:
                value = yield f"got {value}"
            except Boom:
                value = "recovered"

    async def main() -> list[str]:
        gen = echo("p")
        out = [await gen.asend(None), await gen.asend(2), await gen.athrow(Boom())]
        await gen.aclose()
        return out

    assert asyncio.run(main()) == ["ready", "got 2", "got recovered"]
    assert traced.span("echo").attributes["output.value"] == "readygot 2got recovered"


def test_methods_static_and_class_methods(traced: Traced) -> None:
    class Bot:
        prefix = "A:"

        @recalltrace.rag(input_param="question")
        def answer(self, question: str) -> str:
            return f"{self.prefix} {self.search(question)[0]}"

        @recalltrace.retrieval
        @staticmethod
        def search(query: str) -> list[str]:
            return ["doc about " + query]

        @recalltrace.generation
        @classmethod
        def generate(cls, prompt: str) -> str:
            return cls.prefix + prompt

    bot = Bot()
    assert bot.answer("cats") == "A: doc about cats"
    assert Bot.search("dogs") == ["doc about dogs"]
    assert Bot.generate("x") == "A:x"
    assert Bot.answer.__name__ == "answer"
    records = traced.records()
    by_app = {r.app_name: r for r in records}
    assert by_app["answer"].user_input == "cats"
    assert [c.content for c in by_app["answer"].retrieved_contexts] == ["doc about cats"]
    # Called outside any request, the static and class methods are spans, not records.
    assert set(by_app) == {"answer"}
    assert traced.span("generate").attributes["output.value"] == "A:x"


def test_unknown_parameter_name_fails_at_decoration() -> None:
    with pytest.raises(TypeError, match="no parameter named 'query'"):

        @recalltrace.rag(input_param="query")
        def answer(question: str) -> str:
            return question


def test_input_by_parameter_name_default_and_keyword(traced: Traced) -> None:
    @recalltrace.rag(input_param="question", reference_param="expected")
    def answer(user_id: str, question: str = "default question", expected: str | None = None):
        return "ok"

    answer("u1")
    answer("u2", question="by keyword", expected="gold")
    first, second = traced.records()
    assert first.user_input == "default question" and first.reference is None
    assert second.user_input == "by keyword" and second.reference == "gold"


# -- exceptions pass through unchanged ----------------------------------------------------------


def _frames(exc: BaseException) -> list[tuple[str, int | None, str]]:
    return [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]


def test_exception_is_the_same_object_with_the_same_traceback(traced: Traced) -> None:
    error = Boom("no documents")

    def plain(query: str) -> list[str]:
        raise error

    traced_search = recalltrace.retrieval(plain)

    with pytest.raises(Boom) as plain_info:
        plain("q")
    plain_frames = _frames(plain_info.value)
    error.__traceback__ = None

    @recalltrace.rag
    def answer(question: str) -> str:
        traced_search(question)
        return "unreachable"

    with pytest.raises(Boom) as info:
        answer("q")
    assert info.value is error
    assert error.__cause__ is None and error.__context__ is None
    frames = _frames(info.value)
    # The user's frames are unchanged; each decorator adds exactly its wrapper's frame.
    assert frames[-1] == plain_frames[-1]
    assert [name for _, _, name in frames[1:]] == ["wrapper", "answer", "wrapper", "plain"]
    record = traced.record()
    assert record.error is True
    span = traced.span("plain")
    assert span.status.status_code is StatusCode.ERROR
    assert span.events[0].name == "exception"


def test_exceptions_in_every_kind(traced: Traced) -> None:
    error = Boom("x")

    @recalltrace.rag
    async def coroutine(question: str) -> str:
        raise error

    @recalltrace.rag
    def generator(question: str) -> Any:
        yield "partial"
        raise error

    @recalltrace.rag
    async def async_generator(question: str) -> Any:
        yield "partial"
        raise error

    with pytest.raises(Boom) as info:
        asyncio.run(coroutine("q"))
    assert info.value is error

    gen = generator("q")
    assert next(gen) == "partial"
    with pytest.raises(Boom) as info:
        next(gen)
    assert info.value is error

    async def consume() -> None:
        async for _ in async_generator("q"):
            pass

    with pytest.raises(Boom) as info:
        asyncio.run(consume())
    assert info.value is error
    records = traced.records()
    assert [r.error for r in records] == [True, True, True]
    assert [r.response for r in records] == [None, "partial", "partial"]


def test_base_exceptions_pass_and_mark_the_trace(traced: Traced) -> None:
    @recalltrace.rag
    def answer(question: str) -> str:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        answer("q")
    record = traced.record()
    assert record.error is True
    assert record.notes == ["root interrupted by KeyboardInterrupt"]
    assert traced.span("answer").status.status_code is StatusCode.UNSET


def test_cancelled_task_propagates_cancellation(traced: Traced) -> None:
    @recalltrace.rag
    async def answer(question: str) -> str:
        await asyncio.sleep(10)
        return "never"

    async def main() -> None:
        task = asyncio.create_task(answer("q"))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert traced.record().error is True


# -- generators closed early or never finished --------------------------------------------------


def test_generator_closed_early_ends_span_and_records_partial_output(traced: Traced) -> None:
    closed = []

    @recalltrace.generation
    def stream(prompt: str) -> Any:
        try:
            yield "Hel"
            yield "lo"
            yield " world"
        finally:
            closed.append(True)

    @recalltrace.rag
    def answer(question: str) -> Any:
        yield from stream(question)

    gen = answer("q")
    assert next(gen) == "Hel"
    assert next(gen) == "lo"
    gen.close()
    assert closed == [True]
    record = traced.record()
    assert record.response == "Hello"
    assert "stream closed by the caller before its end" in record.notes
    assert record.error is False
    assert traced.span("stream").attributes["output.value"] == "Hello"


def test_abandoned_generator_is_finished_when_collected(traced: Traced) -> None:
    @recalltrace.rag
    def answer(question: str) -> Any:
        yield "a"
        yield "b"

    gen = answer("q")
    next(gen)
    del gen
    gc.collect()
    record = traced.record()
    assert record.response == "a"


def test_generator_never_started_records_nothing(traced: Traced) -> None:
    @recalltrace.rag
    def answer(question: str) -> Any:
        yield "a"

    gen = answer("q")
    del gen
    gc.collect()
    assert traced.records() == []
    assert traced.spans() == []


def test_async_generator_closed_early(traced: Traced) -> None:
    @recalltrace.rag
    async def answer(question: str) -> Any:
        yield "one"
        yield "two"

    async def main() -> str:
        gen = answer("q")
        first = await gen.__anext__()
        await gen.aclose()
        return first

    assert asyncio.run(main()) == "one"
    record = traced.record()
    assert record.response == "one"
    assert "stream closed by the caller before its end" in record.notes


def test_generator_does_not_leak_its_span_into_the_caller(traced: Traced) -> None:
    @recalltrace.rag
    def answer(question: str) -> Any:
        yield "a"
        yield "b"

    gen = answer("q")
    next(gen)
    # Between two steps the caller's context has no open trace.
    assert recalltrace.current_trace_id() is None
    list(gen)
    assert recalltrace.current_trace_id() is None


# -- nested and concurrent traces ---------------------------------------------------------------


def test_nested_rag_is_part_of_the_outer_trace(traced: Traced) -> None:
    @recalltrace.rag
    def inner(question: str) -> str:
        return "inner answer"

    @recalltrace.rag
    def outer(question: str) -> str:
        inner("inner question")
        return "outer answer"

    outer("outer question")
    record = traced.record()
    assert (record.app_name, record.user_input, record.response) == (
        "outer",
        "outer question",
        "outer answer",
    )
    assert traced.span("inner").parent.span_id == traced.span("outer").context.span_id


def test_concurrent_asyncio_tasks_keep_their_traces_apart(traced: Traced) -> None:
    @recalltrace.retrieval
    async def search(query: str) -> list[str]:
        await asyncio.sleep(0.001)
        return [f"doc for {query}"]

    @recalltrace.rag
    async def answer(question: str) -> str:
        trace_id = recalltrace.current_trace_id()
        await search(question)
        await asyncio.sleep(0.001)
        assert recalltrace.current_trace_id() == trace_id
        return f"answer to {question}"

    async def main() -> list[str]:
        return await asyncio.gather(*(answer(f"q{i}") for i in range(20)))

    assert asyncio.run(main()) == [f"answer to q{i}" for i in range(20)]
    records = traced.records()
    assert len(records) == 20
    assert len({r.trace_id for r in records}) == 20
    for record in records:
        question = record.user_input
        assert record.response == f"answer to {question}"
        assert [c.content for c in record.retrieved_contexts] == [f"doc for {question}"]


def test_concurrent_threads_keep_their_traces_apart(traced: Traced) -> None:
    barrier = threading.Barrier(8)

    @recalltrace.retrieval
    def search(query: str) -> list[str]:
        barrier.wait(5)
        return [f"doc for {query}"]

    @recalltrace.rag
    def answer(question: str) -> str:
        search(question)
        return f"answer to {question}"

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(answer, [f"q{i}" for i in range(8)]))
    assert results == [f"answer to q{i}" for i in range(8)]
    records = traced.records()
    assert len({r.trace_id for r in records}) == 8
    for record in records:
        assert [c.content for c in record.retrieved_contexts] == [f"doc for {record.user_input}"]


def test_thread_pool_task_joins_the_trace_when_given_the_context(traced: Traced) -> None:
    @recalltrace.retrieval
    def search(query: str) -> list[str]:
        return [f"doc for {query}"]

    @recalltrace.rag
    def answer(question: str) -> str:
        with ThreadPoolExecutor(2) as pool:
            ctx = contextvars.copy_context()
            joined = pool.submit(ctx.run, search, question + " (joined)")
            detached = pool.submit(search, question + " (detached)")
            joined.result()
            detached.result()
        return "ok"

    answer("q")
    records = {r.app_name: r for r in traced.records()}
    assert [c.content for c in records["answer"].retrieved_contexts] == ["doc for q (joined)"]
    # Without the context the task runs outside the request: a span of its own, no record.
    assert set(records) == {"answer"}
    root = traced.span("answer")
    spans = {s.attributes["input.value"]: s for s in traced.spans("search")}
    assert spans["q (joined)"].context.trace_id == root.context.trace_id
    assert spans["q (detached)"].context.trace_id != root.context.trace_id


def test_parallel_pool_tasks_each_with_a_copied_context(traced: Traced) -> None:
    barrier = threading.Barrier(4)

    @recalltrace.retrieval
    def search(query: str) -> list[str]:
        barrier.wait(5)
        return [f"doc for {query}"]

    @recalltrace.rag
    def answer(question: str) -> str:
        with ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(contextvars.copy_context().run, search, f"{question}-{i}")
                for i in range(4)
            ]
            for future in futures:
                future.result()
        return "ok"

    answer("q")
    record = traced.record()
    assert sorted(c.content for c in record.retrieved_contexts) == [
        f"doc for q-{i}" for i in range(4)
    ]
    root = traced.span("answer")
    assert {s.context.trace_id for s in traced.spans("search")} == {root.context.trace_id}


def test_opentelemetry_context_propagation_joins_the_trace(traced: Traced) -> None:
    from opentelemetry import context as otel_context

    @recalltrace.retrieval
    def search(query: str) -> list[str]:
        return [f"doc for {query}"]

    def worker(ctx: Any, query: str) -> None:
        token = otel_context.attach(ctx)
        try:
            search(query)
        finally:
            otel_context.detach(token)

    @recalltrace.rag
    def answer(question: str) -> str:
        thread = threading.Thread(target=worker, args=(otel_context.get_current(), question))
        thread.start()
        thread.join()
        return "ok"

    answer("q")
    assert [c.content for c in traced.record().retrieved_contexts] == ["doc for q"]


def test_asyncio_to_thread_carries_the_context(traced: Traced) -> None:
    @recalltrace.retrieval
    def search(query: str) -> list[str]:
        return ["doc"]

    @recalltrace.rag
    async def answer(question: str) -> str:
        await asyncio.to_thread(search, question)
        return "ok"

    asyncio.run(answer("q"))
    assert [c.content for c in traced.record().retrieved_contexts] == ["doc"]


def test_current_trace_id_inside_and_outside(traced: Traced) -> None:
    seen = []

    @recalltrace.rag
    def answer(question: str) -> str:
        seen.append(recalltrace.current_trace_id())
        return "ok"

    assert recalltrace.current_trace_id() is None
    answer("q")
    assert seen == [traced.record().trace_id]


# -- spans ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("genai", [False, True], ids=["openinference", "with-genai"])
def test_span_attributes_follow_openinference_and_genai(traced: Traced, genai: bool) -> None:
    """OpenInference's attributes (and ``gen_ai.operation.name``) by default; the GenAI
    conventions' content attributes beside them on request (``genai_span_attributes``)."""
    if genai:
        traced = make_traced(genai_span_attributes=True)

    class Completion:
        def __init__(self) -> None:
            self.model = "gpt-4o-mini-2024"
            self.choices = [{"message": {"content": "Paris."}}]
            self.usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}

    @recalltrace.retrieval
    def search(query: str) -> list[dict[str, Any]]:
        return [{"id": "d1", "content": "Paris...", "score": 0.5, "metadata": {"page": 3}}]

    @recalltrace.generation(model="gpt-4o-mini")
    def generate(prompt: str) -> Completion:
        return Completion()

    @recalltrace.rag
    def answer(question: str) -> str:
        search(question)
        return generate(question).choices[0]["message"]["content"]

    answer("capital?")
    assert dict(traced.span("answer").attributes) == {
        "openinference.span.kind": "CHAIN",
        "input.value": "capital?",
        "output.value": "Paris.",
    }
    search_genai = {
        "gen_ai.retrieval.query.text": "capital?",
        "gen_ai.retrieval.documents": '[{"id": "d1", "score": 0.5}]',
    }
    assert dict(traced.span("search").attributes) == {
        "openinference.span.kind": "RETRIEVER",
        "gen_ai.operation.name": "retrieval",
        "input.value": "capital?",
        "retrieval.documents.0.document.id": "d1",
        "retrieval.documents.0.document.content": "Paris...",
        "retrieval.documents.0.document.score": 0.5,
        "retrieval.documents.0.document.metadata": '{"page": 3}',
        **(search_genai if genai else {}),
    }
    generate_genai = {
        "gen_ai.response.model": "gpt-4o-mini-2024",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 3,
    }
    assert dict(traced.span("generate").attributes) == {
        "openinference.span.kind": "LLM",
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o-mini",
        "llm.model_name": "gpt-4o-mini-2024",
        "input.value": "capital?",
        "output.value": "Paris.",
        "llm.token_count.prompt": 12,
        "llm.token_count.completion": 3,
        "llm.token_count.total": 15,
        **(generate_genai if genai else {}),
    }
    record = traced.record()
    assert record.metadata["llm"] == [
        {
            "model": "gpt-4o-mini-2024",
            "prompt_tokens": 12,
            "completion_tokens": 3,
            "total_tokens": 15,
        }
    ]


def test_chat_prompts_and_data_sources_follow_both_conventions(traced: Traced) -> None:
    traced = make_traced(genai_span_attributes=True)

    @recalltrace.retrieval(data_source="kb-prod")
    def search(query: str) -> list[dict[str, Any]]:
        return [{"content": "no id, no score"}, {"id": 7, "content": "x", "score": 0.25}]

    @recalltrace.generation(prompt_param="messages")
    def generate(messages: list[dict[str, Any]]) -> str:
        return "Paris."

    @recalltrace.rag
    def answer(question: str) -> str:
        search(question)
        return generate(
            [
                {"role": "system", "content": "Answer from the context."},
                {"role": "user", "content": [{"type": "text", "text": question}]},
            ]
        )

    answer("capital?")
    search_span = traced.span("search").attributes
    assert search_span["gen_ai.data_source.id"] == "kb-prod"
    assert json.loads(search_span["gen_ai.retrieval.documents"]) == [
        {},
        {"id": "7", "score": 0.25},
    ]
    span = traced.span("generate").attributes
    assert span["llm.input_messages.0.message.role"] == "system"
    assert span["llm.input_messages.0.message.content"] == "Answer from the context."
    assert span["llm.input_messages.1.message.role"] == "user"
    assert span["llm.input_messages.1.message.content"] == "capital?"
    assert json.loads(span["gen_ai.input.messages"]) == [
        {"role": "system", "parts": [{"type": "text", "content": "Answer from the context."}]},
        {"role": "user", "parts": [{"type": "text", "content": "capital?"}]},
    ]
    assert span["llm.output_messages.0.message.role"] == "assistant"
    assert span["llm.output_messages.0.message.content"] == "Paris."
    assert json.loads(span["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "Paris."}]}
    ]
    assert span["input.mime_type"] == "application/json"
    assert "output.mime_type" not in span  # text: OpenInference's default


def test_chat_prompts_without_genai_attributes_keep_openinference_messages(
    traced: Traced,
) -> None:
    @recalltrace.generation(prompt_param="messages")
    def generate(messages: list[dict[str, Any]]) -> str:
        return "Paris."

    @recalltrace.rag
    def answer(question: str) -> str:
        return generate([{"role": "user", "content": question}])

    answer("capital?")
    span = traced.span("generate").attributes
    assert span["llm.input_messages.0.message.content"] == "capital?"
    assert span["llm.output_messages.0.message.content"] == "Paris."
    assert not [key for key in span if key.startswith("gen_ai.") and key != "gen_ai.operation.name"]


def test_prompts_that_are_not_chat_messages_add_no_messages(traced: Traced) -> None:
    class Message:
        role = "user"
        content = "hi"

    @recalltrace.generation(prompt_param="prompt")
    def generate(prompt: Any) -> str:
        return "ok"

    @recalltrace.rag
    def answer(question: str) -> str:
        generate([{"role": "user", "content": 3}])
        generate([Message()])
        return generate("plain text")

    answer("q")
    for span in traced.spans():
        keys = set(span.attributes)
        assert not any(
            key.startswith(("llm.input_messages", "llm.output_messages")) for key in keys
        )
        assert "gen_ai.input.messages" not in keys and "gen_ai.output.messages" not in keys


def test_chat_messages_are_scrubbed_on_spans() -> None:
    traced = make_traced(
        scrubbing=recalltrace.ScrubbingOptions(scrub_span_attributes=True),
        genai_span_attributes=True,
    )
    try:

        @recalltrace.generation(prompt_param="messages")
        def generate(messages: list[dict[str, Any]]) -> str:
            return "mail ops@example.com"

        @recalltrace.rag
        def answer(question: str) -> str:
            return generate(
                [{"role": "user", "content": "key sk-abcdefghijklmnopqrstuvwxyz123456"}]
            )

        answer("q")
        text = json.dumps(dict(traced.span("generate").attributes))
        assert "abcdefghijklmnopqrstuvwxyz123456" not in text
        assert "ops@example.com" not in text
        assert "gen_ai.output.messages" in text
    finally:
        recalltrace.shutdown(2.0)


def test_non_string_input_is_json(traced: Traced) -> None:
    @recalltrace.rag(input_param="request")
    def answer(request: dict[str, Any]) -> str:
        return "ok"

    answer({"question": "q", "user": 7})
    span = traced.span("answer")
    assert span.attributes["input.value"] == '{"question": "q", "user": 7}'
    assert span.attributes["input.mime_type"] == "application/json"
    assert traced.record().user_input == '{"question": "q", "user": 7}'


def test_disabled_tracer_runs_functions_plainly() -> None:
    from tests.support.tracer_helpers import make_traced

    state = make_traced(enabled=False)
    try:

        @recalltrace.rag
        def answer(question: str) -> str:
            assert recalltrace.current_trace_id() is None
            return "ok"

        @recalltrace.generation
        async def echo(prompt: str) -> Any:
            value = yield "ready"
            while True:
                try:
                    value = yield f"got {value}"
                except Boom:
                    value = "recovered"

        async def drive() -> list[str]:
            gen = echo("p")
            out = [await gen.asend(None), await gen.asend(3), await gen.athrow(Boom())]
            await gen.aclose()
            return out

        assert answer("q") == "ok"
        assert asyncio.run(drive()) == ["ready", "got 3", "got recovered"]
        assert state.spans() == [] and state.records() == []
    finally:
        recalltrace.shutdown(1)


def test_decorating_does_not_touch_opentelemetry_until_called() -> None:
    import subprocess

    code = (
        "import sys, recalltrace\n"
        "@recalltrace.rag\n"
        "def answer(q): return q\n"
        "print(any(m.startswith('opentelemetry') for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_name_positionally_or_by_keyword(traced: Traced) -> None:
    @recalltrace.rag(name="by-keyword")
    def first(question: str) -> str:
        return "a"

    @recalltrace.retrieval("by-position")
    def second(query: str) -> list[str]:
        return []

    first("q")
    second("q")
    assert sorted(s.name for s in traced.spans()) == ["by-keyword", "by-position"]
    with pytest.raises(TypeError, match="given twice"):
        recalltrace.generation("one", name="two")


def test_many_documents_never_push_the_span_kind_and_input_off_the_span(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Past about 30 documents a span used to exceed the SDK's 128-attribute limit, which
    evicts the oldest attributes: the span kind and input.value, with a warning per request."""
    traced = make_traced()  # an SDK provider with the default limits

    @recalltrace.retrieval
    def search(query: str) -> list[dict[str, Any]]:
        return [
            {"id": f"doc-{i}", "content": f"text {i}", "score": 1 / (i + 1), "metadata": {"i": i}}
            for i in range(1000)
        ]

    @recalltrace.rag
    def answer(question: str) -> str:
        search(question)
        return "ok"

    try:
        with caplog.at_level(logging.WARNING):
            answer("which documents?")
        span = traced.span("search")
        attributes = dict(span.attributes or {})
        assert attributes["openinference.span.kind"] == "RETRIEVER"
        assert attributes["input.value"] == "which documents?"
        shown = attributes["recalltrace.retrieval.documents_on_span"]
        assert attributes["recalltrace.retrieval.documents"] == 1000
        assert 20 <= shown < 40
        assert attributes[f"retrieval.documents.{shown - 1}.document.id"] == f"doc-{shown - 1}"
        assert f"retrieval.documents.{shown}.document.id" not in attributes
        assert span.dropped_attributes == 0
        assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]
        record = traced.record()
        assert [c.id for c in record.retrieved_contexts] == [f"doc-{i}" for i in range(1000)]
    finally:
        recalltrace.shutdown(2)


def test_a_decorated_recursive_function_reaches_the_same_depth(traced: Traced) -> None:
    import sys

    reached = {"plain": 0, "decorated": 0}

    def plain(n: int) -> int:
        reached["plain"] = n
        return plain(n + 1)

    @recalltrace.rag
    def decorated(n: int) -> int:
        reached["decorated"] = n
        return decorated(n + 1)

    limit = sys.getrecursionlimit()
    for fn in (plain, decorated):
        with pytest.raises(RecursionError):
            fn(1)
    assert sys.getrecursionlimit() == limit  # given back
    # One wrapper frame per level used to halve the depth (495 against 997).
    assert reached["plain"] - reached["decorated"] <= 10, reached


def test_a_retrieval_outside_any_request_is_a_span_and_no_record(
    traced: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    @recalltrace.retrieval
    def lonely_search(query: str) -> list[str]:
        return ["doc"]

    with caplog.at_level(logging.WARNING, logger="recalltrace"):
        for _ in range(3):
            assert lonely_search("q") == ["doc"]
    assert traced.records() == []
    assert len(traced.spans("lonely_search")) == 3
    said = [r.getMessage() for r in caplog.records if "outside any" in r.getMessage()]
    assert len(said) == 1 and "lonely_search" in said[0]


def test_an_exception_is_recorded_once_on_the_span_it_left_first(traced: Traced) -> None:
    @recalltrace.retrieval
    def search(query: str) -> list[str]:
        raise TimeoutError("vector store timed out")

    @recalltrace.rag
    def answer(question: str) -> str:
        return str(search(question))

    with pytest.raises(TimeoutError):
        answer("q")
    inner, outer = traced.span("search"), traced.span("answer")
    assert [e.name for e in inner.events] == ["exception"]
    assert outer.events == ()  # the same exception, already on the inner span
    assert outer.status.description == "TimeoutError: vector store timed out"
    assert traced.record().error is True


def test_record_ids_differ_across_a_fork_and_ignore_random_seed() -> None:
    import os
    import random

    from recalltrace.tracer import _calls

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what its next request would be stored under
        os.write(write, str(_calls.new_record_id()).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = int(os.read(read, 100))
    os.close(read)
    assert child != _calls.new_record_id()
    random.seed(7)
    first = _calls.new_record_id()
    random.seed(7)
    assert _calls.new_record_id() != first


@pytest.mark.parametrize("bad", [5, 60], ids=["on-the-span", "past-the-span"])
def test_one_unreadable_document_costs_only_itself_and_says_so(traced: Traced, bad: int) -> None:
    """One document that raised when read used to drop every document of the retrieval (on the
    span) or every one past what the span holds (70 of 100), without a note."""

    @recalltrace.retrieval
    def search(query: str) -> list[Passage]:
        return [Passage(i, bad) for i in range(100)]

    @recalltrace.rag
    def answer(question: str) -> str:
        search(question)
        return "ok"

    answer("which documents?")
    record = traced.record()
    contexts = record.retrieved_contexts
    assert len(contexts) == 100
    before, after = contexts[bad - 1], contexts[bad + 1]
    assert (before.content, after.content) == (f"text {bad - 1}", f"text {bad + 1}")
    assert after.id == f"doc-{bad + 1}"
    assert contexts[bad].content == "" and contexts[bad].id is None
    notes = [n for n in record.notes if "could not be read" in n]
    assert len(notes) == 1, record.notes
    assert f"position {bad} (RuntimeError)" in notes[0]
    assert not [n for n in record.notes if "neither text nor an id" in n]


def test_a_request_draws_its_id_without_reading_the_systems_randomness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``os.urandom`` gives up the GIL: with a busy thread beside it, each call waited about
    0.1 ms to get it back, on every request. The id generator reads it once per process (and
    again in a copy of the process), not per request."""
    from recalltrace.tracer import _calls

    _calls.new_record_id()  # this process's generator is seeded
    reads: list[int] = []
    real = _calls.urandom

    def counting(size: int) -> bytes:
        reads.append(size)
        return real(size)

    monkeypatch.setattr(_calls, "urandom", counting)
    ids = {_calls.new_record_id() for _ in range(1000)}
    assert len(ids) == 1000 and reads == []
    # A copy of the process (another pid) reseeds before its first draw.
    monkeypatch.setattr(_calls, "getpid", lambda: -1)
    _calls.new_record_id()
    assert reads == [32]
