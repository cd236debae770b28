"""Turning the spans of one RAG request into the parts of a trace record.

Shared by the in-process span processor (:mod:`._capture`) and ``recalltrace collect`` (OTLP):
both hand finished spans here as :class:`SpanView` objects. The rules (written down in
``docs/ingest.md``):

- **Boundary.** A request is the outermost *boundary* span of a subtree: an OpenInference
  ``CHAIN``/``AGENT`` span, a GenAI ``invoke_agent``/``invoke_workflow`` operation, or an
  OpenLLMetry ``workflow``/``agent`` span. Boundary spans nested in it are steps of it.
- **Contexts.** Documents come from retrieval spans (OpenInference ``RETRIEVER``, GenAI
  ``retrieval``, OpenLLMetry ``vector_db_retrieve`` and vector-database spans with
  ``db.query.result`` events), outermost first: a retrieval nested in one that gave documents
  is the same call seen twice. When a reranker span gave output documents, the last reranker's
  documents are the contexts (reranked documents over raw retrieval).
- **Answer.** The output of the last generation (outermost ``LLM``/chat spans), else the
  root's output.
- **Question.** The root's input (a JSON input gives its ``question``/``query``/``input``...
  value), else the first retrieval's query.

Nothing here imports OpenTelemetry: spans arrive as plain views.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from recalltrace.tracer._conventions import (
    DB_QUERY_RESULT,
    DB_RESULT_DISTANCE,
    DB_RESULT_DOCUMENT,
    DB_RESULT_ID,
    DB_RESULT_METADATA,
    DB_RESULT_SCORE,
    DB_VECTOR_QUERY_TEXT,
    DEPLOYMENT_ENVIRONMENT,
    DEPLOYMENT_ENVIRONMENT_OLD,
    GEN_AI_AGENT_NAME,
    GEN_AI_COMPLETION,
    GEN_AI_COMPLETION_TOKENS,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_DATA_SOURCE,
    GEN_AI_DOCUMENTS,
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_INPUT_TOKENS,
    GEN_AI_OPERATION,
    GEN_AI_OUTPUT_MESSAGES,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_PROMPT_TOKENS,
    GEN_AI_QUERY_TEXT,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_TOTAL_TOKENS,
    GEN_AI_WORKFLOW_NAME,
    INPUT_MIME_TYPE,
    INPUT_VALUE,
    JSON_MIME_TYPE,
    LLM_COMPLETION_TOKENS,
    LLM_MODEL_NAME,
    LLM_OUTPUT_MESSAGES,
    LLM_PROMPT_TOKENS,
    LLM_REQUEST_TYPE,
    LLM_TOTAL_TOKENS,
    LLM_USAGE_TOTAL_TOKENS,
    MESSAGE_CONTENT,
    OUTPUT_MIME_TYPE,
    OUTPUT_VALUE,
    RERANKER_OUTPUT_DOCUMENTS,
    RETRIEVAL_DOCUMENTS,
    SERVICE_NAME,
    SERVICE_VERSION,
    SESSION_ID,
    SPAN_KIND,
    TAG_TAGS,
    TRACELOOP_INPUT,
    TRACELOOP_KIND,
    TRACELOOP_OUTPUT,
    TRACELOOP_WORKFLOW_NAME,
    USER_ID,
)
from recalltrace.tracer._extract import Doc, Usage, read_document

# Roles of a span in a request.
OTHER, BOUNDARY, RETRIEVER, RERANKER, LLM = 0, 1, 2, 3, 4


_OI_ROLES = {
    "CHAIN": BOUNDARY,
    "AGENT": BOUNDARY,
    "RETRIEVER": RETRIEVER,
    "RERANKER": RERANKER,
    "LLM": LLM,
}
_GEN_AI_ROLES = {
    "invoke_agent": BOUNDARY,
    "invoke_workflow": BOUNDARY,
    "retrieval": RETRIEVER,
    "vector_db_retrieve": RETRIEVER,
    "chat": LLM,
    "text_completion": LLM,
    "generate_content": LLM,
    "completion": LLM,
}
_TRACELOOP_ROLES = {"workflow": BOUNDARY, "agent": BOUNDARY}
_QUESTION_KEYS = ("question", "query", "input", "user_input", "query_str", "q", "prompt", "text")
_ANSWER_KEYS = ("answer", "response", "output", "result", "text", "content", "outputs")


class SpanView:
    """What the record builder reads of a finished span, whatever it came from."""

    __slots__ = (
        "attributes",
        "end",
        "environment",
        "error",
        "events",
        "name",
        "parent_id",
        "release",
        "role",
        "scope",
        "service",
        "span_id",
        "start",
        "trace_id",
    )

    def __init__(
        self,
        name: str,
        trace_id: int,
        span_id: int,
        parent_id: int | None,
        start: int,
        end: int,
        attributes: Mapping[str, Any],
        events: Sequence[tuple[str, Mapping[str, Any]]] = (),
        error: bool = False,
        service: str | None = None,
        scope: str = "",
        release: str | None = None,
        environment: str | None = None,
    ) -> None:
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id or None
        self.start = start
        self.end = end
        self.attributes = attributes
        self.events = events
        self.error = error
        self.service = service
        self.scope = scope
        self.release = release
        """``service.version`` of the span's resource."""
        self.environment = environment
        """``deployment.environment.name`` (or ``deployment.environment``) of its resource."""
        self.role = -1


