"""veRL's custom reward function, called the way veRL 0.9 calls it (tests/verl_calls.py), against a real
server."""

from __future__ import annotations

import asyncio
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from verl_calls import reward_loop, verl_wrap

from grpcgrade.client import AsyncGradingClient
from grpcgrade.integrations.verl import compute_score, compute_score_sync
from grpcgrade.testing import connections_to, eventually, start_server


def test_reward_loop_calls_are_coalesced_into_batch_calls(server):
    # A linger long enough that the whole step's calls arrive within it, however busy the machine: the
    # batches are then cut by max_batch alone (256 + 256 + 88).
    fn = verl_wrap(compute_score, {"target": server.target, "reward": "gsm8k", "max_batch": 256, "linger": 1.0})
    items = [
        ("gsm8k", f"<think>\nr\n</think>\n{72 if i % 2 else 71}", "#### 72", {"index": i, "completion_tokens": 10})
        for i in range(600)
    ]
    before = server.batch_calls()
    rewards, extra = reward_loop(fn, items)
    calls = server.batch_calls() - before
    assert calls == 3  # 600 samples, at most 256 per batch; never one call per sample
    assert rewards == [pytest.approx(1.0 if i % 2 else 0.5) for i in range(600)]
    assert extra["grpcgrade/failed"] == [0.0] * 600
    assert extra["grpcgrade/math_exact"] == [float(i % 2) for i in range(600)]
    assert set(extra) == {
        "score",
        "grpcgrade/failed",
        "grpcgrade/math_exact",
        "grpcgrade/number_only",
        "grpcgrade/think_format",
        "grpcgrade/completion_length_cap",
    }


def test_a_failed_sample_is_flagged_not_a_silent_zero(server):
    fn = verl_wrap(
        compute_score,
        {"target": server.target, "rewards": {"math": "gsm8k", "shouting": "flaky"}, "failure_score": -1.0},
    )
    items = [
        ("shouting", "HI", "hi", {}),
        ("shouting", "nan", "x", {}),  # misbehave returns NaN: an INVALID_RESULT, the reward absent
        ("math", "<think>\nr\n</think>\n72", "#### 72", {"completion_tokens": 3}),
    ]
    rewards, extra = reward_loop(fn, items)
    assert rewards == [1.0, -1.0, pytest.approx(1.0)]
    assert extra["grpcgrade/failed"] == [0.0, 1.0, 0.0]
    assert math.isnan(extra["grpcgrade/misbehave"][1]) and extra["grpcgrade/shout"][1] == 0.0
    assert math.isnan(extra["grpcgrade/shout"][2])  # not a grader of gsm8k: same keys for every sample
    assert all(len(v) == 3 for v in extra.values())


def test_sync_form_from_many_threads_is_coalesced_too(server):
    fn = verl_wrap(compute_score_sync, {"target": server.target, "reward": "flaky", "linger": 0.05})
    before = server.batch_calls()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: fn("d", "OK" if i % 2 else "ok", "ok", {"index": i}), range(64)))
    assert [r["score"] for r in results] == [1.0 if i % 2 else 0.5 for i in range(64)]
    assert server.batch_calls() - before < 64 / 4


def test_configuration_errors_are_raised(server):
    with pytest.raises(ValueError, match="exactly one"):
        reward_loop(verl_wrap(compute_score, {"target": server.target}), [("d", "x", "y", {})])
    with pytest.raises(ValueError, match="no reward for data_source 'other'"):
        fn = verl_wrap(compute_score, {"target": server.target, "rewards": {"d": "flaky"}})
        reward_loop(fn, [("other", "", "", {})])
    with pytest.raises(ValueError, match="no reward 'nope'"):
        reward_loop(verl_wrap(compute_score, {"target": server.target, "reward": "nope"}), [("d", "x", "y", {})])


def test_coalescer_answers_each_caller_and_a_failed_call_reaches_all_of_its_callers(server):
    async def go(graders, n):
        async with AsyncGradingClient(server.target) as client:
            coalescer = client.coalescer(graders, max_batch=4)
            calls = (coalescer.evaluate({"response": json.dumps(i)}) for i in range(n))
            return await asyncio.gather(*calls, return_exceptions=True), coalescer.batches

    results, batches = asyncio.run(go(["json_validator"], 10))
    assert batches == 3 and [r.results[0].score for r in results] == [1.0] * 10  # 4 + 4 + 2
    results, batches = asyncio.run(go(["no_such_grader"], 5))
    assert batches == 2
    assert all(isinstance(r, grpc.RpcError) and r.code() == grpc.StatusCode.NOT_FOUND for r in results)


