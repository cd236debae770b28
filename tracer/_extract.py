"""Reading documents, generations and answers out of whatever user functions return.

Everything is duck typing: plain strings, dicts, LangChain-style ``Document`` objects
(``page_content``), LlamaIndex-style scored nodes (``node`` + ``score``, ``get_content()``),
Haystack-style documents (``content``/``meta``), OpenAI/LiteLLM/Anthropic-style responses and
stream chunks. No framework is imported. The reader chosen for a document type is cached, so the
per-call work is one dict lookup and a few attribute reads.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from recalltrace.storage.records import ContextRecord


class Doc(NamedTuple):
    """One retrieved document as read from a return value."""

    content: str
    id: str | None
    score: float | None
    metadata: dict[str, Any]


class UnreadableDoc(Doc):
    """A document whose reading raised, kept empty in its place so the ranks of the others
    hold; ``error`` names the exception."""

    error: str


def unreadable(exc: BaseException | None) -> UnreadableDoc:
    """The empty stand-in for a document whose reading raised ``exc`` (``None``: it was not
    read at all, and the reader's note says why)."""
    doc = UnreadableDoc("", None, None, {})
    doc.error = "" if exc is None else type(exc).__name__
    return doc


class Usage(NamedTuple):
    """Token counts of one generation; any of them may be unknown."""

    prompt: int | None
    completion: int | None
    total: int | None


_CONTENT_KEYS = ("content", "text", "page_content", "document", "chunk", "body")
_ID_KEYS = ("id", "doc_id", "document_id", "chunk_id", "node_id", "id_")
_SCORE_KEYS = ("score", "similarity", "relevance_score")
_ANSWER_KEYS = ("answer", "response", "output", "result", "text", "content", "completion")
_DOC_LIST_KEYS = ("documents", "docs", "contexts", "results", "nodes", "source_nodes", "matches")

_EMPTY: dict[str, Any] = {}
# Builds a Doc without NamedTuple's Python-level __new__ (this runs once per document).
_new_doc: Callable[[tuple[Any, ...]], Doc] = functools.partial(tuple.__new__, Doc)


def _as_id(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else str(value)


def _as_score(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _as_metadata(value: Any) -> dict[str, Any]:
    """A document's metadata as a dict, not copied here: a document kept for a sampled
    request's record is snapshotted then (``snapshot_documents``); for a span only its text is
    needed."""
    if not value:
        return _EMPTY
    if type(value) is dict:
        return value
    if isinstance(value, Mapping):
        return dict(value)
    return _EMPTY


_LEAF_TYPES = frozenset({str, int, float, bool, type(None), bytes})
SNAPSHOT_BUDGET = 2000
"""Most containers (dicts, lists, tuples, sets) copied for one snapshot; past it, the rest is
kept as it is."""


def is_plain_data(value: Any, budget: int = SNAPSHOT_BUDGET) -> bool:
    """Whether ``value`` is strings, numbers, booleans and ``None`` in dicts (with string
    keys), lists and tuples only (at most ``budget`` containers): printing it runs no
    application code."""
    left = [budget]

    def plain(item: Any, depth: int) -> bool:
        kind = type(item)
        if kind in _LEAF_TYPES:
            return kind is not bytes
        if depth > 20 or left[0] <= 0:
            return False
        left[0] -= 1
        if kind is dict:
            return all(type(k) is str and plain(v, depth + 1) for k, v in item.items())
        if kind is list or kind is tuple:
            return all(plain(v, depth + 1) for v in item)
        return False

    return plain(value, 0)


def snapshot(value: Any, budget: int = SNAPSHOT_BUDGET) -> Any:
    """``value`` as it is now: dicts, lists, tuples and sets are copied (up to ``budget`` of
    them, 20 levels deep), so that a later change by the application does not change the
    record; other objects are kept as they are and read later, with a time bound. Cheap for
    the common case: a string, a number, or a small flat dict."""
    kind = type(value)
    if kind in _LEAF_TYPES:
        return value
    if kind is dict:
        # The common case, a flat dict of plain values (a document's metadata): one C-level
        # copy, no walk.
        for inner in value.values():
            if type(inner) not in _LEAF_TYPES:
                break
        else:
            return value.copy()
    left = [budget]

    def copy(item: Any, depth: int) -> Any:
        kind = type(item)
        if kind in _LEAF_TYPES or depth > 20 or left[0] <= 0:
            return item
        if kind is dict:
            left[0] -= 1
            return {key: copy(inner, depth + 1) for key, inner in item.items()}
        if kind is list or kind is tuple:
            left[0] -= 1
            copied = [copy(inner, depth + 1) for inner in item]
            return copied if kind is list else tuple(copied)
        if kind is set or kind is frozenset:
            left[0] -= 1
            return kind(copy(inner, depth + 1) for inner in item)
        return item

    try:
        return copy(value, 0)
    except Exception:  # a mapping whose items() raises, a set of unhashable copies
        return value


def snapshot_documents(docs: list[Doc]) -> list[Doc]:
    """``docs`` with their metadata as it is now (see :func:`snapshot`)."""
    return [_new_doc((doc[0], doc[1], doc[2], snapshot(doc[3]))) if doc[3] else doc for doc in docs]


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if callable(value):
        value = value()
        if isinstance(value, str):
            return value
    return "" if value is None else str(value)


# -- documents -------------------------------------------------------------------------------


def _doc_from_str(obj: Any) -> Doc:
    return _new_doc((obj, None, None, _EMPTY))


def _doc_from_search_hit(obj: Mapping[str, Any], source: Mapping[str, Any]) -> Doc:
    """An Elasticsearch/OpenSearch hit: ``_id``, ``_score`` and the indexed ``_source``."""
    content_key = next((key for key in _CONTENT_KEYS if key in source), None)
    if content_key is None:
        # No conventional text field: the source's string fields, in their order.
        texts = [value for value in source.values() if isinstance(value, str)]
        content = "\n".join(texts)
        metadata = {k: v for k, v in source.items() if not isinstance(v, str)}
    else:
        content = _as_text(source[content_key])
        metadata = {k: v for k, v in source.items() if k != content_key}
    if obj.get("_index") is not None:
        metadata = {**metadata, "_index": obj["_index"]}
    return Doc(content, _as_id(obj.get("_id")), _as_score(obj.get("_score")), metadata or _EMPTY)


def _doc_from_mapping(obj: Any) -> Doc:
    source = obj.get("_source")
    if source is not None and isinstance(source, Mapping):
        return _doc_from_search_hit(obj, source)
    content: Any = obj.get("content")
    if content is None:
        for key in _CONTENT_KEYS:
            if key in obj:
                content = obj[key]
                break
    if content is not None and not isinstance(content, str):
        # A nested document, e.g. {"document": <Document>, "score": 0.8}.
        inner = read_document(content)
        score = _first_score(obj)
        return Doc(
            inner.content,
            inner.id if inner.id is not None else _first_id(obj),
            score if score is not None else inner.score,
            inner.metadata,
        )
    metadata = obj.get("metadata")
    metadata = _as_metadata(metadata if metadata is not None else obj.get("meta"))
    doc_id = _first_id(obj)
    if doc_id is None and metadata:
        doc_id = _first_id(metadata)
    return _new_doc(("" if content is None else content, doc_id, _first_score(obj), metadata))


def _first_id(obj: Mapping[str, Any]) -> str | None:
    value = obj.get("id")
    if type(value) is str and value:
        return value
    for key in _ID_KEYS:
        if key in obj:
            value = _as_id(obj[key])
            if value is not None:
                return value
    return None


def _first_score(obj: Mapping[str, Any]) -> float | None:
    value = obj.get("score")
    if value is not None:
        return value if type(value) is float else _as_score(value)
    for key in _SCORE_KEYS:
        if key in obj:
            return _as_score(obj[key])
    return None


def _doc_from_context_record(obj: Any) -> Doc:
    return Doc(obj.content, obj.id, obj.score, obj.metadata or _EMPTY)


def _doc_from_langchain(obj: Any) -> Doc:
    metadata = _as_metadata(getattr(obj, "metadata", None))
    doc_id = _as_id(getattr(obj, "id", None))
    if doc_id is None and metadata:
        doc_id = _first_id(metadata)
    score = _as_score(metadata.get("score")) if metadata else None
    return Doc(_as_text(obj.page_content), doc_id, score, metadata)


def _doc_from_scored_node(obj: Any) -> Doc:
    inner = read_document(obj.node)
    score = _as_score(getattr(obj, "score", None))
    return Doc(inner.content, inner.id, score if score is not None else inner.score, inner.metadata)


def _doc_from_node(obj: Any) -> Doc:
    getter = getattr(obj, "get_content", None)
    content = _as_text(getter) if getter is not None else _as_text(getattr(obj, "text", None))
    doc_id = _as_id(getattr(obj, "node_id", None)) or _as_id(getattr(obj, "id_", None))
    return Doc(content, doc_id, None, _as_metadata(getattr(obj, "metadata", None)))


def _doc_from_object(obj: Any) -> Doc:
    content: Any = None
    for key in ("content", "text", "page_content"):
        content = getattr(obj, key, None)
        if content is not None:
            break
    doc_id = None
    for key in _ID_KEYS:
        doc_id = _as_id(getattr(obj, key, None))
        if doc_id is not None:
            break
    metadata = _as_metadata(getattr(obj, "metadata", None) or getattr(obj, "meta", None))
    if content is None:
        return Doc(str(obj), doc_id, None, metadata)
    return Doc(_as_text(content), doc_id, _as_score(getattr(obj, "score", None)), metadata)


def _doc_from_pair(obj: Any) -> Doc:
    # LangChain's similarity_search_with_score returns (Document, score) pairs.
    if len(obj) == 2 and isinstance(obj[1], (int, float)) and not isinstance(obj[1], bool):
        inner = read_document(obj[0])
        return Doc(inner.content, inner.id, float(obj[1]), inner.metadata)
    return Doc(str(obj), None, None, _EMPTY)


def _reader_for(kind: type) -> Callable[[Any], Doc]:
    if issubclass(kind, str):
        return _doc_from_str
    if issubclass(kind, ContextRecord):
        return _doc_from_context_record
    if issubclass(kind, Mapping):
        return _doc_from_mapping
    if issubclass(kind, (tuple, list)):
        return _doc_from_pair
    if hasattr(kind, "page_content"):
        return _doc_from_langchain
    if hasattr(kind, "node") and hasattr(kind, "score"):
        return _doc_from_scored_node
    if hasattr(kind, "get_content"):
        return _doc_from_node
    return _doc_from_instance


def _doc_from_instance(obj: Any) -> Doc:
    # Attributes that only exist on instances (e.g. plain classes setting them in __init__).
    if hasattr(obj, "page_content"):
        return _doc_from_langchain(obj)
    if hasattr(obj, "node") and hasattr(obj, "score"):
        return _doc_from_scored_node(obj)
    return _doc_from_object(obj)


_READERS: dict[type, Callable[[Any], Doc]] = {}


def read_document(obj: Any) -> Doc:
    """Read one document of any supported shape."""
    reader = _READERS.get(type(obj))
    if reader is None:
        reader = _reader_for(type(obj))
        if len(_READERS) < 512:
            _READERS[type(obj)] = reader
    return reader(obj)


def document_list(result: Any) -> list[Any] | None:
    """The documents inside a retriever's return value, without consuming iterators."""
    if result is None:
        return None
    if isinstance(result, (list, tuple)):
        return list(result) if isinstance(result, tuple) else result
    if isinstance(result, (str, ContextRecord)):
        return [result]
    if isinstance(result, Mapping):
        hits = result.get("hits")
        if isinstance(hits, Mapping) and isinstance(hits.get("hits"), (list, tuple)):
            return list(hits["hits"])  # an Elasticsearch/OpenSearch search response
        for key in _DOC_LIST_KEYS:
            value = result.get(key)
            if isinstance(value, (list, tuple)):
                return list(value)
        return [result]
    for attribute in ("source_nodes", "documents", "nodes"):
        value = getattr(result, attribute, None)
        if isinstance(value, (list, tuple)):
            return list(value)
    if hasattr(result, "page_content") or hasattr(result, "node"):
        return [result]
    return None


def read_documents(result: Any) -> list[Doc]:
    """Read all documents of a retriever's return value (empty when none are recognised)."""
    items = document_list(result)
    if not items:
        return []
    return [read_document(item) for item in items]


# -- generations -----------------------------------------------------------------------------


def _get(obj: Any, name: str) -> Any:
    # dict first and attributes next: an isinstance check against the Mapping ABC is slow.
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None and isinstance(obj, Mapping):
        return obj.get(name)
    return value


def _first(obj: Any) -> Any:
    if isinstance(obj, (list, tuple)) and obj:
        return obj[0]
    return None


def _text_of_content(content: Any) -> str | None:
    if content is None:
        return None
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        # Anthropic-style content blocks: [{"type": "text", "text": ...}, ...]
        parts = [_get(block, "text") for block in content]
        texts = [part for part in parts if isinstance(part, str)]
        return "".join(texts) if texts else None
    return None


def _int_or_none(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def read_usage(obj: Any) -> Usage | None:
    """Token usage of a response object or dict (OpenAI, Anthropic, LangChain shapes)."""
    usage = _get(obj, "usage")
    if usage is None:
        usage = _get(obj, "usage_metadata")
    if usage is None:
        return None
    prompt = _int_or_none(_get(usage, "prompt_tokens"))
    if prompt is None:
        prompt = _int_or_none(_get(usage, "input_tokens"))
    completion = _int_or_none(_get(usage, "completion_tokens"))
    if completion is None:
        completion = _int_or_none(_get(usage, "output_tokens"))
    total = _int_or_none(_get(usage, "total_tokens"))
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion
    if prompt is None and completion is None and total is None:
        return None
    return Usage(prompt, completion, total)


def read_model(obj: Any) -> str | None:
    """The model name a response carries, if any."""
    model = _get(obj, "model")
    if isinstance(model, str) and model:
        return model
    response_metadata = _get(obj, "response_metadata")
    if isinstance(response_metadata, Mapping):
        for key in ("model_name", "model"):
            value = response_metadata.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def read_generation_text(obj: Any) -> str | None:
    """The generated text of a full (non-streamed) response."""
    if obj is None:
        return None
    if isinstance(obj, str):
        return obj
    choice = _first(_get(obj, "choices"))
    if choice is not None:
        message = _get(choice, "message")
        if message is not None:
            text = _text_of_content(_get(message, "content"))
            if text is not None:
                return text
        text = _get(choice, "text")
        if isinstance(text, str):
            return text
    text = _text_of_content(_get(obj, "content"))
    if text is not None:
        return text
    for key in ("text", "output", "completion", "answer", "response"):
        value = _get(obj, key)
        if isinstance(value, str):
            return value
    return None


def read_chunk_text(chunk: Any) -> str | None:
    """The text carried by one streamed chunk (string, OpenAI delta, LangChain chunk,
    Anthropic ``content_block_delta``)."""
    if isinstance(chunk, str):
        return chunk
    if chunk is None:
        return None
    choice = _first(_get(chunk, "choices"))
    if choice is not None:
        delta = _get(choice, "delta")
        if delta is not None:
            content = _get(delta, "content")
            return content if isinstance(content, str) else None
        text = _get(choice, "text")
        return text if isinstance(text, str) else None
    delta = _get(chunk, "delta")
    if delta is not None:
        text = _get(delta, "text")
        if isinstance(text, str):
            return text
    return read_generation_text(chunk)


def read_answer(obj: Any) -> str | None:
    """The answer inside a RAG function's return value."""
    if obj is None:
        return None
    if isinstance(obj, str):
        return obj
    if isinstance(obj, Mapping):
        for key in _ANSWER_KEYS:
            value = obj.get(key)
            if isinstance(value, str):
                return value
        return None
    for key in ("response", "answer", "content", "text", "output"):
        value = getattr(obj, key, None)
        if isinstance(value, str):
            return value
    return read_generation_text(obj)


# -- values ----------------------------------------------------------------------------------


def to_text(value: Any) -> str | None:
    """A value as text for ``input.value``/records: strings unchanged, else JSON, else str."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError):
        return str(value)


def to_text_list(value: Any) -> list[str] | None:
    """A list of strings from a list of strings or documents (for reference contexts)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [item if isinstance(item, str) else read_document(item).content for item in value]
    return [str(value)]


def to_id_list(value: Any) -> list[str] | None:
    """A list of string ids."""
    if value is None:
        return None
    if isinstance(value, (str, int)):
        return [str(value)]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [str(item) for item in value]
    return [str(value)]


# One encoder for all calls: ``json.dumps`` with options builds a new encoder every time.
_ENCODER = json.JSONEncoder(default=str, ensure_ascii=False)


quote_json: Callable[[str], str] = json.encoder.encode_basestring
"""A string as a JSON string literal (C speed)."""
_quote = quote_json
_INFINITE = frozenset({float("inf"), float("-inf")})


def flat_json(metadata: Mapping[str, Any]) -> str | None:
    """The JSON text of a flat dict of strings, integers, finite floats, booleans and ``None``
    under string keys, written directly (the same text as ``json.dumps(..., ensure_ascii=
    False)``, without building an encoder); None for anything else."""
    if type(metadata) is not dict:
        return None
    parts: list[str] = []
    for key, value in metadata.items():
        if type(key) is not str:
            return None
        kind = type(value)
        if kind is str:
            text = _quote(value)
        elif kind is int:
            text = int.__repr__(value)
        elif kind is float:
            if value != value or value in _INFINITE:
                return None  # NaN and infinities: the encoder's spelling
            text = float.__repr__(value)
        elif kind is bool:
            text = "true" if value else "false"
        elif value is None:
            text = "null"
        else:
            return None
        parts.append(_quote(key) + ": " + text)
    return "{" + ", ".join(parts) + "}"


def metadata_json(metadata: Mapping[str, Any]) -> str:
    """Metadata as the JSON string OpenInference puts in ``document.metadata``."""
    text = flat_json(metadata)
    if text is not None:
        return text
    try:
        return _ENCODER.encode(metadata)
    except Exception:
        # User data: circular, nested past the recursion limit, or holding a value whose
        # ``__str__`` raises. The span keeps what can be printed; the documents are kept.
        try:
            return str(metadata)
        except Exception:
            return "{}"