def resource_labels(attributes: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    """``service.name`` (none for the SDK's ``unknown_service``), ``service.version`` and the
    deployment environment of a resource's attributes."""
    service = attributes.get(SERVICE_NAME)
    if not isinstance(service, str) or not service or service.startswith("unknown_service"):
        service = None
    release = attributes.get(SERVICE_VERSION)
    environment = attributes.get(DEPLOYMENT_ENVIRONMENT)
    if environment is None:
        environment = attributes.get(DEPLOYMENT_ENVIRONMENT_OLD)
    return (
        service,
        release if isinstance(release, str) and release else None,
        environment if isinstance(environment, str) and environment else None,
    )


def role_of(view: SpanView) -> int:
    """:func:`span_role` of a view, computed once."""
    role = view.role
    if role < 0:
        role = view.role = span_role(view.attributes, view.events)
    return role


def span_role(attributes: Mapping[str, Any], events: Sequence[tuple[str, Any]] = ()) -> int:
    """The role of a span from its attributes: OpenInference's kind first, then the GenAI
    operation, then OpenLLMetry's kind; a vector-database span with result events retrieves."""
    kind = attributes.get(SPAN_KIND)
    if isinstance(kind, str):
        return _OI_ROLES.get(kind.upper(), OTHER)
    operation = attributes.get(GEN_AI_OPERATION)
    if isinstance(operation, str) and operation in _GEN_AI_ROLES:
        return _GEN_AI_ROLES[operation]
    traceloop = attributes.get(TRACELOOP_KIND)
    if isinstance(traceloop, str) and traceloop in _TRACELOOP_ROLES:
        return _TRACELOOP_ROLES[traceloop]
    request_type = attributes.get(LLM_REQUEST_TYPE)
    if request_type in ("chat", "completion"):
        return LLM
    for name, _ in events:
        if name == DB_QUERY_RESULT:
            return RETRIEVER
    return OTHER


# The conventions a request's root span may follow, the preferred first: when two
# instrumentors of different conventions traced one request, the record is made from the
# spans of the preferred one (OpenInference's carry document ids, scores and token counts as
# attributes of their own; OpenLLMetry's LangChain spans give documents only as serialised
# output).
CONVENTIONS = ("openinference", "genai", "openllmetry")


def convention_of(view: SpanView) -> str:
    """The convention of a span's attributes: ``openinference``, ``genai``, ``openllmetry``
    (read in the order :func:`span_role` reads them), or ``other``."""
    attributes = view.attributes
    if isinstance(attributes.get(SPAN_KIND), str):
        return "openinference"
    if attributes.get(GEN_AI_OPERATION) in _GEN_AI_ROLES:
        return "genai"
    if attributes.get(TRACELOOP_KIND) in _TRACELOOP_ROLES:
        return "openllmetry"
    return "other"


def root_question(root: SpanView) -> str | None:
    """The question a request's root span carries as its input (none when it has none)."""
    return _text_input(root.attributes)


def app_name_of(root: SpanView) -> str:
    """The record's app name: the workflow or agent name the spans give, else the root's name."""
    attributes = root.attributes
    for key in (TRACELOOP_WORKFLOW_NAME, GEN_AI_AGENT_NAME, GEN_AI_WORKFLOW_NAME):
        value = attributes.get(key)
        if isinstance(value, str) and value:
            return value
    return root.name


# -- reading values ----------------------------------------------------------------------------


def _json(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return None


def _pick_text(value: Any, keys: Sequence[str], depth: int = 0) -> str | None:
    """A text out of a decoded JSON value: a string itself, the first of ``keys`` holding
    one, the only string value of a mapping, or the last message's text."""
    if isinstance(value, str):
        return value
    if depth > 4:
        return None
    if isinstance(value, Mapping):
        for key in keys:
            found = _pick_text(value.get(key), keys, depth + 1) if key in value else None
            if found:
                return found
        strings = [v for v in value.values() if isinstance(v, str)]
        if len(strings) == 1:
            return strings[0]
        return None
    if isinstance(value, list) and value:
        if all(isinstance(item, Mapping) and "role" in item for item in value):
            return _messages_text(value, None)
        if len(value) == 1:
            return _pick_text(value[0], keys, depth + 1)
    return None


def _parts_text(message: Mapping[str, Any]) -> str | None:
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts = message.get("parts")
    if not isinstance(parts, list):
        parts = content if isinstance(content, list) else None
    if not parts:
        return None
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type", "text") == "text":
            text = part.get("content", part.get("text"))
            if isinstance(text, str):
                texts.append(text)
    return "".join(texts) if texts else None


def _messages_text(messages: Any, role: str | None) -> str | None:
    """The text of the last message (of ``role`` when given) of a GenAI message list."""
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if not isinstance(message, Mapping):
            continue
        if role is not None and message.get("role") not in (role, None):
            continue
        text = _parts_text(message)
        if text:
            return text
    return None


def _indexed(attributes: Mapping[str, Any], prefix: str, suffix: str) -> list[Any]:
    """``prefix.0.suffix``, ``prefix.1.suffix``... while present."""
    values: list[Any] = []
    index = 0
    while True:
        value = attributes.get(f"{prefix}.{index}.{suffix}")
        if value is None:
            return values
        values.append(value)
        index += 1


def _text_input(attributes: Mapping[str, Any]) -> str | None:
    value = attributes.get(INPUT_VALUE)
    if isinstance(value, str):
        decoded = _json(value) if attributes.get(INPUT_MIME_TYPE) == JSON_MIME_TYPE else None
        if decoded is None:
            return value
        return _pick_text(decoded, _QUESTION_KEYS)
    traceloop = _json(attributes.get(TRACELOOP_INPUT))
    if isinstance(traceloop, Mapping):
        return _pick_text(traceloop.get("inputs", traceloop.get("query")), _QUESTION_KEYS)
    messages = _json(attributes.get(GEN_AI_INPUT_MESSAGES))
    if messages is not None:
        return _messages_text(messages, "user")
    query = attributes.get(GEN_AI_QUERY_TEXT)
    return query if isinstance(query, str) else None


def _text_output(attributes: Mapping[str, Any]) -> str | None:
    value = attributes.get(OUTPUT_VALUE)
    if isinstance(value, str):
        decoded = _json(value) if attributes.get(OUTPUT_MIME_TYPE) == JSON_MIME_TYPE else None
        if decoded is None:
            return value
        return _pick_text(decoded, _ANSWER_KEYS)
    traceloop = _json(attributes.get(TRACELOOP_OUTPUT))
    if isinstance(traceloop, Mapping):
        return _pick_text(traceloop.get("outputs"), _ANSWER_KEYS)
    messages = _json(attributes.get(GEN_AI_OUTPUT_MESSAGES))
    if messages is not None:
        return _messages_text(messages, None)
    return None


def _retrieval_query(span: SpanView) -> str | None:
    attributes = span.attributes
    query = attributes.get(GEN_AI_QUERY_TEXT)
    if isinstance(query, str) and query:
        return query
    query = attributes.get(DB_VECTOR_QUERY_TEXT)
    if isinstance(query, str) and query:
        return query
    return _text_input(attributes)


# -- documents ---------------------------------------------------------------------------------


def _metadata(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    decoded = _json(value)
    return dict(decoded) if isinstance(decoded, Mapping) else {}


def _score(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _oi_documents(attributes: Mapping[str, Any], prefix: str) -> list[Doc]:
    docs: list[Doc] = []
    index = 0
    while True:
        base = f"{prefix}.{index}.document."
        content = attributes.get(base + "content")
        doc_id = attributes.get(base + "id")
        if content is None and doc_id is None:
            return docs
        metadata = _metadata(attributes.get(base + "metadata"))
        if doc_id is None and metadata:
            doc_id = read_document({"metadata": metadata}).id
        docs.append(
            Doc(
                content if isinstance(content, str) else "",
                None if doc_id is None or doc_id == "" else str(doc_id),
                _score(attributes.get(base + "score")),
                metadata,
            )
        )
        index += 1


def _decoded_documents(value: Any) -> list[Doc]:
    """Documents from a decoded JSON value: a list, or a mapping holding one."""
    if isinstance(value, Mapping):
        for key in ("documents", "docs", "results", "source_nodes", "nodes"):
            if isinstance(value.get(key), list):
                value = value[key]
                break
        else:
            return []
    if not isinstance(value, list):
        return []
    docs: list[Doc] = []
    for item in value:
        if isinstance(item, Mapping) and isinstance(item.get("kwargs"), Mapping):
            item = item["kwargs"]  # a serialised LangChain Document
        if isinstance(item, (str, Mapping)):
            docs.append(read_document(dict(item) if isinstance(item, Mapping) else item))
    return docs


def _event_documents(events: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Doc]:
    docs: list[Doc] = []
    for name, attributes in events:
        if name != DB_QUERY_RESULT:
            continue
        content = attributes.get(DB_RESULT_DOCUMENT)
        doc_id = attributes.get(DB_RESULT_ID)
        score = _score(attributes.get(DB_RESULT_SCORE))
        metadata = _metadata(attributes.get(DB_RESULT_METADATA))
        if score is None and attributes.get(DB_RESULT_DISTANCE) is not None:
            metadata.setdefault("distance", _score(attributes.get(DB_RESULT_DISTANCE)))
        docs.append(
            Doc(
                content if isinstance(content, str) else "",
                None if doc_id is None or doc_id == "" else str(doc_id),
                score,
                metadata,
            )
        )
    return docs


def span_documents(span: SpanView, role: int) -> list[Doc]:
    """The documents a retrieval or reranker span carries, in rank order."""
    attributes = span.attributes
    if role == RERANKER:
        return _oi_documents(attributes, RERANKER_OUTPUT_DOCUMENTS)
    docs = _oi_documents(attributes, RETRIEVAL_DOCUMENTS)
    if docs:
        if any(doc.id is None for doc in docs):
            # OpenInference's LangChain retriever spans keep the ids only in the output.
            listed = _decoded_documents(_json(attributes.get(OUTPUT_VALUE)))
            if len(listed) == len(docs):
                docs = [
                    doc if doc.id is not None else doc._replace(id=other.id)
                    for doc, other in zip(docs, listed, strict=True)
                ]
        return docs
    value = attributes.get(GEN_AI_DOCUMENTS)
    if value is not None:
        decoded = _json(value) if isinstance(value, str) else None
        if decoded is None and isinstance(value, (list, tuple)):
            decoded = [_json(item) or item for item in value]
        docs = _decoded_documents(decoded)
        if docs:
            return docs
    docs = _event_documents(span.events)
    if docs:
        return docs
    traceloop = _json(attributes.get(TRACELOOP_OUTPUT))
    if traceloop is not None:
        return _decoded_documents(traceloop)
    # A retriever's output listing its documents (OpenInference leaves documents without text
    # out of the document attributes).
    return _decoded_documents(_json(attributes.get(OUTPUT_VALUE)))


# -- generations -------------------------------------------------------------------------------


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _first_int(attributes: Mapping[str, Any], keys: Iterable[str]) -> int | None:
    for key in keys:
        value = _int(attributes.get(key))
        if value is not None:
            return value
    return None


def generation_of(span: SpanView) -> tuple[str | None, str | None, Usage | None]:
    """Text, model and token usage of a model-call span."""
    attributes = span.attributes
    text = None
    contents = _indexed(attributes, LLM_OUTPUT_MESSAGES, MESSAGE_CONTENT)
    if contents:
        text = str(contents[-1])
    if text is None:
        messages = _json(attributes.get(GEN_AI_OUTPUT_MESSAGES))
        if messages is not None:
            text = _messages_text(messages, None)
    if text is None:
        completions = _indexed(attributes, GEN_AI_COMPLETION, "content")
        if completions:
            text = str(completions[-1])
    if text is None:
        value = attributes.get(OUTPUT_VALUE)
        if isinstance(value, str):
            decoded = _json(value)
            text = value if decoded is None else _llm_result_text(decoded)
    model = None
    for key in (LLM_MODEL_NAME, GEN_AI_RESPONSE_MODEL, GEN_AI_REQUEST_MODEL):
        value = attributes.get(key)
        if isinstance(value, str) and value and value != "unknown":
            model = value
            break
    prompt = _first_int(
        attributes,
        (LLM_PROMPT_TOKENS, GEN_AI_INPUT_TOKENS, GEN_AI_PROMPT_TOKENS),
    )
    completion = _first_int(
        attributes,
        (
            LLM_COMPLETION_TOKENS,
            GEN_AI_OUTPUT_TOKENS,
            GEN_AI_COMPLETION_TOKENS,
        ),
    )
    total = _first_int(
        attributes,
        (LLM_TOTAL_TOKENS, GEN_AI_TOTAL_TOKENS, LLM_USAGE_TOTAL_TOKENS),
    )
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion
    usage = (
        None
        if prompt is None and completion is None and total is None
        else Usage(prompt, completion, total)
    )
    return text, model, usage


def _llm_result_text(decoded: Any) -> str | None:
    """The text of a serialised LangChain ``LLMResult`` (or any answer-shaped JSON)."""
    if isinstance(decoded, Mapping) and isinstance(decoded.get("generations"), list):
        try:
            generation = decoded["generations"][-1][-1]
        except (IndexError, TypeError, KeyError):
            return None
        if isinstance(generation, Mapping):
            text = generation.get("text")
            if isinstance(text, str) and text:
                return text
            message = generation.get("message")
            if isinstance(message, Mapping):
                inner = message.get("kwargs", message)
                if isinstance(inner, Mapping) and isinstance(inner.get("content"), str):
                    return str(inner["content"])
        return None
    return _pick_text(decoded, _ANSWER_KEYS)


# -- one request -------------------------------------------------------------------------------


class RequestParts:
    """What the spans of one request give for its record."""

    __slots__ = ("answer", "contexts", "generations", "metadata", "notes", "question")

    def __init__(self) -> None:
        self.question: str | None = None
        self.answer: str | None = None
        self.contexts: list[Doc] = []
        self.generations: list[tuple[str | None, str | None, Usage | None]] = []
        self.notes: list[str] = []
        self.metadata: dict[str, Any] = {}


# Where the request's user, session and tags are found (OpenInference, then GenAI).
_USER_KEYS = (USER_ID,)
_SESSION_KEYS = (SESSION_ID, GEN_AI_CONVERSATION_ID)
_TAG_KEYS = (TAG_TAGS,)


def request_attributes(
    root: SpanView, children: Mapping[int | None, list[SpanView]]
) -> tuple[str | None, str | None, list[str]]:
    """The user id, session id and tags of the request under ``root``: the root's own, else
    the first span (in start order, breadth first) that carries them."""
    user = session = None
    tags: list[str] = []
    queue = [root]
    while queue and (user is None or session is None or not tags):
        span = queue.pop(0)
        attributes = span.attributes
        if user is None:
            user = _first_text(attributes, _USER_KEYS)
        if session is None:
            session = _first_text(attributes, _SESSION_KEYS)
        if not tags:
            for key in _TAG_KEYS:
                value = attributes.get(key)
                if isinstance(value, str):
                    value = _json_list(value)
                if isinstance(value, (list, tuple)):
                    tags = [str(tag) for tag in value if tag is not None and str(tag)]
                    break
        queue.extend(children.get(span.span_id, ()))
    return user, session, tags


def _first_text(attributes: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = attributes.get(key)
        if isinstance(value, (str, int)) and str(value):
            return str(value)
    return None


def _json_list(text: str) -> Any:
    import json

    try:
        value = json.loads(text)
    except ValueError:
        return [text]
    return value if isinstance(value, list) else [text]


def children_index(spans: Iterable[SpanView]) -> dict[int | None, list[SpanView]]:
    """Children of every span id, each list in start order."""
    children: dict[int | None, list[SpanView]] = {}
    for span in spans:
        children.setdefault(span.parent_id, []).append(span)
    for siblings in children.values():
        if len(siblings) > 1:
            siblings.sort(key=lambda s: (s.start, s.end))
    return children


def find_requests(
    top: SpanView, children: Mapping[int | None, list[SpanView]]
) -> tuple[list[SpanView], list[SpanView]]:
    """The request roots under (and including) ``top``: boundary spans with no boundary
    above them; and the retrieval/model spans found outside any request."""
    roots: list[SpanView] = []
    stray: list[SpanView] = []
    stack = [top]
    while stack:
        span = stack.pop()
        role = role_of(span)
        if role == BOUNDARY:
            roots.append(span)
            continue
        if role in (RETRIEVER, RERANKER, LLM):
            stray.append(span)
            continue
        stack.extend(reversed(children.get(span.span_id, ())))
    roots.sort(key=lambda s: s.start)
    return roots, stray


def build_parts(
    root: SpanView,
    children: Mapping[int | None, list[SpanView]],
    skip: frozenset[int] | set[int] = frozenset(),
    root_is_request: bool = True,
) -> RequestParts:
    """Question, contexts, generations and answer of the request rooted at ``root`` (its
    descendants in ``children``), with notes for what the spans lacked. Spans whose ids are
    in ``skip`` (calls a decorator recorded itself) are passed over with their subtrees."""
    parts = RequestParts()
    retrieved: list[tuple[SpanView, list[Doc]]] = []
    reranked: list[tuple[SpanView, list[Doc]]] = []
    first_query: str | None = None
    stack = list(reversed(children.get(root.span_id, ())))
    while stack:
        span = stack.pop()
        if span.span_id in skip:
            continue
        role = role_of(span)
        if role == RETRIEVER:
            docs = span_documents(span, role)
            if first_query is None:
                first_query = _retrieval_query(span)
            source = span.attributes.get(GEN_AI_DATA_SOURCE)
            if isinstance(source, str) and source:
                sources = parts.metadata.setdefault("data_source_ids", [])
                if source not in sources:
                    sources.append(source)
            if docs:
                retrieved.append((span, docs))
                continue  # a retrieval inside it is the same call seen again
        elif role == RERANKER:
            docs = span_documents(span, role)
            if docs:
                reranked.append((span, docs))
                continue
        elif role == LLM:
            parts.generations.append(generation_of(span))
            continue  # an SDK's model span inside a framework's is the same call
        stack.extend(reversed(children.get(span.span_id, ())))
    raw = [doc for _, docs in retrieved for doc in docs]
    if reranked:
        last_span, parts.contexts = max(reranked, key=lambda item: item[0].end)
        parts.metadata["reranked_by"] = last_span.name
        if raw:
            parts.notes.append(
                f"contexts are the {len(parts.contexts)} document(s) of reranker span "
                f"{last_span.name!r}, not the {len(raw)} retrieved before reranking"
            )
    else:
        parts.contexts = raw
    if root_is_request:
        parts.question = _text_input(root.attributes)
        if not parts.question and first_query:
            parts.question = first_query
            parts.notes.append("question taken from the first retrieval's query")
    for text, _, _ in reversed(parts.generations):
        if text:
            parts.answer = text
            break
    if parts.answer is None and root_is_request:
        parts.answer = _text_output(root.attributes)
    _note_missing(parts, retrieved or reranked, root_is_request)
    return parts


def _note_missing(parts: RequestParts, found: Sequence[Any], root_is_request: bool) -> None:
    docs = parts.contexts
    missing: list[str] = []
    if not found:
        if not root_is_request:
            return
        missing.append("retrieved_contexts")
        parts.notes.append(
            "the retrieval spans of this request carry no documents: the variants that read "
            "the retrieved contexts are skipped"
        )
    elif docs:
        without_id = sum(1 for doc in docs if doc.id is None)
        if without_id == len(docs):
            missing.append("retrieved_context_ids")
            parts.notes.append(
                "the retrieval spans carry no document ids: id_based_context_recall is skipped"
            )
        elif without_id:
            parts.notes.append(
                f"{without_id} of {len(docs)} retrieved document(s) carry no id in the spans"
            )
        if not any(doc.content for doc in docs):
            missing.append("retrieved_context_content")
            parts.notes.append(
                "the retrieval spans carry no document content: the variants that read the "
                "retrieved contexts are skipped"
            )
    if root_is_request:
        if not parts.question:
            missing.append("user_input")
            parts.notes.append("no question on the request's root span or its retrievals")
        if not parts.answer:
            missing.append("response")
            parts.notes.append("no answer: no model span output and no output on the root")
    parts.metadata["capture_missing"] = missing
