"""The servers `grpcgrade bench --per-sample` compares grpcgrade with, each answering the same grader.

- `fastapi`: the plain FastAPI per-sample reward server users write. One process, uvicorn, an `async def`
  endpoint that grades the posted sample with the same grader (built from this installation's registry,
  with the same parameters) and answers its score. `async def` rather than `def`: FastAPI runs a `def`
  endpoint on a thread pool, which is slower for work this short, and the comparison should be with the
  peer at its best. For the same reason uvicorn runs with its standard extra, uvloop's event loop and
  httptools' HTTP parser, which it picks when they are installed: a trainer's environment has them (vLLM
  requires `fastapi[standard]`, which installs `uvicorn[standard]`), and they cut the peer's CPU a call by
  about a third here (300 -> 200 µs). The report names the loop and parser the peer ran with.
- `floor`: the least a one-process Python server can do per call, on both protocols at once: a bare
  `grpc.aio` server whose `Evaluate` makes the bare library call and answers a reward, and a bare aiohttp
  server doing the same for OpenRLHF's body. No validation, no grader API, no limits, no metrics: what
  gRPC and aiohttp themselves cost a call on this machine, which bounds what grpcgrade's faces can reach.

    python -m grpcgrade.bench_peer fastapi GRADER PARAMS_JSON PORT
    python -m grpcgrade.bench_peer floor PRESET {} GRPC_PORT HTTP_PORT    (PRESET: a `grpcgrade bench` preset)
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint's annotations at run time, and the
# body model is local to `make_app`.
import asyncio
import json
import sys
from typing import Any

#: Connections the peers' listening sockets hold before they are accepted (the kernel caps it at
#: net.core.somaxconn): a crowd connects at once.
BACKLOG = 8192


def make_app(grader_name: str, params: dict[str, Any]) -> Any:
    from fastapi import FastAPI
    from pydantic import BaseModel

    from .core.registry import get_registry

    grader = get_registry().build(grader_name, params)
    wants_reference = "reference" in grader.input_names().names

    class Sample(BaseModel):
        response: str
        reference: str = ""

    app = FastAPI()

    @app.post("/reward")
    async def reward(sample: Sample) -> dict[str, Any]:
        kwargs = {"response": sample.response}
        if wants_reference:
            kwargs["reference"] = sample.reference
        result = grader.evaluate(**kwargs)
        return {"reward": getattr(result, "score", None)}

    return app


async def serve_floor(preset: str, grpc_port: int, http_port: int) -> None:
    """The `floor` servers of the module docstring for a bench preset's grader, until the process is killed."""
    import grpc
    from aiohttp import web

    from .bench import PRESETS
    from .core.samples import Limits
    from .v1 import grading_pb2 as pb
    from .v1 import grading_pb2_grpc as pb_grpc

    bare = PRESETS[preset].bare()

    answered = 0

    class Floor(pb_grpc.GradingServiceServicer):
        async def Evaluate(self, request: Any, context: Any) -> Any:
            nonlocal answered
            answered += 1
            sample = request.sample
            bare({"response": sample.response, "reference": sample.reference})
            return pb.EvaluateResponse(reward=1.0)

    async def get_reward(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        bare({"response": body["query"][0], "reference": (body.get("labels") or [""])[0]})
        return web.json_response({"rewards": [1.0]})

    async def count(request: web.Request) -> web.Response:
        return web.Response(text=str(answered))

    # gRPC's own pending-call limit (1,000 by default) would cancel most of a crowd of 4,000 at once, cheaply:
    # raised as grpcgrade's server raises it, so that the floor answers every call too
    pending = Limits().max_pending_calls
    options = [("grpc.server.max_pending_requests", pending), ("grpc.server.max_pending_requests_hard_limit", pending)]
    server = grpc.aio.server(options=options)
    pb_grpc.add_GradingServiceServicer_to_server(Floor(), server)
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()
    app = web.Application()
    app.router.add_post("/get_reward", get_reward)
    app.router.add_get("/answered", count)  # gRPC calls answered: h2load checks HTTP statuses, not gRPC's
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", http_port, backlog=BACKLOG).start()
    await server.wait_for_termination()


def main() -> None:
    kind, grader, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if kind == "floor":
        asyncio.run(serve_floor(grader, int(sys.argv[4]), int(sys.argv[5])))
        return
    import uvicorn

    port = int(sys.argv[4])
    uvicorn.run(make_app(grader, params), host="127.0.0.1", port=port, log_level="warning", backlog=BACKLOG)


if __name__ == "__main__":
    main()
