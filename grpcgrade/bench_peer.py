"""The peer of `grpcgrade bench --per-sample`: the plain FastAPI per-sample reward server users write.

One process, uvicorn, an `async def` endpoint that grades the posted sample with the same grader (built
from this installation's registry, with the same parameters) and answers its score. `async def` rather
than `def`: FastAPI runs a `def` endpoint on a thread pool, which is slower for work this short, and the
comparison should be with the peer at its best.

    python -m grpcgrade.bench_peer GRADER PARAMS_JSON PORT
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint's annotations at run time, and the
# body model is local to `make_app`.
import json
import sys
from typing import Any


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


def main() -> None:
    import uvicorn

    grader, params, port = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    uvicorn.run(make_app(grader, params), host="127.0.0.1", port=port, log_level="warning", backlog=8192)


if __name__ == "__main__":
    main()
