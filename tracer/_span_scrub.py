"""Scrubbing of the spans an exporter receives, when ``scrub_span_attributes`` is on.

Every text field of a span is scrubbed: its name (also one set by ``update_name``), its
attributes, its events' names and attributes (exceptions recorded by the application
included: ``exception.type``, ``exception.message``, ``exception.stacktrace``), its links'
attributes and its status description. The resource is the provider's, not the span's.

Where it happens, so that no exporter sees a span first:

- The decorators' spans are scrubbed by the tracer just before it calls ``span.end()``
  (``_calls._end``): after the application's code in the span has finished, before any span
  processor runs at all, whatever processors the provider holds and in whatever order.
- The instrumentations' spans that span capture sees are scrubbed in its
  ``SpanProcessor._on_ending`` hook. Invariant (``Span.end`` of the OpenTelemetry SDK, 1.40
  and later): the ``_on_ending`` hook of every processor of the provider runs, in the
  ending thread, before the ``on_end`` of any of them, and the ``ReadableSpan`` handed to
  ``on_end`` (what exporting processors, simple or batch, export) is made after it from the
  fields scrubbed here. So it holds whatever the order in which the application added its
  processors, before ``configure`` or after it. An older SDK calls no such hook: span capture
  then scrubs in its ``on_end``, which covers the processors added after it only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from recalltrace.tracer._config import ScrubbingOptions
from recalltrace.tracer._scrub import Scrubber

logger = logging.getLogger("recalltrace.tracer")

TextScrub = Callable[[str], str]


def span_text_scrubber(scrubber: Scrubber | None, options: Any) -> TextScrub | None:
    """The function applied to span text, when span scrubbing is on."""
    if scrubber is None or not isinstance(options, ScrubbingOptions):
        return None
    if not options.scrub_span_attributes:
        return None

    produced: set[str] = set()  # texts this function returned lately: scrubbed already

    def scrub(text: str) -> str:
        if text in produced:
            return text
        result = scrub_once(text)
        if len(produced) >= 4096:
            produced.clear()
        produced.add(result)
        return result

    def scrub_once(text: str) -> str:
        if text[:1] in ("{", "[") and text[-1:] in ("}", "]"):
            # JSON text (document metadata, messages): its keys and strings are scrubbed as
            # the structure they are, not as escaped text, then encoded again.
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            if isinstance(value, (dict, list)):
                scrubbed = scrubber.scrub_value(value, "span", None)
                if scrubbed == value:
                    return text
                return json.dumps(scrubbed, ensure_ascii=False, default=str)
        return scrubber.scrub_text(text, "span", None)

    return scrub


def _scrubbed(value: Any, scrub: TextScrub) -> Any:
    """``value`` (an attribute value) scrubbed, or the same object when nothing changed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, (tuple, list)) and any(isinstance(item, str) for item in value):
        items = [scrub(item) if isinstance(item, str) else item for item in value]
        if items != list(value):
            return tuple(items) if isinstance(value, tuple) else items
    return value


def _scrub_mapping(attributes: Any, scrub: TextScrub) -> Any:
    """Scrub the text values of an attribute mapping in place where it can be written (the
    SDK's ``BoundedAttributes``, also when made immutable, or a dict); returns a scrubbed
    copy (a dict) when it cannot, else ``None``."""
    if not attributes:
        return None
    changed = {}
    for key, value in list(attributes.items()):
        scrubbed = _scrubbed(value, scrub)
        if scrubbed is not value and scrubbed != value:
            changed[key] = scrubbed
    if not changed:
        return None
    inner = getattr(attributes, "_dict", None)  # BoundedAttributes: its items, unchecked
    target = inner if isinstance(inner, dict) else attributes
    if isinstance(target, dict):
        lock = getattr(attributes, "_lock", None)
        if lock is not None:
            with lock:
                target.update(changed)
        else:
            target.update(changed)
        return None
    return {**dict(attributes), **changed}


def scrub_span(span: Any, scrub: TextScrub) -> None:
    """Scrub every text field of ``span`` in place: an SDK span not yet ended or ending (in
    ``_on_ending``), or the ``ReadableSpan`` of one (fields the SDK shares with it); never
    raises. Another implementation's span gets its attributes and name scrubbed through the
    API while it records."""
    try:
        if not hasattr(span, "_attributes"):
            _scrub_api_span(span, scrub)
            return
        name = span._name
        if isinstance(name, str):
            new_name = scrub(name)
            if new_name != name:
                span._name = new_name
        copy = _scrub_mapping(span._attributes, scrub)
        if copy is not None:
            span._attributes = copy
        for event in list(getattr(span, "_events", None) or ()):
            _scrub_event(event, scrub)
        for link in list(getattr(span, "_links", None) or ()):
            copy = _scrub_mapping(getattr(link, "_attributes", None), scrub)
            if copy is not None:
                link._attributes = copy
        status = getattr(span, "_status", None)
        description = getattr(status, "description", None)
        if status is not None and isinstance(description, str) and description:
            new_description = scrub(description)
            if new_description != description:
                from opentelemetry.trace import Status

                span._status = Status(status.status_code, new_description)
    except Exception:
        logger.debug("recalltrace: scrubbing a span failed", exc_info=True)


def _scrub_event(event: Any, scrub: TextScrub) -> None:
    name = getattr(event, "_name", None)
    if isinstance(name, str):
        new_name = scrub(name)
        if new_name != name:
            event._name = new_name
    copy = _scrub_mapping(getattr(event, "_attributes", None), scrub)
    if copy is not None:
        event._attributes = copy


def _scrub_api_span(span: Any, scrub: TextScrub) -> None:
    """A span of another implementation: what the OpenTelemetry API can change."""
    if not span.is_recording():
        return
    attributes = getattr(span, "attributes", None)
    if attributes:
        changed = {}
        for key, value in attributes.items():
            scrubbed = _scrubbed(value, scrub)
            if scrubbed is not value and scrubbed != value:
                changed[key] = scrubbed
        if changed:
            span.set_attributes(changed)
    name = getattr(span, "name", None)
    if isinstance(name, str):
        new_name = scrub(name)
        if new_name != name:
            span.update_name(new_name)
