"""The three kinds of decorated call (a request, a retrieval, a generation) as objects, and how
each one finishes: what it reads from a returned value or from the items a generator yields, and
what it puts on its span and in the trace record.

Everything here runs on the request path: a retrieval's span takes only the documents that fit
(the rest are read on the writer thread), and nothing runs application code but the extractors
the application passed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from recalltrace.tracer._conventions import (
    DOCUMENTS_ON_SPAN,
    DOCUMENTS_TOTAL,
    FIRST_OUTPUT_MESSAGE_CONTENT,
    FIRST_OUTPUT_MESSAGE_ROLE,
    GEN_AI_DOCUMENTS,
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_INPUT_TOKENS,
    GEN_AI_OUTPUT_MESSAGES,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_QUERY_TEXT,
    GEN_AI_RESPONSE_MODEL,
    LLM_COMPLETION_TOKENS,
    LLM_INPUT_MESSAGES,
    LLM_MODEL_NAME,
    LLM_PROMPT_TOKENS,
    LLM_TOTAL_TOKENS,
    MESSAGE_CONTENT,
    MESSAGE_ROLE,
    OUTPUT_VALUE,
    RETRIEVAL_DOCUMENTS,
)
from recalltrace.tracer._extract import (
    Doc,
    Usage,
    document_list,
    flat_json,
    metadata_json,
    quote_json,
    read_answer,
    read_chunk_text,
    read_document,
    read_generation_text,
    read_model,
    read_usage,
    snapshot_documents,
    to_text,
    unreadable,
)
from recalltrace.tracer._internal import user_code_error

if TYPE_CHECKING:
    from recalltrace.tracer._calls import Call, Spec

# At most this many messages of a chat prompt are put on a generation span, flattened as
# OpenInference's llm.input_messages.N.message.{role,content} and in gen_ai.input.messages
# (input.value keeps the whole prompt).
MAX_SPAN_MESSAGES = 32

# Attributes kept free on a retrieval span for what is set after the documents (an output, the
# two counts above, an error status's exception attributes).
_ATTRIBUTE_RESERVE = 8
# Set with the documents besides their own attributes: the two counts and the GenAI list.
_WITH_DOCUMENTS = 3

_DOC_KEY_CACHE = 256


def _doc_keys(index: int) -> tuple[str, str, str, str]:
    prefix = f"{RETRIEVAL_DOCUMENTS}.{index}.document."
    return (prefix + "id", prefix + "content", prefix + "score", prefix + "metadata")


_DOC_KEYS = [_doc_keys(i) for i in range(_DOC_KEY_CACHE)]


# -- documents --------------------------------------------------------------------------------


def _docs_of(spec: Spec, result: Any) -> tuple[list[Doc], int]:
    """Every document of ``result``, read, and how many there are."""
    docs, _rest, total = _split_docs(spec, result, None)
    return docs, total


def _split_docs(
    spec: Spec, result: Any, room: int | None, keep_rest: bool = True
) -> tuple[list[Doc], list[Any], int]:
    """The leading documents that fit in ``room`` span attributes, read (all of them when
    ``room`` is None); the rest as the retriever gave them (a shallow copy of its list, read
    later; empty unless ``keep_rest``); and the total."""
    try:
        if spec.extractor is not None:
            items = list(spec.extractor(result) or ())
        else:
            items = document_list(result) or []
        if room is None:
            return _read_rest(spec, items), [], len(items)
        docs: list[Doc] = []
        for item in items:
            if room <= 0:
                break
            try:
                doc = read_document(item)
            except Exception as exc:
                user_code_error(f"reading a document returned by {spec.qualname}")
                doc = unreadable(exc)
            room -= 1 + (doc.id is not None) + (doc.score is not None) + bool(doc.metadata)
            if room < 0:
                break
            docs.append(doc)
        rest = items[len(docs) :] if keep_rest else []
        return docs, rest, len(items)
    except Exception:
        user_code_error(f"reading the documents returned by {spec.qualname}")
        return [], [], 0


def _read_rest(spec: Spec, items: list[Any]) -> list[Doc]:
    """Every one of ``items`` read; one whose reading raises is an empty stand-in (the record
    notes it) so it costs only itself."""
    docs: list[Doc] = []
    for item in items:
        try:
            docs.append(read_document(item))
        except Exception as exc:
            user_code_error(f"reading a document returned by {spec.qualname}")
            docs.append(unreadable(exc))
    return docs


def _attribute_room(span: Any) -> int | None:
    """How many more attributes the span keeps before the SDK starts evicting the oldest ones
    (the span kind and the input): ``None`` when the provider sets no limit we can read."""
    limit = getattr(getattr(span, "_limits", None), "max_span_attributes", None)
    if not isinstance(limit, int):
        return None
    present = getattr(span, "_attributes", None)
    return limit - (len(present) if present is not None else 0) - _ATTRIBUTE_RESERVE


def _document_attributes(
    call: Call, docs: list[Doc], attributes: dict[str, Any], room: int | None
) -> int:
    """Put the documents on ``attributes`` in rank order while they fit in ``room``; returns
    how many were put (the record keeps every document whatever fits on the span)."""
    scrub = call.runtime.span_scrub
    for index, doc in enumerate(docs):
        if room is not None:
            needed = 1 + (doc.id is not None) + (doc.score is not None) + bool(doc.metadata)
            if needed > room:
                return index
            room -= needed
        keys = _DOC_KEYS[index] if index < _DOC_KEY_CACHE else _doc_keys(index)
        if scrub is None:
            if doc.id is not None:
                attributes[keys[0]] = doc.id
            attributes[keys[1]] = doc.content
            if doc.metadata:
                attributes[keys[3]] = metadata_json(doc.metadata)
        else:
            # Ids, and metadata keys and values (as their JSON text, where a sensitive key's
            # value is redacted whole), carry secrets as content does.
            if doc.id is not None:
                attributes[keys[0]] = scrub(doc.id)
            attributes[keys[1]] = scrub(doc.content)
            if doc.metadata:
                attributes[keys[3]] = scrub(metadata_json(doc.metadata))
        if doc.score is not None:
            attributes[keys[2]] = doc.score
    return len(docs)


def _finish_retrieval(call: Call, result: Any) -> None:
    room = _attribute_room(call.span) if call.recording else None
    if room is not None:
        room -= _WITH_DOCUMENTS
    # A span takes only the documents that fit (at most one per attribute): those are read
    # now. The record needs every document: the rest are kept as a shallow copy of the
    # retriever's list and read on the writer thread, so k documents cost the request path
    # a list copy, not k reads.
    if not call.recording:
        room = 0
    docs, rest, total = _split_docs(call.spec, result, room, keep_rest=call.sampled)
    _finish_documents(call, docs, total, None)
    if call.sampled and rest:
        call.state.contexts.append(_DeferredDocs(call.spec, rest))


class _DeferredDocs:
    """Documents past what a span holds, read when the record is assembled."""

    __slots__ = ("items", "spec")

    def __init__(self, spec: Spec, items: list[Any]) -> None:
        self.spec = spec
        self.items = items

    def read(self) -> list[Doc]:
        return _read_rest(self.spec, self.items)


def _finish_documents(call: Call, docs: list[Doc], total: int, room: int | None) -> None:
    if call.recording and docs:
        attributes: dict[str, Any] = {}
        shown = _document_attributes(call, docs, attributes, room)
        if shown < total:
            attributes[DOCUMENTS_TOTAL] = total
            attributes[DOCUMENTS_ON_SPAN] = shown
        if shown and call.runtime.genai_attributes:
            attributes[GEN_AI_DOCUMENTS] = _genai_documents(docs[:shown], call.runtime.span_scrub)
        call.span.set_attributes(attributes)
    if call.sampled and docs:
        # Their metadata as it is now: the application may reuse its objects right after the
        # call, before the writer runs (a flat dict is one C-level copy).
        call.state.contexts.extend(snapshot_documents(docs))


def _genai_documents(docs: list[Doc], scrub: Any) -> str:
    """The GenAI conventions' ``gen_ai.retrieval.documents``: a JSON list of ``{id, score}``
    in rank order (the content is on the OpenInference attributes beside it), written
    directly (the same text as the JSON encoder's)."""
    entries: list[str] = []
    for doc in docs:
        doc_id, score = doc[1], doc[2]
        if doc_id is None:
            entry = ""
        else:
            entry = '"id": ' + quote_json(doc_id if scrub is None else scrub(doc_id))
        if score is not None:
            number = flat_json({"score": score})
            if number is None:
                return _genai_documents_encoded(docs, scrub)
            entry = number[1:-1] if not entry else entry + ", " + number[1:-1]
        entries.append("{" + entry + "}")
    return "[" + ", ".join(entries) + "]"


def _genai_documents_encoded(docs: list[Doc], scrub: Any) -> str:
    entries: list[dict[str, Any]] = []
    for doc in docs:
        entry: dict[str, Any] = {}
        if doc.id is not None:
            entry["id"] = doc.id if scrub is None else scrub(doc.id)
        if doc.score is not None:
            entry["score"] = doc.score
        entries.append(entry)
    return to_text(entries) or "[]"


# -- generations and answers -------------------------------------------------------------------


def _chat_messages(value: Any) -> list[tuple[str, str]] | None:
    """``value`` as (role, text) pairs when it is a chat prompt of plain dicts (``role`` and a
    string or a list of text parts as ``content``), at most ``MAX_SPAN_MESSAGES`` of them;
    else None. Application objects are not read here (the request path runs no user code)."""
    if type(value) is not list or not value:
        return None
    pairs: list[tuple[str, str]] = []
    for item in value[:MAX_SPAN_MESSAGES]:
        if type(item) is not dict:
            return None
        role, content = item.get("role"), item.get("content")
        if type(role) is not str:
            return None
        if content is None:
            text = ""
        elif type(content) is str:
            text = content
        elif type(content) is list:
            text = "".join(
                part["text"]
                for part in content
                if type(part) is dict and type(part.get("text")) is str
            )
        else:
            return None
        pairs.append((role, text))
    return pairs


def _message_attributes(
    pairs: list[tuple[str, str]], attributes: dict[str, Any], scrub: Any, genai: bool
) -> None:
    """A chat prompt on a generation span: OpenInference's flattened messages and (``genai``)
    the GenAI conventions' ``gen_ai.input.messages``."""
    messages: list[dict[str, Any]] = []
    for index, (role, text) in enumerate(pairs):
        if scrub is not None:
            text = scrub(text)
        prefix = f"{LLM_INPUT_MESSAGES}.{index}."
        attributes[prefix + MESSAGE_ROLE] = role
        attributes[prefix + MESSAGE_CONTENT] = text
        if genai:
            messages.append({"role": role, "parts": [{"type": "text", "content": text}]})
    if genai:
        attributes[GEN_AI_INPUT_MESSAGES] = to_text(messages)


def _finish_generation(
    call: Call, text: str | None, model: str | None, usage: Usage | None
) -> None:
    if call.recording:
        genai = call.runtime.genai_attributes
        attributes: dict[str, Any] = {}
        if text is not None:
            scrub = call.runtime.span_scrub
            output = text if scrub is None else scrub(text)
            # Text output: no ``output.mime_type`` (OpenInference reads a missing one as text).
            attributes[OUTPUT_VALUE] = output
            if call.chat:
                attributes[FIRST_OUTPUT_MESSAGE_ROLE] = "assistant"
                attributes[FIRST_OUTPUT_MESSAGE_CONTENT] = output
                if genai:
                    attributes[GEN_AI_OUTPUT_MESSAGES] = to_text(
                        [{"role": "assistant", "parts": [{"type": "text", "content": output}]}]
                    )
        if model is not None:
            attributes[LLM_MODEL_NAME] = model
            if genai:
                attributes[GEN_AI_RESPONSE_MODEL] = model
        if usage is not None:
            if usage.prompt is not None:
                attributes[LLM_PROMPT_TOKENS] = usage.prompt
                if genai:
                    attributes[GEN_AI_INPUT_TOKENS] = usage.prompt
            if usage.completion is not None:
                attributes[LLM_COMPLETION_TOKENS] = usage.completion
                if genai:
                    attributes[GEN_AI_OUTPUT_TOKENS] = usage.completion
            if usage.total is not None:
                attributes[LLM_TOTAL_TOKENS] = usage.total
        if attributes:
            call.span.set_attributes(attributes)
    if call.sampled:
        spec_model = call.spec.attributes.get(LLM_MODEL_NAME)
        call.state.generations.append((text, model or spec_model, usage))


def _finish_rag(call: Call, answer: str | None) -> None:
    if answer is not None and call.recording:
        scrub = call.runtime.span_scrub
        call.span.set_attribute(OUTPUT_VALUE, answer if scrub is None else scrub(answer))
    if call.outermost and call.sampled and answer is not None:
        call.state.response = answer


def _answer_of(spec: Spec, result: Any) -> str | None:
    if type(result) is str and spec.response_extractor is None:
        return result
    try:
        if spec.response_extractor is not None:
            value = spec.response_extractor(result)
            return None if value is None else to_text(value)
        return read_answer(result)
    except Exception:
        user_code_error(f"reading the response of {spec.qualname}")
        return None


def _generation_of(result: Any) -> tuple[str | None, str | None, Usage | None]:
    if type(result) is str:
        return result, None, None
    try:
        return read_generation_text(result), read_model(result), read_usage(result)
    except Exception:
        user_code_error("reading a generation's return value")
        return None, None, None


# -- the kinds ----------------------------------------------------------------------------------


class Kind(ABC):
    """What differs between the kinds of decorated call; one instance per kind."""

    __slots__ = ()

    label = ""
    """How messages name a call of this kind."""
    root = False
    """Whether a call of this kind opens a request (else it joins the request around it)."""
    foreign: tuple[str, str] = ("", "")
    """The OpenInference span kind and GenAI operation of an instrumentor's span of the same
    call (the decorator then records that call without a second span)."""

    def input_attributes(
        self, value: Any, text: str, attributes: dict[str, Any], runtime: Any
    ) -> None:
        """Add to ``attributes`` what this kind shows of its input ``value`` (read as ``text``)
        besides ``input.value``: nothing, unless the kind says otherwise."""
        return None

    @abstractmethod
    def finish(self, call: Call, result: Any) -> None:
        """Record the value the call returned on its span and its trace state."""

    @abstractmethod
    def read_item(self, call: Call, stream: Stream, item: Any) -> None:
        """Add one item a generator yielded to ``stream``."""

    @abstractmethod
    def finish_stream(self, call: Call, stream: Stream) -> None:
        """Record what a generator yielded, as :meth:`finish` records a returned value."""

    def __repr__(self) -> str:
        return f"<{self.label} kind>"


class _Request(Kind):
    """``@rag``: the request; its answer is the returned value or the streamed text."""

    __slots__ = ()
    label = "rag"
    root = True

    def finish(self, call: Call, result: Any) -> None:
        _finish_rag(call, _answer_of(call.spec, result))

    def read_item(self, call: Call, stream: Stream, item: Any) -> None:
        text = _stream_answer(call.spec, item)
        if text:
            stream.texts.append(text)

    def finish_stream(self, call: Call, stream: Stream) -> None:
        _finish_rag(call, "".join(stream.texts) if stream.texts else None)


class _Retrieval(Kind):
    """``@retrieval``: the documents returned or yielded, in rank order."""

    __slots__ = ()
    label = "retrieval"
    foreign = ("RETRIEVER", "retrieval")

    def input_attributes(
        self, value: Any, text: str, attributes: dict[str, Any], runtime: Any
    ) -> None:
        if isinstance(value, str) and runtime.genai_attributes:
            attributes[GEN_AI_QUERY_TEXT] = text

    def finish(self, call: Call, result: Any) -> None:
        _finish_retrieval(call, result)

    def read_item(self, call: Call, stream: Stream, item: Any) -> None:
        if call.spec.extractor is not None:
            stream.docs.extend(_docs_of(call.spec, item)[0])
        elif isinstance(item, (list, tuple)) and not (
            len(item) == 2 and isinstance(item[1], (int, float))
        ):
            stream.docs.extend(read_document(doc) for doc in item)
        else:
            stream.docs.append(read_document(item))

    def finish_stream(self, call: Call, stream: Stream) -> None:
        room = _attribute_room(call.span) if call.recording else None
        _finish_documents(
            call,
            stream.docs,
            len(stream.docs),
            None if room is None else room - _WITH_DOCUMENTS,
        )


class _Generation(Kind):
    """``@generation``: the model's text, model name and token usage."""

    __slots__ = ()
    label = "generation"
    foreign = ("LLM", "chat")

    def input_attributes(
        self, value: Any, text: str, attributes: dict[str, Any], runtime: Any
    ) -> None:
        if not isinstance(value, str):
            pairs = _chat_messages(value)
            if pairs is not None:
                _message_attributes(pairs, attributes, runtime.span_scrub, runtime.genai_attributes)

    def finish(self, call: Call, result: Any) -> None:
        text, model, usage = _generation_of(result)
        _finish_generation(call, text, model, usage)

    def read_item(self, call: Call, stream: Stream, item: Any) -> None:
        text = read_chunk_text(item)
        if text:
            stream.texts.append(text)
        if not isinstance(item, str):
            model = read_model(item)
            if model is not None:
                stream.model = model
            usage = read_usage(item)
            if usage is not None:
                stream.usage = usage

    def finish_stream(self, call: Call, stream: Stream) -> None:
        text = "".join(stream.texts) if stream.texts else None
        _finish_generation(call, text, stream.model, stream.usage)


RAG: Kind = _Request()
RETRIEVAL: Kind = _Retrieval()
GENERATION: Kind = _Generation()


# -- streamed results ---------------------------------------------------------------------------


class Stream:
    """What a generator wrapper accumulates across yields."""

    __slots__ = ("docs", "model", "texts", "usage")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.docs: list[Doc] = []
        self.model: str | None = None
        self.usage: Usage | None = None


def stream_item(call: Call, stream: Stream, item: Any) -> None:
    """Add an item a generator yielded to ``stream`` (a failure to read it is logged once)."""
    if not (call.recording or call.sampled):
        return
    try:
        call.spec.kind.read_item(call, stream, item)
    except Exception:
        user_code_error(f"reading an item yielded by {call.spec.qualname}")


def record_stream(call: Call, stream: Stream) -> None:
    """Record what a generator yielded on the call's span and trace state."""
    if call.recording or call.sampled:
        call.spec.kind.finish_stream(call, stream)


def _stream_answer(spec: Spec, item: Any) -> str | None:
    if spec.response_extractor is not None:
        value = spec.response_extractor(item)
        return None if value is None else to_text(value)
    return read_chunk_text(item)
