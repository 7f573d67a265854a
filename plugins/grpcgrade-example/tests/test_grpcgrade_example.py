"""The example plugin as a trainer meets it: installed, loaded by a real server, called over gRPC.

Run from this directory with `pytest` once the package is installed (`pip install -e .`): the server
finds the plugin through its entry point, exactly as in production. The file name is unique on purpose,
so the service repository can collect every plugin's tests in one pytest run.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import version

import grpc
import pytest

from grpcgrade import GradingClient
from grpcgrade.testing import start_server
from grpcgrade.v1 import grading_pb2 as pb


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GradingClient]:
    server = start_server(tmp_path_factory.mktemp("example-server"), "--workers", "0", metrics=False)
    try:
        with server.client(timeout=30) as c:
            yield c
    finally:
        server.stop()


def score(client: GradingClient, sample: dict, grader: str, **params: object) -> pb.GraderResult:
    (result,) = client.evaluate(sample, [{"name": grader, "params": params}]).results
    assert not result.HasField("error"), result.error.message
    return result


def test_the_server_lists_the_plugin_and_its_graders(client: GradingClient) -> None:
    listing = client.list_graders()
    plugin = next(p for p in listing.plugins if p.name == "example")
    assert (plugin.distribution, plugin.version, plugin.status) == (
        "grpcgrade-example",
        version("grpcgrade-example"),
        "loaded",
    )
    assert sorted(plugin.graders) == ["mentions_reference", "shortest_first", "word_budget"]
    graders = {g.name: g for g in listing.graders}
    assert list(graders["word_budget"].aliases) == ["word-budget"]
    assert [(p.name, p.type, p.default.number_value) for p in graders["word_budget"].params] == [
        ("max_words", "int", 50)
    ]
    assert graders["shortest_first"].mode == pb.GRADER_MODE_LISTWISE
    assert graders["mentions_reference"].description == "1.0 when the reference appears in the response, else 0.0."


def test_word_budget_params_arrive_as_ints(client: GradingClient) -> None:
    sample = {"response": "one two three four"}
    assert score(client, sample, "word_budget").score == 1.0
    over = score(client, sample, "word-budget", max_words=3)  # by alias; JSON 3 arrives as 3.0
    assert over.score == pytest.approx(3 / 4)
    assert over.reason == "4 words, budget 3"


@pytest.mark.parametrize("bad", [0, 2.5])
def test_bad_params_are_refused_naming_the_param(client: GradingClient, bad: object) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.evaluate({"response": "x"}, [{"name": "word_budget", "params": {"max_words": bad}}])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_words" in err.value.details()


def test_mentions_reference(client: GradingClient) -> None:
    sample = {"response": "The capital is Paris.", "reference": "paris"}
    assert score(client, sample, "mentions_reference").score == 1.0
    assert score(client, sample, "mentions_reference", ignore_case=False).score == 0.0


def test_shortest_first_ranks_responses(client: GradingClient) -> None:
    reply = client.evaluate({"responses": ["a b c", "a", "a b", "z"]}, ["shortest_first"])
    assert list(reply.results[0].rank) == [4, 1, 3, 2]
    assert not reply.HasField("reward")  # a ranking is not a reward
