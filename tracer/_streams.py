"""The wrappers of generator and async generator functions.

A generator's span stays open across its yields but is current only while the generator's own
code runs, so the caller's context is never left pointing at it. The items are passed through
unchanged; what the call's kind reads from them is recorded when the generator ends, fails or
is closed by its caller.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from recalltrace.tracer._calls import Spec, detach, failed, otel_api, start_call, stream_finished
from recalltrace.tracer._kinds import Stream, stream_item


def wrap_generator(fn: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = start_call(spec, args, kwargs)
        if call is None:
            return (yield from fn(*args, **kwargs))
        attach = otel_api.attach
        ctx = call.ctx
        stream = Stream()
        token = attach(ctx)
        try:
            generator = fn(*args, **kwargs)
        except BaseException as exc:
            detach(token)
            failed(call, exc)
            raise
        detach(token)
        to_send: Any = None
        to_throw: BaseException | None = None
        while True:
            token = attach(ctx)
            try:
                if to_throw is None:
                    item = generator.send(to_send)
                else:
                    thrown, to_throw = to_throw, None
                    item = generator.throw(thrown)
            except StopIteration as stop:
                detach(token)
                stream_finished(call, stream, closed_early=False)
                return stop.value
            except BaseException as exc:
                detach(token)
                failed(call, exc, stream)
                raise
            detach(token)
            stream_item(call, stream, item)
            try:
                to_send = yield item
            except GeneratorExit:
                token = attach(ctx)
                try:
                    generator.close()
                except BaseException as exc:
                    detach(token)
                    failed(call, exc, stream)
                    raise
                detach(token)
                stream_finished(call, stream, closed_early=True)
                raise
            except BaseException as exc:
                to_throw = exc
                to_send = None

    return wrapper


def wrap_async_generator(fn: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = start_call(spec, args, kwargs)
        if call is None:
            # Untraced, but still forwarding asend/athrow/aclose like the traced path.
            plain = fn(*args, **kwargs)
            sent: Any = None
            error: BaseException | None = None
            while True:
                try:
                    if error is None:
                        value = await plain.asend(sent)
                    else:
                        raised, error = error, None
                        value = await plain.athrow(raised)
                except StopAsyncIteration:
                    return
                try:
                    sent = yield value
                except GeneratorExit:
                    await plain.aclose()
                    raise
                except BaseException as exc:
                    error = exc
                    sent = None
        attach = otel_api.attach
        ctx = call.ctx
        stream = Stream()
        token = attach(ctx)
        try:
            generator = fn(*args, **kwargs)
        except BaseException as exc:
            detach(token)
            failed(call, exc)
            raise
        detach(token)
        to_send: Any = None
        to_throw: BaseException | None = None
        while True:
            token = attach(ctx)
            try:
                if to_throw is None:
                    item = await generator.asend(to_send)
                else:
                    thrown, to_throw = to_throw, None
                    item = await generator.athrow(thrown)
            except StopAsyncIteration:
                detach(token)
                stream_finished(call, stream, closed_early=False)
                return
            except BaseException as exc:
                detach(token)
                failed(call, exc, stream)
                raise
            detach(token)
            stream_item(call, stream, item)
            try:
                to_send = yield item
            except GeneratorExit:
                token = attach(ctx)
                try:
                    await generator.aclose()
                except BaseException as exc:
                    detach(token)
                    failed(call, exc, stream)
                    raise
                detach(token)
                stream_finished(call, stream, closed_early=True)
                raise
            except BaseException as exc:
                to_throw = exc
                to_send = None

    return wrapper