def test_a_sample_the_client_cannot_send_fails_only_its_own_coalesced_caller(server):
    """One caller's sample holds text UTF-8 cannot encode: that caller gets the ValueError `evaluate` raises
    for it, and the other callers coalesced with it get their results. (Before, the batch's call could not
    be written, and every caller of its batch got that error.)"""

    async def go():
        async with AsyncGradingClient(server.target) as client:
            coalescer = client.coalescer(["json_validator"], max_batch=4)
            texts = ["\ud800" if i == 5 else json.dumps(i) for i in range(10)]
            calls = (coalescer.evaluate({"response": text}) for text in texts)
            return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(go())
    assert isinstance(results[5], ValueError) and "field 'response': text that UTF-8 cannot encode" in str(results[5])
    assert [r.results[0].score for i, r in enumerate(results) if i != 5] == [1.0] * 9


def test_a_sample_the_client_cannot_send_is_a_failed_sample_not_the_runs_end(server):
    """A solution or label UTF-8 cannot encode (a lone surrogate) is flagged failed with `failure_score`;
    veRL's reward loop does not catch exceptions, so the ValueError `compute_score` raised ended the run."""
    fn = verl_wrap(compute_score, {"target": server.target, "reward": "flaky", "failure_score": -1.0})
    items = [("d", "OK", "ok", {}), ("d", "OK\ud800", "ok", {}), ("d", "OK", "ok\udc80", {}), ("d", "ok", "ok", {})]
    rewards, extra = reward_loop(fn, items)
    assert rewards == [1.0, -1.0, -1.0, 0.5]
    assert extra["grpcgrade/failed"] == [0.0, 1.0, 1.0, 0.0]


def test_a_nan_label_is_a_missing_reference_not_a_text(server):
    """A parquet float column read through pandas holds NaN where a row has no answer: that ground truth is
    missing (math_exact, which requires a reference, fails the sample: flagged, its score NaN), as None
    is. Before, the reference was the text "NaN": graded, a reward nobody meant (failed 0.0)."""
    np = pytest.importorskip("numpy")
    fn = verl_wrap(compute_score, {"target": server.target, "reward": "gsm8k_text", "failure_score": -1.0})
    answer = "<think>\nr\n</think>\n72"
    items = [("d", answer, 72.0, {}), ("d", answer, float("nan"), {}), ("d", answer, np.float32("nan"), {})]
    rewards, extra = reward_loop(fn, [*items, ("d", answer, None, {})])
    assert extra["grpcgrade/failed"] == [0.0, 1.0, 1.0, 1.0]
    assert rewards[1:] == [-1.0] * 3 and rewards[0] == pytest.approx(1.0)
    assert [math.isnan(s) for s in extra["grpcgrade/math_exact"]] == [False, True, True, True]


def test_numpy_labels_and_extra_info_as_veRL_hands_them(server, caplog):
    """veRL's dataset values arrive as numpy (its DataProto holds non-tensor columns as object arrays): an
    `np.int64` label, a float label from a parquet float column, numpy values in `extra_info`. Each must
    grade as the plain value would: `compute_score` with the plain values is the reference."""
    np = pytest.importorskip("numpy")  # scikit-learn's dependency in the dev group: always there in the suite
    fn = verl_wrap(compute_score, {"target": server.target, "reward": "gsm8k"})
    answer = "<think>\nr\n</think>\n72"
    items = [
        ("gsm8k", answer, np.int64(72), {"index": np.int64(0), "completion_tokens": np.int64(10)}),
        ("gsm8k", answer, 72.0, {"index": 1, "completion_tokens": 10}),
        ("gsm8k", answer, np.float64(72.0), {"index": 2, "completion_tokens": np.int32(10)}),
        ("gsm8k", answer, np.array([72]), {"index": 3, "completion_tokens": 10}),
    ]
    plain = [("gsm8k", answer, "72", {"index": i, "completion_tokens": 10}) for i in range(4)]
    rewards, extra = reward_loop(fn, items)
    expected, _ = reward_loop(fn, plain)
    assert expected == [pytest.approx(1.0)] * 4  # math_exact, number_only, think_format all pass; no gate
    assert rewards == expected
    assert extra["grpcgrade/completion_length_cap"] == [1.0] * 4  # the numpy counts reached the gate
    # a value with no JSON form is dropped, and said so once per name
    caplog.clear()
    with caplog.at_level("WARNING", logger="grpcgrade.integrations"):
        reward_loop(fn, [("gsm8k", answer, "72", {"completion_tokens": 10, "blob_no_json": object()})] * 2)
    dropped = [r for r in caplog.records if "blob_no_json" in r.getMessage()]
    assert len(dropped) == 1 and "no JSON form" in dropped[0].getMessage()


