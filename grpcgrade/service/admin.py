"""The AdminService: the quarantine listed and cleared, the result cache cleared.

Served by the same server as GradingService, so the same interceptors (the bearer token, the metrics)
stand in front of it. It only reads and clears what `core.cached_grading` holds.
"""

from __future__ import annotations

from typing import Any

import grpc

from grpcgrade.core.cached_grading import CachedGrading
from grpcgrade.core.errors import UnknownGrader
from grpcgrade.core.registry import Registry
from grpcgrade.core.result_cache import BoundedStore
from grpcgrade.v1 import admin_pb2 as pb
from grpcgrade.v1 import admin_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AdminService"].full_name


class AdminServicer(pb_grpc.AdminServiceServicer):
    def __init__(self, cached: CachedGrading, registry: Registry) -> None:
        self.cached = cached
        self.registry = registry

    async def _grader(self, name: str, context: grpc.aio.ServicerContext) -> str:
        """A request's grader filter as its registered name (an alias works); "" for every grader."""
        if not name:
            return ""
        try:
            return self.registry.entry(name).name
        except UnknownGrader as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            raise AssertionError("unreachable: abort raises") from exc

    async def _clear(self, store: BoundedStore[Any] | None, grader: str, context: grpc.aio.ServicerContext) -> int:
        name = await self._grader(grader, context)
        return store.clear(name) if store is not None else 0

    async def ListQuarantine(
        self, request: pb.ListQuarantineRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListQuarantineResponse:
        grader = await self._grader(request.grader, context)
        quarantine = self.cached.quarantine
        if quarantine is None:
            return pb.ListQuarantineResponse(enabled=False)
        out = pb.ListQuarantineResponse(enabled=True, max_bytes=quarantine.max_bytes)
        for key, entry in quarantine.items():
            if grader and entry.scope.grader != grader:
                continue
            q = entry.value
            out.entries.add(
                grader=entry.scope.grader,
                params=entry.scope.params,
                code=q.code,
                since_unix_seconds=q.since,
                expires_unix_seconds=q.expires,
                hits=q.hits,
                preview=q.preview,
                key=key.hex(),
            )
        out.bytes = quarantine.bytes
        return out

    async def ClearQuarantine(
        self, request: pb.ClearQuarantineRequest, context: grpc.aio.ServicerContext
    ) -> pb.ClearQuarantineResponse:
        cleared = await self._clear(self.cached.quarantine, request.grader, context)
        return pb.ClearQuarantineResponse(cleared=cleared)

    async def ClearCache(
        self, request: pb.ClearCacheRequest, context: grpc.aio.ServicerContext
    ) -> pb.ClearCacheResponse:
        return pb.ClearCacheResponse(cleared=await self._clear(self.cached.cache, request.grader, context))
