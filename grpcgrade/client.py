"""Python clients: `GradingClient` (blocking), `AsyncGradingClient` (asyncio) and `reward_function` (TRL).

Every call carries a deadline. UNAVAILABLE (and a draining server's CANCELLED) is retried by gRPC's own
retry policy (service config), and with several addresses or a `dns:///` name the channel balances
round-robin over the replicas, so a retried call lands on another one. Large batches are split into
chunks, several in flight, and the results come back in input order.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from grpcgrade.service.convert import sample_to_pb, specs_to_pb

from .v1 import grading_pb2 as pb
from .v1 import grading_pb2_grpc as pb_grpc

SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{"service": "grpcgrade.v1.GradingService"}],
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.1s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                # CANCELLED too: a draining server cancels calls that reached it but no handler yet
                # (grpc/grpc#41785); they never ran, so a retry on another replica is safe.
                "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
            },
        }
    ],
}

Target = str | Sequence[str]
Graders = Iterable[str | Mapping[str, Any] | pb.GraderSpec] | None
Progress = Callable[[int, int], None]


def channel_target(target: Target) -> str:
    """One address, a gRPC name (`dns:///svc:50051`), or several addresses balanced round-robin."""
    if isinstance(target, str):
        return target
    addresses = list(target)
    if len(addresses) == 1:
        return addresses[0]
    return "ipv4:" + ",".join(addresses)


def channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
        ("grpc.enable_retries", 1),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 60_000),
    ]


def result_to_dict(response: pb.EvaluateResponse) -> dict[str, Any]:
    """An EvaluateResponse as plain data (what `grpcgrade eval` writes)."""
    data = MessageToDict(response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    if not response.HasField("reward"):
        data["reward"] = None
    return data


def _chunks(items: Sequence[Any], size: int) -> list[tuple[int, Sequence[Any]]]:
    return [(start, items[start : start + size]) for start in range(0, len(items), size)]


class _Base:
    def __init__(
        self,
        target: Target,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        chunk_size: int = 1024,
        max_in_flight: int = 4,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.target = channel_target(target)
        self.timeout = timeout
        self.chunk_size = chunk_size
        self.max_in_flight = max_in_flight
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._credentials = credentials
        self._options = channel_options(max_message_bytes)

    @staticmethod
    def _evaluate_request(
        sample: Mapping[str, Any] | pb.Sample, graders: Graders, reward: str, grader_timeout: float, view: int
    ) -> pb.EvaluateRequest:
        return pb.EvaluateRequest(
            graders=specs_to_pb(graders),
            sample=sample_to_pb(sample),
            reward=reward,
            grader_timeout_seconds=grader_timeout,
            view=view,
        )

    @staticmethod
    def _missing(out: list[pb.EvaluateResponse | None]) -> list[pb.EvaluateResponse]:
        """Every sample must have come back; a gap is the server's bug, never silently a None."""
        missing = [i for i, r in enumerate(out) if r is None]
        if missing:
            raise RuntimeError(f"server returned no result for {len(missing)} samples (first index {missing[0]})")
        return out  # type: ignore[return-value]

    def _batch_request(
        self, samples: Sequence[Any], graders: Graders, reward: str, grader_timeout: float, view: int
    ) -> pb.BatchEvaluateRequest:
        return pb.BatchEvaluateRequest(
            graders=specs_to_pb(graders),
            samples=[sample_to_pb(s) for s in samples],
            reward=reward,
            grader_timeout_seconds=grader_timeout,
            view=view,
        )

    @staticmethod
    def _place(out: list[pb.EvaluateResponse | None], start: int, messages: Iterable[pb.BatchEvaluateResponse]) -> int:
        n = 0
        for message in messages:
            for item in message.items:
                out[start + item.index] = item.result
                n += 1
        return n


