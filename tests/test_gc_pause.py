"""A call of several chunks holds Python's cyclic collector off while its results arrive, for a bounded time,
and leaves the collector as the program had it (grpcgrade.gc_pause)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import pytest

from grpcgrade import gc_pause
from grpcgrade.client import AsyncGradingClient, GradingClient
from grpcgrade.testing import ServerProcess

JSON = [{"name": "json_validator"}]
#: Enough results for many young collections (CPython's threshold is 700 new objects), in 6 chunks.
SAMPLES = [{"response": f'{{"a": {i}}}'} for i in range(6_000)]


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every collection the collector starts while the test runs."""
    seen: list[int] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)


@pytest.mark.parametrize("pause", [gc_pause.DEFAULT_SECONDS, 0.0])
def test_a_large_call_is_not_walked_by_the_collector_while_it_runs(
    server: ServerProcess, collections: list[int], pause: float
) -> None:
    """Counted up to the last chunk's results placed: once the call ends, the collector may well walk them
    (once), as it walks anything new."""
    placed: list[int] = []  # collections so far, as each chunk's results are placed
    with GradingClient(server.target, chunk_size=1_000, timeout=120, gc_pause=pause) as client:
        before = len(collections)
        results = client.batch_evaluate(SAMPLES, JSON, on_progress=lambda done, total: placed.append(len(collections)))
    assert [r.results[0].score for r in results] == [1.0] * len(SAMPLES)
    assert gc.isenabled()
    if pause:
        assert placed[-1] == before
    else:  # the same call with the pause off: the collector ran while the results arrived
        assert placed[-1] > before


def test_the_async_client_holds_the_collector_off_too(server: ServerProcess, collections: list[int]) -> None:
    placed: list[int] = []

    async def call() -> int:
        async with AsyncGradingClient(server.target, chunk_size=1_000, timeout=120) as client:
            results = await client.batch_evaluate(
                SAMPLES, JSON, on_progress=lambda done, total: placed.append(len(collections))
            )
        return len(results)

    before = len(collections)
    assert asyncio.run(call()) == len(SAMPLES)
    assert placed[-1] == before
    assert gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off(server: ServerProcess) -> None:
    gc.disable()
    try:
        with GradingClient(server.target, chunk_size=1_000, timeout=120) as client:
            client.batch_evaluate(SAMPLES[:3_000], JSON)
        assert not gc.isenabled()
    finally:
        gc.enable()


SLOW = [{"name": "sleepy", "params": {"seconds": 0.2}}]


def test_the_collector_comes_back_when_the_pause_is_up_though_the_call_runs_on(server: ServerProcess) -> None:
    """Three chunks one after the other, each 0.2 s of a worker: the pause (0.01 s) is over long before the
    last of them is placed, and the collector is on by then."""
    seen: list[bool] = []
    with GradingClient(server.target, chunk_size=1, max_in_flight=1, timeout=120, gc_pause=0.01) as client:
        client.batch_evaluate(SAMPLES[:3], SLOW, on_progress=lambda done, total: seen.append(gc.isenabled()))
    assert len(seen) == 3
    assert seen[-1] is True
    assert gc.isenabled()


def test_the_async_clients_pause_is_bounded_too(server: ServerProcess) -> None:
    seen: list[bool] = []

    async def call() -> None:
        async with AsyncGradingClient(server.target, chunk_size=1, max_in_flight=1, timeout=120, gc_pause=0.01) as c:
            await c.batch_evaluate(SAMPLES[:3], SLOW, on_progress=lambda done, total: seen.append(gc.isenabled()))

    asyncio.run(call())
    assert len(seen) == 3
    assert seen[-1] is True
    assert gc.isenabled()


def test_a_call_that_ends_in_time_leaves_the_pause_to_the_calls_still_holding_it(server: ServerProcess) -> None:
    """A fast call inside a longer one's pause (here, the block's) ends without turning the collector on:
    only the pause's time running out, or its last holder leaving, does."""
    with gc_pause.paused(30.0), GradingClient(server.target, chunk_size=1_000, timeout=120) as client:
        client.batch_evaluate(SAMPLES[:3_000], JSON)
        assert not gc.isenabled()
    assert gc.isenabled()


def test_overlapping_calls_share_one_pause_counted_from_its_start() -> None:
    with gc_pause.paused(30.0) as first:
        assert first is not None and not gc.isenabled()
        with gc_pause.paused(30.0) as second:
            assert second is not None and second <= first  # the shared pause's time, not a fresh 30 s
        assert not gc.isenabled()  # the first call still holds it
    assert gc.isenabled()


def test_a_pause_that_ran_out_is_not_taken_up_again_by_a_call_joining_it() -> None:
    with gc_pause.paused(30.0):
        gc_pause.resume()  # the first call's time is up
        assert gc.isenabled()
        with gc_pause.paused(30.0) as joined:
            assert joined is None
            assert gc.isenabled()
    assert gc.isenabled()


def test_no_pause_at_zero_seconds() -> None:
    with gc_pause.paused(0.0) as left:
        assert left is None
        assert gc.isenabled()


def test_the_pause_ends_when_the_call_fails() -> None:
    with pytest.raises(RuntimeError), gc_pause.paused(30.0):
        raise RuntimeError("a failed call")
    assert gc.isenabled()
