"""The server-wide budget of graded output not yet handed to the transport.

Each call keeps a window of chunks in flight and hands its answers to gRPC as its client takes them; a
client that reads slowly would otherwise let every call hold its graded answers for as long as it likes.
Calls charge the bytes of each answer they hold and release them once gRPC has taken it; while the budget
is spent, calls wait before starting new chunks (they are not refused). Waiting is bounded: a call whose
client takes no message for `send_timeout_seconds` is ended, which releases what it held.
"""

from __future__ import annotations

import asyncio


class OutputBudget:
    """Bytes held server-wide; one accounting step per chunk, never per sample."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._room = asyncio.Event()
        self._room.set()

    def charge(self, size: int) -> None:
        self.held += size
        if self.held >= self.max_bytes:
            self._room.clear()

    def release(self, size: int) -> None:
        self.held -= size
        if self.held < self.max_bytes:
            self._room.set()

    def has_room(self) -> bool:
        return self.held < self.max_bytes

    async def room(self) -> None:
        """Returns once the bytes held are under the budget (at once when they are). A single answer may
        pass the budget: a new chunk starts whenever anything is left, so one call always makes progress."""
        while self.held >= self.max_bytes:
            self._room.clear()
            await self._room.wait()