def test_agent_loop_extra_fields_become_the_agent_inputs(server):
    """veRL's reward loop merges an agent loop's `extra_fields` (its `messages`, say) into `extra_info`;
    they reach the graders as the sample's `messages`, `tool_calls`, `tool_definitions`."""
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
    again = {**call, "id": "c2"}
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "x is here"},
        {"role": "assistant", "content": None, "tool_calls": [again]},
        {"role": "tool", "tool_call_id": "c2", "content": "x is here"},
    ]
    info = {"messages": messages, "tool_calls": [call, again], "tool_definitions": tools, "num_turns": 5}
    fn = verl_wrap(compute_score, {"target": server.target, "reward": "agent"})
    rewards, extra = reward_loop(fn, [("agent", "done", None, info)])
    assert extra["grpcgrade/failed"] == [0.0]
    assert extra["grpcgrade/tool_call_valid"] == [1.0]  # both calls valid against the tool's schema
    assert extra["grpcgrade/action_loop_detection"] == [0.0]  # the one pair of actions is the same call
    assert rewards == [pytest.approx(0.5)]


def test_the_batch_managers_plural_call(server):
    """veRL's `batch` reward manager (verl/workers/reward_manager/batch.py) calls the function once per step
    with plural keywords and numpy object arrays (`non_tensor_batch`), reward_kwargs merged in."""
    np = pytest.importorskip("numpy")
    from grpcgrade.integrations.verl import compute_score_batch

    fn = verl_wrap(compute_score_batch, {"target": server.target, "reward": "gsm8k_text"})
    answers = ["<think>\nr\n</think>\n72", "<think>\nr\n</think>\n71"]
    infos = np.array([{"index": 0}, {"index": 1}], dtype=object)
    results = fn(
        data_sources=np.array(["gsm8k", "gsm8k"], dtype=object),
        solution_strs=answers,
        ground_truths=[np.int64(72), np.int64(72)],
        extra_infos=infos,
    )
    single, _ = reward_loop(
        verl_wrap(compute_score, {"target": server.target, "reward": "gsm8k_text"}),
        [
            ("gsm8k", answers[0], "72", {"index": 0}),
            ("gsm8k", answers[1], "72", {"index": 1}),
        ],
    )
    assert [r["score"] for r in results] == single == [pytest.approx(1.0), pytest.approx(0.5)]
    assert [r["grpcgrade/failed"] for r in results] == [0.0, 0.0]
    floats = verl_wrap(compute_score_batch, {"target": server.target, "reward": "gsm8k_text", "scores_only": True})
    assert floats(data_sources=["d"], solution_strs=[answers[0]], ground_truths=["72"], extra_infos=[None]) == [
        pytest.approx(1.0)
    ]


def test_each_loops_client_is_closed_when_its_loop_ends(tmp_path, plugin_env):
    """A caller that runs each step on a loop of its own (`asyncio.run` per step, as `reward_loop` here):
    each loop's client is closed as that loop ends, so no connection to the server outlives its step (seen
    in this process's sockets). Before, every loop's client (and the loop) was kept open for the process's
    life, and a connection with them. A server of its own: the suite's has other tests' clients connected."""
    (tmp_path / "config.yaml").write_text("rewards:\n  loud:\n    graders: [{name: shout}]\n")
    server = start_server(tmp_path, "--workers", "0", "--config", "config.yaml", env=plugin_env)
    try:
        fn = verl_wrap(compute_score, {"target": server.target, "reward": "loud"})

        async def connected(**kwargs):  # the step's connections, counted while its loop runs
            result = await fn(**kwargs)
            return {**result, "open": connections_to(server.port, [os.getpid()])}

        for _ in range(3):
            rewards, extra = reward_loop(connected, [("d", "HEY", "hey", {}), ("d", "hey", "hey", {})])
            assert rewards == [1.0, 0.0] and min(extra["open"]) >= 1
            eventually(lambda: connections_to(server.port, [os.getpid()]) == 0, "the step's connection closed", 10)
    finally:
        server.stop()