class GradingClient(_Base):
    """A blocking client; reuse one per process (it holds one channel)."""

    def __init__(self, target: Target, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        if self._credentials is not None:
            self.channel = grpc.secure_channel(self.target, self._credentials, options=self._options)
        else:
            self.channel = grpc.insecure_channel(self.target, options=self._options)
        self.stub = pb_grpc.GradingServiceStub(self.channel)

    def __enter__(self) -> GradingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def evaluate(
        self,
        sample: Mapping[str, Any] | pb.Sample,
        graders: Graders = None,
        reward: str = "",
        *,
        timeout: float | None = None,
        grader_timeout: float = 0.0,
        view: int = pb.RESULT_VIEW_FULL,
    ) -> pb.EvaluateResponse:
        request = self._evaluate_request(sample, graders, reward, grader_timeout, view)
        return self.stub.Evaluate(request, timeout=timeout or self.timeout, metadata=self._metadata)

    def batch_evaluate(
        self,
        samples: Sequence[Mapping[str, Any] | pb.Sample],
        graders: Graders = None,
        reward: str = "",
        *,
        timeout: float | None = None,
        grader_timeout: float = 0.0,
        view: int = pb.RESULT_VIEW_FULL,
        on_progress: Progress | None = None,
    ) -> list[pb.EvaluateResponse]:
        """One result per sample, in input order; raises grpc.RpcError if any chunk's call fails.

        `view=pb.RESULT_VIEW_SCORES` leaves out reasons and metadata: less work for both ends."""
        graders = list(graders or [])
        out: list[pb.EvaluateResponse | None] = [None] * len(samples)
        done = 0
        lock = threading.Lock()

        def run(start: int, part: Sequence[Any]) -> None:
            nonlocal done
            request = self._batch_request(part, graders, reward, grader_timeout, view)
            stream = self.stub.BatchEvaluate(request, timeout=timeout or self.timeout, metadata=self._metadata)
            got = self._place(out, start, stream)
            with lock:
                done += got
                if on_progress:
                    on_progress(done, len(samples))

        with ThreadPoolExecutor(self.max_in_flight) as executor:
            for future in [executor.submit(run, s, p) for s, p in _chunks(samples, self.chunk_size)]:
                future.result()
        return self._missing(out)

    def list_graders(self, *, timeout: float | None = None) -> pb.ListGradersResponse:
        return self.stub.ListGraders(pb.ListGradersRequest(), timeout=timeout or self.timeout, metadata=self._metadata)


class AsyncGradingClient(_Base):
    """An asyncio client; create it inside the running event loop."""

    def __init__(self, target: Target, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        if self._credentials is not None:
            self.channel = grpc.aio.secure_channel(self.target, self._credentials, options=self._options)
        else:
            self.channel = grpc.aio.insecure_channel(self.target, options=self._options)
        self.stub = pb_grpc.GradingServiceStub(self.channel)

    async def __aenter__(self) -> AsyncGradingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def evaluate(
        self,
        sample: Mapping[str, Any] | pb.Sample,
        graders: Graders = None,
        reward: str = "",
        *,
        timeout: float | None = None,
        grader_timeout: float = 0.0,
        view: int = pb.RESULT_VIEW_FULL,
    ) -> pb.EvaluateResponse:
        request = self._evaluate_request(sample, graders, reward, grader_timeout, view)
        return await self.stub.Evaluate(request, timeout=timeout or self.timeout, metadata=self._metadata)

    async def batch_evaluate(
        self,
        samples: Sequence[Mapping[str, Any] | pb.Sample],
        graders: Graders = None,
        reward: str = "",
        *,
        timeout: float | None = None,
        grader_timeout: float = 0.0,
        view: int = pb.RESULT_VIEW_FULL,
        on_progress: Progress | None = None,
    ) -> list[pb.EvaluateResponse]:
        graders = list(graders or [])
        out: list[pb.EvaluateResponse | None] = [None] * len(samples)
        gate = asyncio.Semaphore(self.max_in_flight)
        done = 0

        async def run(start: int, part: Sequence[Any]) -> None:
            nonlocal done
            async with gate:
                request = self._batch_request(part, graders, reward, grader_timeout, view)
                call = self.stub.BatchEvaluate(request, timeout=timeout or self.timeout, metadata=self._metadata)
                async for message in call:
                    done += self._place(out, start, [message])
                    if on_progress:
                        on_progress(done, len(samples))

        await asyncio.gather(*(run(s, p) for s, p in _chunks(samples, self.chunk_size)))
        return self._missing(out)

    async def list_graders(self, *, timeout: float | None = None) -> pb.ListGradersResponse:
        return await self.stub.ListGraders(
            pb.ListGradersRequest(), timeout=timeout or self.timeout, metadata=self._metadata
        )


def _text(completion: Any) -> str:
    """TRL passes plain strings, or conversations: a list of {"role", "content"} messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content", ""))
    return str(completion)


def reward_function(
    target: Target, graders: Graders = None, reward: str = "", **client_options: Any
) -> Callable[..., list[float | None]]:
    """A TRL-style reward function `reward(prompts, completions, **columns) -> list[float | None]`.

    Dataset columns arrive as keyword lists: `reference`, `answer` or `ground_truth` becomes the sample's
    reference, every other column goes into `extra`. A sample whose graders failed gets None, which TRL
    treats as a missing reward instead of a wrong one.
    """
    client = GradingClient(target, **client_options)
    graders = list(graders or [])

    def score(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float | None]:
        samples = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            row = {k: v[i] for k, v in columns.items() if isinstance(v, Sequence) and not isinstance(v, str)}
            reference = next((row.pop(k) for k in ("reference", "answer", "ground_truth") if k in row), "")
            extra = {k: v for k, v in row.items() if _json_safe(v)}
            samples.append(
                {"query": _text(prompt), "response": _text(completion), "reference": str(reference), "extra": extra}
            )
        results = client.batch_evaluate(samples, graders, reward, view=pb.RESULT_VIEW_SCORES)
        return [r.reward if r.HasField("reward") and math.isfinite(r.reward) else None for r in results]

    score.__name__ = f"grpcgrade_{reward or '_'.join(g if isinstance(g, str) else g['name'] for g in graders)}"
    return score


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
