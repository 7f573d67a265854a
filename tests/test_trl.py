"""TRL's reward-function call, made exactly as TRL 1.16 makes it, against a real server.

`trl_rewards` below follows `GRPOTrainer._calculate_rewards` (trl/trainer/grpo_trainer.py): every input
column but prompt/completion/completion_ids becomes a keyword list, plus trainer_state, log_extra and
log_metric (and environments when set); async reward functions are awaited together on a loop running in
another thread (TRL's `self.async_loop`), and a None reward becomes NaN.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import threading
from collections import defaultdict
from typing import Any

import pytest

from grpcgrade.integrations.trl import async_reward_function, reward_function, reward_functions
from grpcgrade.testing import connections_to, eventually, start_server
from grpcgrade.v1 import grading_pb2 as pb


class FakeTrainerLog:
    """Collects what reward functions log through TRL's `log_metric` / `log_extra` (TRL appends likewise)."""

    def __init__(self) -> None:
        self.metrics: dict[str, list[float]] = defaultdict(list)
        self.extra: dict[str, list[Any]] = defaultdict(list)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics[name].append(value)

    def log_extra(self, column: str, values: list) -> None:
        self.extra[column].extend(values)


def trl_rewards(funcs, inputs, prompts, completions, completion_ids, log=None, environments=None):
    """rewards_per_func as TRL computes it: one row per completion, one column per reward function."""
    log = log or FakeTrainerLog()
    keys = [key for key in inputs[0] if key not in ["prompt", "completion", "completion_ids"]]
    reward_kwargs = {key: [example[key] for example in inputs] for key in keys}
    reward_kwargs["trainer_state"] = object()
    reward_kwargs["log_extra"] = log.log_extra
    reward_kwargs["log_metric"] = log.log_metric
    if environments is not None:
        reward_kwargs["environments"] = environments
    columns: list[list[float]] = [[] for _ in funcs]
    pending = []
    for i, func in enumerate(funcs):
        if inspect.iscoroutinefunction(func):
            pending.append((i, func))
            continue
        out = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **reward_kwargs)
        columns[i] = [r if r is not None else math.nan for r in out]
    if pending:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()

        async def run_all():
            async def one(i, func):
                kw = dict(prompts=prompts, completions=completions, completion_ids=completion_ids)
                out = await func(**kw, **reward_kwargs)
                return i, [r if r is not None else math.nan for r in out]

            return await asyncio.gather(*(one(i, f) for i, f in pending))

        try:
            for i, out in asyncio.run_coroutine_threadsafe(run_all(), loop).result(60):
                columns[i] = out
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
    return [list(row) for row in zip(*columns, strict=True)]


def same(a: list[float], b: list[float]) -> bool:
    pairs = zip(a, b, strict=True)
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == pytest.approx(y) for x, y in pairs)


GSM8K = ("<think>\nreasoning\n</think>\n72", "<think>\nreasoning\n</think>\n71")


def test_standard_dataset_with_completion_ids_gets_full_reward(server):
    """gsm8k is gated on completion_tokens <= 200: derived from completion_ids, not sent as ids."""
    reward = reward_function(server.target, reward="gsm8k")
    inputs = [{"prompt": "What is 8*9?", "answer": "#### 72"}] * 2
    ids = [list(range(40)), list(range(40))]
    rows = trl_rewards([reward], inputs, ["What is 8*9?"] * 2, list(GSM8K), ids)
    # math_exact x2, number_only, think_format; all pass for 72; 71 fails math_exact only: (0+1+1)/4.
    assert [r[0] for r in rows] == [pytest.approx(1.0), pytest.approx(0.5)]
    long_ids = [list(range(500))] * 2  # over the 200-token cap: min_reward 0.2 gates the mean
    rows = trl_rewards([reward], inputs, ["What is 8*9?"] * 2, list(GSM8K), long_ids)
    assert [r[0] for r in rows] == [pytest.approx(0.2), pytest.approx(0.1)]


