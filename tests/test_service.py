"""The service end to end: a real server process, called over gRPC on loopback."""

from __future__ import annotations

import asyncio
import enum
import json

import grpc
import pytest
from google.protobuf.struct_pb2 import Struct
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from rapidfuzz import fuzz

from grpcgrade import AsyncGradingClient, reward_function
from grpcgrade.service.structs import fill_struct, struct_to_dict
from grpcgrade.testing import health_status
from grpcgrade.v1 import grading_pb2 as pb
from grpcgrade.v1 import grading_pb2_grpc as pb_grpc


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_health_is_serving_for_server_and_service(server):
    assert health_status(server.target) == health_pb2.HealthCheckResponse.SERVING
    assert health_status(server.target, "grpcgrade.v1.GradingService") == health_pb2.HealthCheckResponse.SERVING
    assert health_status(server.target, "no.such.Service") is None  # NOT_FOUND


def test_reflection_describes_the_service(server):
    with grpc.insecure_channel(server.target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = db.get_services()
        assert "grpcgrade.v1.GradingService" in services
        assert "grpc.health.v1.Health" in services
        desc = db.FindFileContainingSymbol("grpcgrade.v1.GradingService")
        methods = [m.name for m in desc.service[0].method]
    assert methods == ["Evaluate", "BatchEvaluate", "BatchEvaluateUnary", "ListGraders"]


def test_list_graders_names_plugins_versions_and_params(client):
    listing = client.list_graders()
    graders = {g.name: g for g in listing.graders}
    for name in ("json_validator", "similarity", "string_match", "math_exact", "think_format"):
        assert graders[name].distribution == "grpcgrade"
    length = {p.name: p for p in graders["length_penalty"].params}
    assert length["min_length"].default.number_value == 10
    assert length["max_length"].default.number_value == 1000
    shout = graders["shout"]
    assert (shout.plugin, shout.distribution, shout.version) == ("testplugin", "grpcgrade-testplugin", "0.3.1")
    assert shout.description == "1.0 when the response is the reference in capitals."
    assert graders["longest_first"].mode == pb.GRADER_MODE_LISTWISE
    assert [p.name for p in graders["count_word"].params] == ["word"]
    plugins = {p.name: p for p in listing.plugins}
    assert plugins["broken"].status == "failed"
    assert "grpcgrade_dependency_that_does_not_exist" in plugins["broken"].error
    assert plugins["testplugin"].status == "loaded"
    assert sorted(plugins["testplugin"].graders) == [
        "attentive",
        "count_rpc",
        "count_word",
        "id_number",
        "longest_first",
        "mentions",
        "misbehave",
        "napper",
        "odd_ranks",
        "odd_ranks_fn",
        "overlap",
        "shout",
        "sleepy",
        "tidy",
        "tool_call_names",
        "typed_length",
        "warmed",
    ]
    assert [r.name for r in listing.rewards] == ["agent", "flaky", "gsm8k", "gsm8k_text"]


def test_evaluate_with_a_plugin_grader(client):
    reply = client.evaluate({"id": "s1", "response": "HELLO", "reference": "hello", "extra": {"unused": 1}}, ["shout"])
    assert reply.id == "s1"
    (result,) = reply.results
    assert (result.key, result.grader, result.score, result.reason) == ("shout", "shout", 1.0, "shouted")
    assert not result.HasField("error")
    assert reply.reward == 1.0


def test_function_grader_takes_params_and_declared_inputs_only(client):
    sample = {"response": "grpc is grpc and x x x", "query": "q", "extra": {"other": [1, 2]}}
    graders = [{"name": "count_word"}, {"name": "count_word", "key": "x", "params": {"word": "x"}}]
    reply = client.evaluate(sample, graders)
    assert [(r.key, r.score) for r in reply.results] == [("count_word", 2.0), ("x", 3.0)]
    assert reply.reward == pytest.approx(2.5)


def test_listwise_grader_returns_ranks_and_no_reward(client):
    reply = client.evaluate({"responses": ["aa", "a", "aaaa"]}, ["longest_first"])
    assert list(reply.results[0].rank) == [2, 3, 1]
    assert not reply.HasField("reward")


def test_weighted_reward_with_gate(client):
    graders = [
        {"name": "count_word", "key": "grpc", "weight": 3},
        {"name": "count_word", "key": "x", "params": {"word": "x"}, "weight": 1},
        {"name": "shout", "gate": True},
    ]
    ok = client.evaluate({"response": "GRPC grpc x", "reference": "grpc grpc x"}, graders)
    assert ok.reward == pytest.approx(0.0)  # the gate: "GRPC grpc x" is not the reference in capitals
    ok = client.evaluate({"response": "X", "reference": "x"}, graders)
    assert ok.reward == pytest.approx(1.0 * (3 * 0 + 1 * 0) / 4)
    ok = client.evaluate({"response": "GRPC", "reference": "grpc"}, [*graders[:2], graders[2]])
    assert ok.reward == pytest.approx((3 * 0 + 0) / 4)


def test_configured_reward_by_name(client):
    sample = {"response": "<think>\nr\n</think>\n72", "reference": "#### 72", "extra": {"completion_tokens": 50}}
    reply = client.evaluate(sample, reward="gsm8k")
    assert [r.key for r in reply.results] == ["math_exact", "number_only", "think_format", "completion_length_cap"]
    assert reply.reward == pytest.approx(1.0)
    too_long = client.evaluate({**sample, "extra": {"completion_tokens": 500}}, reward="gsm8k")
    assert too_long.reward == pytest.approx(0.2)


def test_unknown_grader_is_not_found_with_suggestions(client):
    with pytest.raises(grpc.RpcError) as err:
        client.evaluate({"response": "{}"}, ["json_validatr"])
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "json_validatr" in err.value.details() and "json_validator" in err.value.details()


def test_unknown_reward_is_not_found(client):
    with pytest.raises(grpc.RpcError) as err:
        client.evaluate({"response": "1"}, reward="gsm8")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "gsm8k" in err.value.details()


@pytest.mark.parametrize(
    ("spec", "param"),
    [
        ({"name": "length_penalty", "params": {"min_len": 3}}, "min_len"),
        ({"name": "similarity", "params": {"algorithm": "nope"}}, "algorithm"),
        ({"name": "count_word", "weight": -1}, "weight"),
        ({"name": "completion_length_cap", "params": {}}, "max_completion_tokens"),
    ],
)
def test_bad_params_are_invalid_argument_naming_the_param(client, spec, param):
    with pytest.raises(grpc.RpcError) as err:
        client.evaluate({"response": "x"}, [spec])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert param in err.value.details()


def test_duplicate_keys_and_both_reward_and_graders_are_refused(client):
    # (one grader twice *without* keys is accepted, as name and name#2: see test_fidelity.py)
    twice = [{"name": "shout", "key": "k"}, {"name": "shout", "key": "k"}]
    for kwargs in ({"graders": twice}, {"graders": ["shout"], "reward": "gsm8k"}, {"graders": []}):
        with pytest.raises(grpc.RpcError) as err:
            client.evaluate({"response": "x"}, **kwargs)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_one_bad_sample_costs_no_other_sample_its_result(client):
    samples = [
        {"response": "kitten", "reference": "sitting"},
        {"response": "kitten", "reference": "sitting", "extra": {"method": "nope"}},  # per-sample bad param
        {"response": "x", "reference": "y", "extra": {"response": "collides"}},
        {"response": "abc", "reference": "abc"},
    ]
    graders = [{"name": "similarity", "params": {"algorithm": "fuzzy_match"}}, "shout"]
    replies = client.batch_evaluate(samples, graders)
    assert replies[0].results[0].score == pytest.approx(fuzz.ratio("kitten", "sitting") / 100)
    assert replies[0].HasField("reward")
    assert replies[3].results[0].score == 1.0
    bad, fine = replies[1].results
    assert bad.error.code == "GRADER_FAILED" and "nope" in bad.error.message
    assert fine.score == 0.0 and not fine.HasField("error")
    assert not replies[1].HasField("reward")
    for r in replies[2].results:
        assert r.error.code == "INVALID_SAMPLE" and "response" in r.error.message
    assert not replies[2].HasField("reward")


def test_scores_view_keeps_scores_ranks_errors_and_rewards_and_drops_reasons_and_metadata(client):
    samples = [
        {"id": "a", "response": '{"k": 1}', "responses": ["a", "ccc", "bb"]},
        {"id": "b", "response": "{nope", "responses": ["x", "y"]},
        {"id": "c", "response": "[]", "extra": {"response": "collides"}},
    ]
    graders = ["json_validator", "longest_first"]
    full = client.batch_evaluate(samples, graders)
    scores = client.batch_evaluate(samples, graders, view=pb.RESULT_VIEW_SCORES)
    assert full[0].results[0].metadata["is_valid"] is True and full[1].results[0].reason  # what the view drops
    for f, s in zip(full, scores, strict=True):
        assert s.id == f.id
        assert s.HasField("reward") == f.HasField("reward") and s.reward == f.reward
        for fr, sr in zip(f.results, s.results, strict=True):
            assert (sr.key, sr.grader, sr.score, list(sr.rank)) == (fr.key, fr.grader, fr.score, list(fr.rank))
            assert (sr.error.code, sr.error.message) == (fr.error.code, fr.error.message)
            assert sr.reason == "" and not sr.metadata.fields
    assert [r.score for r in scores[0].results][:1] == [1.0] and list(scores[0].results[1].rank) == [3, 1, 2]
    assert scores[2].results[0].error.code == "INVALID_SAMPLE"
    one = client.evaluate(samples[1], ["json_validator"], view=pb.RESULT_VIEW_SCORES)
    assert one.results[0].score == 0.0 and one.reward == 0.0 and not one.results[0].reason


def test_batch_of_ten_thousand_returns_every_index_once(server):
    samples = [{"id": f"s{i}", "response": json.dumps({"a": i}) if i % 3 else "{broken"} for i in range(10_000)]
    request = pb.BatchEvaluateRequest(graders=[pb.GraderSpec(name="json_validator")], chunk_size=500)
    for s in samples:
        request.samples.add(id=s["id"], response=s["response"])
    seen: dict[int, pb.EvaluateResponse] = {}
    messages = 0
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.GradingServiceStub(channel)
        for message in stub.BatchEvaluate(request, timeout=120):
            messages += 1
            for item in message.items:
                assert item.index not in seen
                seen[item.index] = item.result
    assert sorted(seen) == list(range(10_000))
    assert messages == 20
    for i, s in enumerate(samples):
        assert seen[i].id == s["id"]
        assert seen[i].results[0].score == float(is_json(s["response"]))


def test_client_batches_keep_input_order_across_chunks(server):
    samples = [{"response": ("X" if i % 2 else "x") * (i % 7), "reference": "x" * (i % 7)} for i in range(2_500)]
    with server.client(chunk_size=300, max_in_flight=3) as c:
        replies = c.batch_evaluate(samples, ["shout"])
    assert [r.results[0].score for r in replies] == [float(i % 2 == 1 or i % 7 == 0) for i in range(2_500)]


def test_async_client(server):
    async def run():
        async with AsyncGradingClient(server.target, chunk_size=64) as c:
            one = await c.evaluate({"response": "A", "reference": "a"}, ["shout"])
            many = await c.batch_evaluate([{"response": str(i)} for i in range(200)], ["json_validator"])
            return one, many

    one, many = asyncio.run(run())
    assert one.results[0].score == 1.0
    assert len(many) == 200 and all(r.results[0].score == 1.0 for r in many)


def test_trl_reward_function(server):
    reward = reward_function(server.target, reward="gsm8k")
    prompts = ["What is 8*9?", [{"role": "user", "content": "8*9?"}]]
    completions = ["<think>\nr\n</think>\n72", [{"role": "assistant", "content": "<think>\nr\n</think>\n71"}]]
    scores = reward(prompts, completions, answer=["#### 72", "#### 72"], completion_tokens=[10, 10])
    assert scores == [pytest.approx(1.0), pytest.approx(0.5)]


def test_trl_reward_function_takes_every_kind_of_grader_spec(server):
    graders = ["json_validator", {"name": "shout"}, pb.GraderSpec(name="count_word")]
    reward = reward_function(server.target, graders=graders)
    assert reward.__name__ == "grpcgrade_json_validator_shout_count_word"
    assert reward(["q"], ["{}"], reference=["x"]) == [pytest.approx(1 / 3)]  # json_validator 1, others 0


def test_a_negative_weight_is_a_penalty_term(client):
    graders = [{"name": "count_word", "weight": 3}, {"name": "shout", "weight": -1}]
    reply = client.evaluate({"response": "GRPC", "reference": "grpc"}, graders)  # count_word 0, shout 1
    assert reply.reward == pytest.approx((3 * 0.0 - 1 * 1.0) / (3 - 1))
    with pytest.raises(grpc.RpcError) as err:
        client.evaluate({"response": "x"}, [{"name": "count_word", "weight": 1}, {"name": "shout", "weight": -1}])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "sum to 0" in err.value.details()


def test_metadata_of_any_shape_keeps_its_values():
    """What a grader may put in metadata beyond JSON's types: each value as the nearest thing a Struct holds."""

    class Colour(enum.Enum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 3

    class Opaque:
        def __str__(self) -> str:
            return "opaque"

    target = Struct()
    values = {"t": (1, "a"), "s": frozenset({2}), "e": Colour.RED, "i": Level.HIGH, "o": Opaque(), 7: None}
    fill_struct(target, {**values, "d": {}, "l": []})
    assert struct_to_dict(target) == {
        "t": [1, "a"], "s": [2], "e": "red", "i": 3, "o": "opaque", "7": None, "d": {}, "l": []
    }  # fmt: skip
