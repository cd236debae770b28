"""A FastAPI ``StreamingResponse`` over a decorated generator is one request, one record.

The endpoint returns before the body is produced; the body's chunks come from a decorated
generator Starlette iterates in a thread pool. Before, the request's record was made when the
endpoint returned (no answer), and the generation became a second record of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import recalltrace
from tests.support.tracer_helpers import make_traced

fastapi = pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.responses import StreamingResponse  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402


@recalltrace.retrieval
def search(query: str) -> list[dict[str, str]]:
    return [{"id": "kb-1", "content": "Reset your password from the sign-in page."}]


@recalltrace.generation(model="local")
def generate(question: str) -> Iterator[str]:
    yield from ("Use ", "the ", "sign-in ", "page.")


app = fastapi.FastAPI()


@app.get("/ask")
@recalltrace.rag("help-desk")
def ask(q: str) -> StreamingResponse:
    search(q)
    return StreamingResponse(generate(q), media_type="text/plain")


def test_one_streamed_request_is_one_record_with_its_answer() -> None:
    traced = make_traced()
    try:
        with TestClient(app) as client:
            response = client.get("/ask", params={"q": "How do I reset my password?"})
        assert response.text == "Use the sign-in page."
        (record,) = traced.records()
        assert record.app_name == "help-desk"
        assert record.user_input == "How do I reset my password?"
        assert record.response == "Use the sign-in page."
        assert [c.id for c in record.retrieved_contexts] == ["kb-1"]
        spans = {span.name: span for span in traced.spans()}
        assert spans["generate"].parent.span_id == spans["help-desk"].context.span_id
    finally:
        recalltrace.shutdown(2)