@pytest.mark.parametrize(
    "column", ["query", "response", "context", "responses", "ground_truth", "reference_response", "sample_id"]
)
def test_a_column_named_like_a_sample_field_never_fails_the_batch(server, column):
    reward = reward_function(server.target, reward="gsm8k")
    inputs = [{"prompt": "q", "answer": "#### 72", column: ["x"] if column == "responses" else "x"}] * 2
    rows = trl_rewards([reward], inputs, ["q", "q"], list(GSM8K), [[1], [1]])
    assert [r[0] for r in rows] == [pytest.approx(1.0), pytest.approx(0.5)]


def test_unusable_column_values_are_dropped_and_grader_columns_reach_extra(server):
    reward = reward_function(server.target, ["count_word"])
    inputs = [{"prompt": "p", "word": "cat", "image": object(), "score": math.nan}, {"prompt": "p", "word": "dog"}]
    inputs[1].update(image=object(), score=1.0)
    rows = trl_rewards([reward], inputs, ["p", "p"], ["cat cat dog", "cat cat dog"], [[1], [1]])
    assert [r[0] for r in rows] == [2.0, 1.0]  # `word` went to extra and count_word read it


def test_column_mapping_defaults_and_override(server):
    shout = reward_function(server.target, ["shout"])  # response == reference.upper()
    inputs = [{"prompt": "p", "ground_truth": "abc", "answer": "xyz"}]
    assert trl_rewards([shout], inputs, ["p"], ["XYZ"], [[1]]) == [[1.0]]  # answer outranks ground_truth
    remapped = reward_function(server.target, ["shout"], columns={"ground_truth": "reference"})
    assert trl_rewards([remapped], inputs, ["p"], ["ABC"], [[1]]) == [[1.0]]
    with pytest.raises(ValueError, match="maps to one of"):
        reward_function(server.target, ["shout"], columns={"label": "response"})


def test_sample_id_comes_from_the_id_column(server):
    reward = reward_function(server.target, ["id_number"])
    inputs = [{"prompt": "p", "id": 41}, {"prompt": "p", "id": "7"}]
    assert trl_rewards([reward], inputs, ["p", "p"], ["a", "b"], [[1], [1]]) == [[41.0], [7.0]]


def test_conversational_completions(server):
    """Shapes TRL builds: parse_response output (reasoning split out, tool_calls, content None), tool loops
    appending tool and assistant messages, content as a list of blocks."""
    think = reward_function(server.target, ["think_format"])
    tools = reward_function(server.target, [{"name": "tool_call_names", "params": {"expected": "add,mul"}}])
    exact = reward_function(server.target, ["math_exact"])
    call = lambda name: {"type": "function", "function": {"name": name, "arguments": {"a": 1}}}  # noqa: E731
    prompt = [{"role": "user", "content": "8*9?"}]
    completions = [
        [{"role": "assistant", "content": "72", "reasoning_content": "8*9 is 72"}],
        [
            {"role": "assistant", "content": None, "tool_calls": [call("add")]},
            {"role": "tool", "name": "add", "content": "2"},
            {"role": "assistant", "content": None, "tool_calls": [call("mul")]},
            {"role": "tool", "name": "mul", "content": "72"},
            {"role": "assistant", "content": [{"type": "text", "text": "<think>\nok\n</think>\n7"}, {"text": "2"}]},
        ],
        [{"role": "assistant", "content": None}],
    ]
    inputs = [{"prompt": prompt, "answer": "#### 72"}] * 3
    rows = trl_rewards([think, tools, exact], inputs, [prompt] * 3, completions, [[1]] * 3)
    assert rows[0] == [1.0, 0.0, 1.0]  # reasoning put back in <think> tags; no tool calls
    assert rows[1][1:] == [1.0, 1.0]  # both turns' tool calls in order; text blocks joined into "72"
    assert rows[2][2] == 0.0  # content None is no text, not the string "None"


