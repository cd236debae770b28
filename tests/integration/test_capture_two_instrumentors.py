"""A LangChain app instrumented by both OpenInference and OpenLLMetry (common while migrating
from one to the other): each instrumentor makes a trace of its own for every request, and each
request is stored once, from the OpenInference spans; distinct requests running at the same
time, the same question asked twice among them, stay distinct.

The app runs in a process of its own: an instrumentor instruments LangChain once per process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.support import ROOT
from tests.support.capture import QUESTIONS, check_requests, ranked, stored

APP = """
import json, sys, threading
from typing import Any
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.instrumentation.langchain import LangchainInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import recalltrace
from tests.support.capture import ANSWERS, CORPUS, QUESTIONS, ranked

mode, url = sys.argv[1:3]


class KnowledgeBase(BaseRetriever):
    def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> list[Document]:
        return [Document(page_content=CORPUS[i], metadata={"id": i}) for i in ranked(query)]


provider = TracerProvider()
exporter = InMemorySpanExporter()
provider.add_span_processor(SimpleSpanProcessor(exporter))
recalltrace.configure(database_url=url, tracer_provider=provider, capture_spans=True,
                      flush_interval=0.05, handle_signals=False, auto_migrate=False)
LangChainInstrumentor().instrument(tracer_provider=provider)
LangchainInstrumentor().instrument(tracer_provider=provider)
llm = FakeListLLM(responses=[ANSWERS[q] for q in QUESTIONS] * 8)
prompt = PromptTemplate.from_template("Context:\\n{context}\\n\\nQuestion: {question}")
context = KnowledgeBase() | (lambda docs: "\\n".join(d.page_content for d in docs))
chain = {"context": context, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()
if mode == "one-by-one":
    for question in QUESTIONS:
        assert chain.invoke(question) == ANSWERS[question]
else:
    # Each question asked three times at once: six requests in flight together.
    questions = [question for question in QUESTIONS for _ in range(3)]
    start = threading.Barrier(len(questions))
    errors = []

    def ask(question):
        try:
            start.wait(10)
            chain.invoke(question)
        except BaseException as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=ask, args=(q,)) for q in questions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
assert recalltrace.flush(10)
spans = exporter.get_finished_spans()
roots = sorted(s.instrumentation_scope.name for s in spans if s.parent is None)
ledger = recalltrace.ledger()
same = sum(d.get("capture_same_request", 0) for d in (ledger.dropped, ledger.other_dropped))
print(json.dumps({"roots": roots, "same_request": same}))
"""


def run_app(mode: str, url: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", APP, mode, url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


BOTH = ["openinference.instrumentation.langchain", "opentelemetry.instrumentation.langchain"]


@pytest.mark.postgres
def test_each_request_is_stored_once_from_the_openinference_spans(
    postgres_url: str, pg_engine: Engine
) -> None:
    shown = run_app("one-by-one", postgres_url)
    # Both instrumentors traced every request, each in a trace of its own.
    assert shown["roots"] == sorted(BOTH * len(QUESTIONS))
    records = stored(pg_engine)
    check_requests(records, app_name="RunnableSequence")
    assert {r.metadata.get("span_convention") for r in records} == {"openinference"}
    assert shown["same_request"] == len(QUESTIONS)


@pytest.mark.postgres
def test_concurrent_requests_stay_distinct(postgres_url: str, pg_engine: Engine) -> None:
    shown = run_app("at-once", postgres_url)
    assert shown["roots"] == sorted(BOTH * 3 * len(QUESTIONS))
    records = stored(pg_engine)
    assert sorted(r.user_input or "" for r in records) == sorted(
        q for q in QUESTIONS for _ in "abc"
    )
    for record in records:
        assert record.ids == ranked(record.user_input or "")
        assert record.metadata.get("span_convention") == "openinference"
    assert shown["same_request"] == 3 * len(QUESTIONS)
