"""Making a record storable: what no backend can hold is replaced, and each change is noted.

One unstorable value would otherwise fail the whole batch's transaction on every retry, and the
good records written with it would be dropped too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from recalltrace.storage.records import TraceRecord


def _make_json_text() -> Callable[[Any], str]:
    # ``json.dumps`` builds a new C encoder for every call, which costs more than encoding a
    # small dict; this one is built once, with ``json.dumps``'s defaults but no circular check
    # (records hold plain, acyclic values; a cyclic one would end in RecursionError and be
    # handed to ``json.dumps``, which names the cycle).
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the C accelerator
        return json.dumps
    encode = make(
        None,
        json.JSONEncoder().default,
        json.encoder.encode_basestring_ascii,
        None,
        ": ",
        ", ",
        False,
        False,
        True,
    )

    def json_text(value: Any) -> str:
        try:
            return "".join(encode(value, 0))
        except Exception:
            return json.dumps(value)  # raises as json.dumps would, or encodes what it can

    return json_text


json_text = _make_json_text()
"""``json.dumps(value)``, the same text, faster on the small values records hold (a
document's metadata)."""


def json_safe(value: Any) -> Any:
    """Make ``value`` JSON-serialisable; NaN and infinities become ``None``. A flat dict that
    already is (string keys, finite scalar values) is returned as it is."""
    if type(value) is dict and _flat_and_plain(value, None):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    return str(value)


# Characters no backend can store in text: Postgres refuses NUL in text and JSON, and lone
# surrogates (non-UTF-8 bytes decoded with ``surrogateescape``) cannot be encoded as UTF-8.
UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")
_UNSTORABLE_REPLACEMENT = "\ufffd"


def storable_text(text: str) -> tuple[str, int]:
    """``text`` with unstorable characters replaced by U+FFFD, and how many there were."""
    if "\x00" not in text and (text.isascii() or UNSTORABLE_TEXT.search(text) is None):
        return text, 0
    return UNSTORABLE_TEXT.subn(_UNSTORABLE_REPLACEMENT, text)


def storable_json(value: Any) -> tuple[Any, int]:
    """A JSON-safe ``value`` whose strings (keys included) are all storable."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        replaced = 0
        result: dict[str, Any] = {}
        for key, item in value.items():
            key_text, key_count = storable_text(str(key))
            item_value, item_count = storable_json(item)
            result[key_text] = item_value
            replaced += key_count + item_count
        return (result, replaced) if replaced else (value, 0)
    if isinstance(value, list):
        items = [storable_json(item) for item in value]
        replaced = sum(count for _, count in items)
        return ([item for item, _ in items], replaced) if replaced else (value, 0)
    return value, 0


# Lengths of the bounded text columns a record fills (storage.models).
_NAME_LIMITS = {
    "app_name": 200,
    "service_name": 200,
    "release": 200,
    "environment": 200,
    "user_id": 200,
    "session_id": 200,
}
_CHECKED_NAMES = (
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
TAG_LIMIT = 200
_CONTEXT_ID_LIMIT = 500
MODEL_LIMIT = 200


def _flat_and_plain(value: dict[Any, Any], texts: list[str] | None) -> bool:
    """Whether ``value`` has only string keys and string, integer, boolean, ``None`` or finite
    float values (adding its keys and string values to ``texts``)."""
    for key, item in value.items():
        kind = type(item)
        if type(key) is not str or not (
            kind is str
            or kind is int
            or kind is bool
            or item is None
            or (kind is float and math.isfinite(item))
        ):
            return False
        if texts is not None:
            texts.append(key)
            if kind is str:
                texts.append(item)
    return True


def _texts_of_plain_record(record: TraceRecord) -> list[str] | None:
    """Every text of ``record`` that :func:`storable_record` would examine, when the record
    is of the plain shape almost every record has and nothing of it is over its column's
    length; ``None`` for any other record (it is examined value by value)."""
    texts: list[str] = []
    for name in _CHECKED_NAMES:
        value = getattr(record, name)
        if value is None:
            continue
        if type(value) is not str:
            return None
        limit = _NAME_LIMITS.get(name)
        if limit is not None and len(value) > limit:
            return None
        texts.append(value)
    for items in (record.reference_contexts, record.reference_context_ids):
        if items is not None:
            if type(items) is not list or any(type(item) is not str for item in items):
                return None
            texts.extend(items)
    if record.metadata and (
        type(record.metadata) is not dict or not _flat_and_plain(record.metadata, texts)
    ):
        return None
    tags = record.tags
    if tags:
        if type(tags) is not list:
            return None
        for tag in tags:
            if type(tag) is not str or not tag or len(tag) > TAG_LIMIT:
                return None
        if len(set(tags)) != len(tags):
            return None
        texts.extend(tags)
    for context in record.retrieved_contexts:
        content, context_id, metadata = context.content, context.id, context.metadata
        if type(content) is not str:
            return None
        texts.append(content)
        if context_id is not None:
            if type(context_id) is not str or len(context_id) > _CONTEXT_ID_LIMIT:
                return None
            texts.append(context_id)
        if metadata and (type(metadata) is not dict or not _flat_and_plain(metadata, texts)):
            return None
    notes = record.notes
    if type(notes) is not list or any(type(note) is not str for note in notes):
        return None
    texts.extend(notes)
    return texts


def storable_record(record: TraceRecord) -> TraceRecord:
    """``record`` with every character a backend cannot store replaced, and over-long names
    and ids cut to their column's length, each change noted on the record.

    One unstorable value would otherwise fail the whole batch's transaction on every retry, and
    the good records written with it would be dropped too.
    """
    texts = _texts_of_plain_record(record)
    if texts is not None:
        # The usual record: all its texts are searched at once, and it is kept as it is when
        # none holds a character to replace (the same result as the walk below).
        joined = "".join(texts)
        if "\x00" not in joined and (joined.isascii() or UNSTORABLE_TEXT.search(joined) is None):
            return record
    return _storable_walk(record)


def _storable_walk(record: TraceRecord) -> TraceRecord:
    """:func:`storable_record`, examining the record value by value."""
    notes = list(record.notes)
    changes: dict[str, Any] = {}

    def clean(value: Any, where: str) -> tuple[Any, bool]:
        cleaned, count = storable_json(value)
        if count:
            notes.append(
                f"replaced {count} unstorable character(s) (NUL, lone surrogates) in {where}"
            )
        return cleaned, bool(count)

    for name in _CHECKED_NAMES:
        value = getattr(record, name)
        if value is not None:
            cleaned, changed = clean(value, name)
            limit = _NAME_LIMITS.get(name)
            if limit is not None and len(cleaned) > limit:
                notes.append(f"truncated {name} from {len(cleaned)} to {limit} characters")
                cleaned, changed = cleaned[:limit], True
            if changed:
                changes[name] = cleaned
    for name in ("reference_contexts", "reference_context_ids"):
        value = getattr(record, name)
        if value is not None:
            cleaned, changed = clean(list(value), name)
            if changed:
                changes[name] = cleaned
    if record.metadata:
        cleaned, changed = clean(json_safe(record.metadata), "metadata")
        if changed:
            changes["metadata"] = cleaned
    if record.tags:
        tags: list[str] = []
        for tag in record.tags:
            cleaned, _ = clean(str(tag), "tags")
            if len(cleaned) > TAG_LIMIT:
                notes.append(f"truncated a tag from {len(cleaned)} to {TAG_LIMIT} characters")
                cleaned = cleaned[:TAG_LIMIT]
            if cleaned and cleaned not in tags:
                tags.append(cleaned)
        if tags != record.tags:
            changes["tags"] = tags
    contexts = []
    contexts_changed = False
    for index, context in enumerate(record.retrieved_contexts):
        where = f"retrieved_contexts[{index}]"
        content, content_changed = clean(context.content, f"{where}.content")
        context_id, id_changed = (
            (None, False) if context.id is None else clean(str(context.id), f"{where}.id")
        )
        if context_id is not None and len(context_id) > _CONTEXT_ID_LIMIT:
            notes.append(
                f"truncated {where}.id from {len(context_id)} to {_CONTEXT_ID_LIMIT} characters"
            )
            context_id, id_changed = context_id[:_CONTEXT_ID_LIMIT], True
        metadata, metadata_changed = (
            clean(json_safe(context.metadata), f"{where}.metadata")
            if context.metadata
            else (context.metadata, False)
        )
        if content_changed or id_changed or metadata_changed:
            contexts_changed = True
            context = dataclasses.replace(
                context, content=content, id=context_id, metadata=metadata
            )
        contexts.append(context)
    if contexts_changed:
        changes["retrieved_contexts"] = contexts
    cleaned_notes, notes_changed = storable_json(notes)
    if notes_changed or len(notes) != len(record.notes):
        changes["notes"] = cleaned_notes
    return dataclasses.replace(record, **changes) if changes else record