def test_extra_columns_leave_the_token_count_derived_from_completion_ids(server):
    """`extra_columns` narrows the dataset's columns; the count TRL's completion_ids give is no column. Before,
    naming any column dropped it, and gsm8k's length gate read the missing count as over the cap (x0.2)."""
    reward = reward_function(server.target, reward="gsm8k", extra_columns=["difficulty"])
    inputs = [{"prompt": "q", "answer": "#### 72", "difficulty": 3}] * 2
    rows = trl_rewards([reward], inputs, ["q", "q"], [GSM8K[0]] * 2, [[1], [1] * 300])
    assert [r[0] for r in rows] == [pytest.approx(1.0), pytest.approx(0.2)]


def test_a_failed_grader_masks_the_sample_and_is_logged(server):
    reward = reward_function(server.target, ["shout", "json_validator"])
    log = FakeTrainerLog()
    inputs = [{"prompt": "p", "answer": "a"}, {"prompt": "p", "answer": "x" * 10}]
    # shout 1 and json_validator 0, then shout 0 and json_validator 1: nothing failed, nothing masked.
    rows = trl_rewards([reward], inputs, ["p", "p"], ["A", "1"], [[1], [1]], log=log)
    assert rows[0][0] == pytest.approx(0.5) and rows[1][0] == pytest.approx(0.5)  # ok, ok
    misbehave = reward_function(server.target, [{"name": "misbehave", "params": {"heavy": False}}])
    rows = trl_rewards([misbehave], [{"prompt": "p"}] * 3, ["p"] * 3, ["ok", "nan", "ok"], [[1]] * 3, log=log)
    assert same([r[0] for r in rows], [1.0, math.nan, 1.0])
    assert log.metrics["grpcgrade/masked"] == [0.0, 1.0]
    assert log.metrics["grpcgrade/misbehave"] == [1.0]
    assert log.extra["grpcgrade/misbehave"] == [1.0, None, 1.0]
    assert log.extra["grpcgrade/shout"] == [1.0, 0.0]


def test_a_sample_the_client_cannot_send_is_masked_not_the_steps_end(server):
    """A dataset value UTF-8 cannot encode (a lone surrogate: JSON cut between a surrogate pair's halves, as
    JavaScript's string lengths do) masks its completion; the others are graded. It ended the step."""
    reward = reward_function(server.target, ["json_validator"])
    log = FakeTrainerLog()
    inputs = [{"prompt": "p", "answer": "a"}, {"prompt": "p", "answer": "\ud83d"}, {"prompt": "p", "answer": "b"}]
    rows = trl_rewards([reward], inputs, ["p"] * 3, ['{"k": 1}'] * 3, [[1]] * 3, log=log)
    assert same([r[0] for r in rows], [1.0, math.nan, 1.0])
    assert log.metrics["grpcgrade/masked"] == [1.0]


def test_a_nan_answer_is_missing_and_masks_its_completion(server):
    """A dataset's numeric answer column holds NaN where a row has none (pandas): the reference is missing,
    so math_exact fails that completion and TRL masks it, as for None. Before, it was graded against "NaN"."""
    reward = reward_function(server.target, reward="gsm8k_text")
    answer = "<think>\nr\n</think>\n72"
    inputs = [{"prompt": "p", "answer": 72.0}, {"prompt": "p", "answer": float("nan")}]
    rows = trl_rewards([reward], inputs, ["p"] * 2, [answer] * 2, [[1]] * 2)
    assert rows[0][0] == pytest.approx(1.0) and math.isnan(rows[1][0])


def trl_sum(rows: list[list[float]], weights: list[float] | None = None) -> list[float]:
    """The reward TRL trains on from rewards_per_func (`sum_then_normalize`, `_generate_and_score_completions`
    in grpo_trainer.py): each function's value times its reward weight, summed with `nansum` (a NaN counts
    as 0), and NaN (unscorable, masked) only where every function gave NaN."""
    out = []
    for row in rows:
        w = weights or [1.0] * len(row)
        nan = all(math.isnan(x) for x in row)
        out.append(math.nan if nan else sum(wi * x for wi, x in zip(w, row, strict=True) if not math.isnan(x)))
    return out


