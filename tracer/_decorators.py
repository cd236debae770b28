"""``@rag``, ``@retrieval`` and ``@generation``: real OpenTelemetry spans plus trace capture.

At decoration time the function is inspected once: its kind (plain, coroutine, generator, async
generator) picks the wrapper, and the positions of the parameters to capture are resolved. Per
call, the wrapper opens a span in the current context, stores what the trace record needs as raw
values on the trace state, and leaves conversion, scrubbing and storage to the writer thread.

Generators keep their span open across yields but make it current only while their own code
runs, so the caller's context is never left pointing at the generator's span.

OpenTelemetry is imported on the first call, not at ``import tracer``.

The parts: :mod:`._calls` opens and ends one call's span and keeps its trace state,
:mod:`._kinds` holds what differs between a request, a retrieval and a generation (what each
reads from its result and puts on its span), :mod:`._streams` wraps generators.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from recalltrace.tracer._calls import (
    Param,
    Spec,
    deeper,
    detach,
    failed,
    otel_api,
    shallower,
    start_call,
    succeeded,
)
from recalltrace.tracer._streams import wrap_async_generator, wrap_generator


def _locate(signature: inspect.Signature | None, name: str | None, fn: Any) -> Param | None:
    if name is None:
        return None
    if signature is None:
        return Param(name, None, None, True)
    index: int | None = None
    default: Any = None
    missing = True
    for position, parameter in enumerate(signature.parameters.values()):
        if parameter.name != name:
            continue
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            index = position
        if parameter.default is not parameter.empty:
            default = parameter.default
            missing = False
        break
    else:
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        if not takes_kwargs:
            raise TypeError(f"{fn.__qualname__} has no parameter named {name!r}")
    return Param(name, index, default, missing)


def _wrap_function(fn: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = start_call(spec, args, kwargs)
        if call is None:
            return fn(*args, **kwargs)
        token = otel_api.attach(call.ctx)
        deeper()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            shallower()
            detach(token)
            failed(call, exc)
            raise
        shallower()
        detach(token)
        succeeded(call, result)
        return result

    return wrapper


def _wrap_coroutine(fn: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = start_call(spec, args, kwargs)
        if call is None:
            return await fn(*args, **kwargs)
        token = otel_api.attach(call.ctx)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            detach(token)
            failed(call, exc)
            raise
        detach(token)
        succeeded(call, result)
        return result

    return wrapper


def decorate(fn: Any, spec: Spec) -> Any:
    """Wrap ``fn`` (a function, coroutine function, generator or async generator function,
    staticmethod or classmethod) according to ``spec``."""
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(decorate(fn.__func__, spec))
    if not callable(fn):
        raise TypeError(f"cannot trace {fn!r}: not callable")
    spec.qualname = getattr(fn, "__qualname__", spec.name)
    if inspect.isasyncgenfunction(fn):
        return wrap_async_generator(fn, spec)
    if inspect.iscoroutinefunction(fn):
        return _wrap_coroutine(fn, spec)
    if inspect.isgeneratorfunction(fn):
        return wrap_generator(fn, spec)
    return _wrap_function(fn, spec)


def signature_of(fn: Any) -> inspect.Signature | None:
    """The signature of ``fn`` (unwrapping static/class methods), or None if unavailable."""
    target = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def locate(fn: Any, name: str | None) -> Param | None:
    """Resolve the parameter ``name`` of ``fn`` once, at decoration time."""
    return _locate(signature_of(fn), name, getattr(fn, "__func__", fn))


def function_name(fn: Any) -> str:
    """Default span name of ``fn``."""
    target = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
    return str(getattr(target, "__name__", None) or type(target).__name__)
