"""What the batch tests share (tests/test_columns.py, tests/test_batch_unary.py): texts whose scores
`json.loads` gives, and real gRPC servers with a servicer of the tests' own (a server older than a part of
the contract)."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
from expected import json_score

from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc

TEXTS = ['{"a": 1}', "not json", "[1, 2]", "{'single': 'quotes'}", '"a string"', "", "NaN", "[1,]"]


def texts(n: int) -> list[str]:
    return [f'{{"i": {i}}}' if i % 3 else TEXTS[i % len(TEXTS)] for i in range(n)]


class OldServer(pb_grpc.GradingServiceServicer):
    """A real gRPC server that knows only the contract before columns: it reads `samples` and answers
    `items` (as for RESULT_VIEW_FULL), scoring each sample by `json.loads`."""

    def __init__(self) -> None:
        self.requests: list[pb.BatchEvaluateRequest] = []
        self.lock = threading.Lock()

    def BatchEvaluate(self, request, context):
        with self.lock:
            self.requests.append(request)
        old = pb.BatchEvaluateRequest.FromString(request.SerializeToString())
        old.ClearField("columns")  # what a server without the field sees: nothing there
        for index, sample in enumerate(old.samples):
            score = json_score(sample.response)
            result = pb.EvaluateResponse(
                id=sample.id, results=[pb.GraderResult(key="json_validator", grader="json_validator", score=score)]
            )
            result.reward = score
            yield pb.BatchEvaluateResponse(items=[pb.BatchItem(index=index, result=result)])


def serve(servicer: pb_grpc.GradingServiceServicer) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_GradingServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"