def test_several_reward_functions_from_one_server_call_add_up_to_the_reward(server):
    """One function per grader but the gate, each its share of the reward: Kolibrify's weights normalised
    (2, 1, 1 -> 0.5, 0.25, 0.25) times the gate (x0.2 past 200 tokens), so TRL's sum is the reward. Before,
    each returned its raw score, and TRL's sum (4 and 2.2 here) added the gate in, where it multiplies."""
    funcs = reward_functions(server.target, reward="gsm8k")
    assert [f.__name__ for f in funcs] == ["grpcgrade_math_exact", "grpcgrade_number_only", "grpcgrade_think_format"]
    before = server.batch_calls()
    inputs = [{"prompt": "q", "answer": "#### 72"}] * 2
    rows = trl_rewards(funcs, inputs, ["q", "q"], list(GSM8K), [[1], [1] * 300])
    assert server.batch_calls() == before + 1
    assert rows[0] == pytest.approx([0.5, 0.25, 0.25]) and rows[1] == pytest.approx([0.0, 0.05, 0.05])
    whole = trl_rewards(
        [reward_function(server.target, reward="gsm8k")], inputs, ["q", "q"], list(GSM8K), [[1], [1] * 300]
    )
    assert trl_sum(rows) == pytest.approx([r[0] for r in whole])


def test_several_reward_functions_mask_a_sample_together(server):
    """A sample whose reward is absent (misbehave failed on "nan") is None in every function, so TRL masks
    it. Before, only the failed grader's function said None, and TRL added the others' scores: a reward."""
    funcs = reward_functions(server.target, reward="flaky")
    inputs = [{"prompt": "p", "answer": "ok"}] * 2
    rows = trl_rewards(funcs, inputs, ["p", "p"], ["OK", "nan"], [[1], [1]])
    whole = trl_rewards([reward_function(server.target, reward="flaky")], inputs, ["p", "p"], ["OK", "nan"], [[1], [1]])
    assert same(trl_sum(rows), [r[0] for r in whole])
    assert math.isnan(trl_sum(rows)[1]) and trl_sum(rows)[0] == pytest.approx(1.0)


def test_async_variant_as_trl_awaits_it(server):
    reward = async_reward_function(server.target, reward="gsm8k")
    other = async_reward_function(server.target, [pb.GraderSpec(name="shout")])
    assert inspect.iscoroutinefunction(reward) and other.__name__ == "grpcgrade_shout"
    inputs = [{"prompt": "q", "answer": "#### 72"}] * 2
    rows = trl_rewards([reward, other], inputs, ["q", "q"], list(GSM8K), [[1], [1]], environments=[None, None])
    assert [r[0] for r in rows] == [pytest.approx(1.0), pytest.approx(0.5)]
    assert [r[1] for r in rows] == [0.0, 0.0]


def test_the_async_variant_closes_its_client_when_its_loop_ends(tmp_path, plugin_env):
    """A script calling `asyncio.run` per batch runs each on a loop of its own: each run's client is closed
    as its loop ends, so no connection to the server outlives the run (seen in this process's sockets).
    Before, the function kept every loop's client open, and its connection with it. A server of its own:
    the suite's has other tests' clients connected."""
    server = start_server(tmp_path, "--workers", "0", env=plugin_env)
    try:
        reward = async_reward_function(server.target, [pb.GraderSpec(name="shout")])

        async def one_batch() -> tuple[list[float | None], int]:
            rewards = await reward(prompts=["q"], completions=["HEY"], answer=["hey"])
            return rewards, connections_to(server.port, [os.getpid()])

        for _ in range(2):
            rewards, open_during = asyncio.run(one_batch())
            assert rewards == [1.0] and open_during >= 1
            eventually(lambda: connections_to(server.port, [os.getpid()]) == 0, "the run's connection closed", 10)
    finally:
        server.stop()


