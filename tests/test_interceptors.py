"""The server's interceptor around real grpc.aio servers on loopback: an aborted call keeps nothing of its
request alive. grpc keeps an abort's exception in the call's state, which the servicer context holds, which
the frames of the exception's traceback hold: a cycle, so every frame of an aborted call (its request among
their locals) lived until the garbage collector's next full pass; a server refusing large calls for load
grew by their size until then (5.5 GB after four rounds of 13 refused 47 MB calls). Here the collector is
off, so only reference counting can free the request: it must."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import grpc
import pytest

from grpcgrade.service.interceptors import ServiceInterceptor


class Held:
    """Stands for a large request: what the handler's frames hold when the call is aborted."""


class Refused(Exception):
    pass


def _serve_and_call(stream: bool) -> weakref.ref[Held]:
    """One call to a handler that takes a `Held`, and aborts from inside an `except` block (as the
    servicer refuses a call for load); returns a weak reference to what it held."""
    held: list[weakref.ref[Held]] = []

    async def admit(request: Held, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        try:
            raise Refused("over the limit")
        except Refused as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))

    async def unary(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        big = Held()
        held.append(weakref.ref(big))
        await admit(big, context)
        return b""

    async def streamed(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        big = Held()
        held.append(weakref.ref(big))
        await admit(big, context)
        yield b""

    async def main() -> None:
        server = grpc.aio.server(interceptors=[ServiceInterceptor(None, observe=False)])
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Streamed": grpc.unary_stream_rpc_method_handler(streamed),
        }
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", handlers)])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    if stream:
                        async for _ in channel.unary_stream("/t.T/Streamed")(b"x", timeout=30):
                            pass
                    else:
                        await channel.unary_unary("/t.T/Unary")(b"x", timeout=30)
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            await server.stop(None)

    asyncio.run(main())
    return held[0]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_an_aborted_call_keeps_nothing_of_its_request(stream):
    gc.collect()
    gc.disable()
    try:
        held = _serve_and_call(stream)
        assert held() is None, "the aborted call's frames still hold what it held"
    finally:
        gc.enable()
