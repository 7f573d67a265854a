"""A loopback OpenAI-compatible endpoint with canned answers, for the OpenAI grader tests.

Each test registers the reply it wants and gets a marker to put into the grader's prompt; the endpoint finds
the marker in the request's messages and answers with that reply. `/embeddings` requests get the vector
listed for each text in `VECTORS`.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from http_services import Service, http_service

USAGE = {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}
EMBEDDING_USAGE = {"prompt_tokens": 4, "total_tokens": 4}
VECTORS = {"cat": [1.0, 0.0], "kitten": [0.6, 0.8], "dog": [0.0, 1.0], "void": [0.0, 0.0]}
#: Embeddings as wide as OpenAI's text-embedding-3-large (3,072 dimensions, ~60 kB of JSON each): an answer
#: the endpoint's HTTP stack delivers in several reads.
WIDE = 3072
VECTORS["wide-sin"] = [math.sin(i) for i in range(WIDE)]
VECTORS["wide-cos"] = [math.cos(i) for i in range(WIDE)]
#: The endpoint writes its answers in pieces of this size, a moment apart, as a network delivers them.
PIECE = 16 * 1024
_MARKER = re.compile(r"CASE-[0-9a-f]{12}")


def answer(result: Any, steps: list[dict[str, str]] | None = None) -> str:
    """A judge's structured answer, as OpenAI's model graders ask for it."""
    return json.dumps({"steps": steps or [{"description": "compared", "conclusion": "done"}], "result": result})


class Judge:
    def __init__(self) -> None:
        self.replies: dict[str, tuple[int, Any]] = {}
        self.service: Service | None = None

    @property
    def base_url(self) -> str:
        assert self.service is not None
        return self.service.url.removesuffix("/grade") + "/v1"

    def reply(self, content: str | None = None, *, status: int = 200, refusal: str | None = None) -> str:
        """A marker whose requests get this reply: a completion with `content` (or a refusal), or an error."""
        marker = f"CASE-{uuid.uuid4().hex[:12]}"
        if status != 200:
            body: Any = {"error": {"message": "the judge is unhappy"}}
        else:
            message = {"role": "assistant", "content": content, "refusal": refusal}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            body = {"id": "c1", "object": "chat.completion", "model": "judge-x", "choices": [choice], "usage": USAGE}
        self.replies[marker] = (status, body)
        return marker

    def requests(self, marker: str) -> list[tuple[str, dict[str, Any]]]:
        """(path, body) of every request that carried `marker`."""
        assert self.service is not None
        with self.service.lock:
            pairs = list(zip(self.service.paths, self.service.requests, strict=True))
        return [(path, body) for path, body in pairs if marker in json.dumps(body)]

    def embedding_requests(self) -> list[tuple[str, dict[str, Any]]]:
        assert self.service is not None
        with self.service.lock:
            pairs = list(zip(self.service.paths, self.service.requests, strict=True))
        return [(path, body) for path, body in pairs if "input" in body]

    def behave(self, number: int, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        if "input" in body:
            data = [{"object": "embedding", "index": i, "embedding": VECTORS[t]} for i, t in enumerate(body["input"])]
            return 200, {"object": "list", "data": data, "model": body["model"], "usage": EMBEDDING_USAGE}, {}
        found = _MARKER.search(json.dumps(body["messages"]))
        if found is None or found.group() not in self.replies:
            return 400, {"error": {"message": "no canned reply for this request"}}, {}
        status, reply = self.replies[found.group()]
        return status, reply, {}


@contextmanager
def running_judge() -> Iterator[Judge]:
    judge = Judge()
    with http_service(judge.behave, piece=PIECE) as service:
        judge.service = service
        yield judge


def models_section(judge: Judge) -> dict[str, Any]:
    """`models:` naming the judge the way grader configs name OpenAI's models, plus an embedding model."""
    common = {"base_url": judge.base_url, "max_retries": 0, "timeout_seconds": 10}
    return {
        "gpt-4o-2024-08-06": {**common, "model": "judge-x"},
        "o3-mini": {**common, "model": "judge-y"},
        "embedding": {**common, "model": "embed-x"},
    }