def test_construction_validates(server):
    with pytest.raises(ValueError, match="unknown reward 'gsm9k'.*gsm8k"):
        reward_function(server.target, reward="gsm9k")
    with pytest.raises(ValueError, match="unknown grader 'shoot'"):
        reward_function(server.target, ["shoot"])
    with pytest.raises(ValueError, match="max_completion_tokens"):
        reward_function(server.target, [{"name": "completion_length_cap", "params": {"max_completion_tokens": -1}}])
    with pytest.raises(ValueError, match="not both"):
        reward_function(server.target, ["shout"], reward="gsm8k")
    from grpcgrade.testing import free_port

    with pytest.raises(ConnectionError, match="no grpcgrade server reachable"):
        reward_function(f"127.0.0.1:{free_port()}", ["shout"], wait_for_ready=0.3)


def test_several_reward_functions_from_graders_need_no_server_without_check():
    """`check=False` makes the functions without asking the server: the graders' keys, weights and gates
    are in the list itself."""
    from grpcgrade.testing import free_port

    funcs = reward_functions(
        f"127.0.0.1:{free_port()}", ["shout", {"name": "tidy", "key": "t", "gate": True}], check=False
    )
    assert [f.__name__ for f in funcs] == ["grpcgrade_shout"]


def test_a_numpy_column_is_its_values_and_a_short_one_is_named(server):
    """A reward function called with a column as a numpy array (a loop of one's own, another framework's
    batch) reads it as the list of its values; a column a field is read from whose length is not the
    batch's is an error naming it. (Before, both were left out without a word: every sample failed for
    want of its reference, and the training step learnt nothing.)"""
    import numpy as np

    reward = reward_function(server.target, ["shout"])  # response == reference.upper()
    assert reward(["p", "p"], ["AB", "CD"], answer=np.array(["ab", "cd"])) == [1.0, 1.0]
    assert reward(["p", "p"], ["7", "8"], reference=np.array([7, 9])) == [1.0, 0.0]
    with pytest.raises(ValueError, match="column 'answer' holds 1 values for 2 completions"):
        reward(["p", "p"], ["AB", "CD"], answer=["ab"])


def test_a_float_answer_column_is_the_whole_number_it_holds(server):
    """A parquet float column reaches TRL as Python floats (`datasets` converts): `72.0` is the answer 72,
    graded as the text "72" would be."""
    reward = reward_function(server.target, reward="gsm8k")
    ids = [list(range(40))] * 2
    as_floats = trl_rewards([reward], [{"prompt": "q", "answer": 72.0}] * 2, ["q"] * 2, list(GSM8K), ids)
    as_text = trl_rewards([reward], [{"prompt": "q", "answer": "72"}] * 2, ["q"] * 2, list(GSM8K), ids)
    assert as_text == [[pytest.approx(1.0)], [pytest.approx(0.5)]]
    assert as_floats == as_text


def test_tool_calls_conversation_and_dataset_tools_are_agent_inputs(server):
    """A conversational completion's tool calls become `tool_calls`, prompt and completion `messages`, the
    dataset's `tools` column `tool_definitions`: the `agent` reward reads all three."""
    reward = reward_function(server.target, reward="agent")
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    bad = {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": "one"}'}}
    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                    "required": ["a", "b"],
                },
            },
        }
    ]
    prompt = [{"role": "user", "content": "1+2?"}]
    completions = [
        [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "3"},
            {"role": "assistant", "content": "3"},
        ],
        [
            {"role": "assistant", "content": None, "tool_calls": [bad]},
            {"role": "tool", "tool_call_id": "c2", "content": "error"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "3"},
        ],
    ]
    inputs = [{"prompt": prompt, "tools": tools}] * 2
    rows = trl_rewards([reward], inputs, [prompt] * 2, completions, [[1]] * 2)
    # tool_call_valid: 1 and (0.5 + 1)/2; action_loop_detection: one action, then two different ones
    assert [r[0] for r in rows] == [pytest.approx((1.0 + 1.0) / 2), pytest.approx((0.75 + 1.0) / 2)]
