"""The pure core, in process: no server, no worker pool, no gRPC. These run in milliseconds, beside the
real-server tests that check the same rules over the wire.

Expected values come from the definitions, not from the code's output: the reward formula of
core/rewards.py (reward = prod(gate scores) * sum(w_i * s_i) / sum(w_i) over the non-gate pointwise
graders, a missing weight counting 1, and no reward when any grader of the combination failed), the weight
rule (a negative weight is a penalty term; only the non-gate total must be > 0), and the param rule (JSON
has one number type, so a param gets the Python type its factory declares, or the request is refused).
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from grpcgrade.core.engine import (
    CHEAP_CHUNK,
    HEAVY_CHUNK,
    HEAVY_MIN_CHUNK,
    INLINE_MAX_BYTES,
    INLINE_MAX_SECONDS,
    INLINE_MAX_SHARE,
    INLINE_WINDOW_SECONDS,
    MAX_CHUNKS_PER_CALL,
    Batch,
    ChunkResult,
    Engine,
    InlineShare,
    Job,
)
from grpcgrade.core.errors import ErrorCode, InvalidParams, SampleProblem, UnknownGrader, UnknownReward
from grpcgrade.core.memo import IdentityMemo
from grpcgrade.core.params import ParamInfo, coerce_value, describe_params
from grpcgrade.core.plugins import PluginInfo, make_manager
from grpcgrade.core.registry import Registry
from grpcgrade.core.rewards import Reward, SpecData, check_weights, combine, rewards
from grpcgrade.grader import BaseGrader, FunctionGrader, GraderError, GraderMode, GraderRank, GraderScore

# -- reward combination ----------------------------------------------------------------------------------


def score(value: float) -> GraderScore:
    return GraderScore(name="g", score=value)


def failed() -> GraderError:
    return GraderError(name="g", error="boom")


def test_the_reward_is_the_weighted_mean_of_the_scores() -> None:
    specs = [SpecData("a", weight=2.0), SpecData("b", weight=1.0), SpecData("c")]  # c: weight 1
    assert combine(specs, [score(1.0), score(0.4), score(0.1)]) == pytest.approx((2 * 1.0 + 0.4 + 0.1) / 4)


def test_gates_multiply_the_weighted_mean() -> None:
    specs = [SpecData("a", weight=3.0), SpecData("g1", gate=True), SpecData("b", weight=1.0), SpecData("g2", gate=True)]
    results = [score(0.5), score(0.5), score(1.0), score(0.8)]
    assert combine(specs, results) == pytest.approx(0.5 * 0.8 * (3 * 0.5 + 1 * 1.0) / 4)


def test_a_gate_weight_is_not_part_of_the_mean() -> None:
    specs = [SpecData("a", weight=1.0), SpecData("g", weight=100.0, gate=True)]
    assert combine(specs, [score(0.6), score(0.5)]) == pytest.approx(0.5 * 0.6)


def test_a_negative_weight_is_a_penalty_term() -> None:
    specs = [SpecData("a", weight=3.0), SpecData("penalty", weight=-1.0)]
    assert combine(specs, [score(0.0), score(1.0)]) == pytest.approx((3 * 0.0 - 1 * 1.0) / (3 - 1))
    assert combine(specs, [score(1.0), score(1.0)]) == pytest.approx((3 - 1) / (3 - 1))


@pytest.mark.parametrize("failing", [0, 1, 2])
def test_any_failed_grader_leaves_the_sample_without_a_reward(failing: int) -> None:
    specs = [SpecData("a"), SpecData("b", weight=2.0), SpecData("g", gate=True)]
    results: list[Any] = [score(1.0), score(1.0), score(1.0)]
    results[failing] = failed()
    assert combine(specs, results) is None


def test_listwise_results_take_no_part_in_the_reward() -> None:
    specs = [SpecData("rank"), SpecData("a", weight=2.0)]
    assert combine(specs, [GraderRank(name="rank", rank=[2, 1]), score(0.7)]) == pytest.approx(0.7)
    assert combine([SpecData("rank")], [GraderRank(name="rank", rank=[1])]) is None  # nothing scores


def test_rewards_by_column_agree_with_combine_row_by_row() -> None:
    specs = [SpecData("a", weight=2.0), SpecData("b", weight=-0.5), SpecData("g", gate=True)]
    rows = [
        [score(1.0), score(0.0), score(1.0)],
        [score(0.2), score(1.0), score(0.5)],
        [score(0.2), failed(), score(0.5)],
    ]
    columns = [list(column) for column in zip(*rows, strict=True)]
    assert rewards(specs, columns) == [combine(specs, row) for row in rows]
    assert rewards(specs, columns)[:2] == [
        pytest.approx(1.0 * (2 * 1.0 - 0.5 * 0.0) / 1.5),
        pytest.approx(0.5 * (2 * 0.2 - 0.5 * 1.0) / 1.5),
    ]


def test_a_single_grader_s_score_is_the_reward() -> None:
    column = [score(0.25), failed(), GraderRank(name="g", rank=[1])]
    assert rewards([SpecData("a", weight=7.0)], [column]) == [0.25, None, None]
    assert rewards([SpecData("g", gate=True)], [column]) == [0.25, None, None]


# -- weight checks ---------------------------------------------------------------------------------------


def refused(specs: list[SpecData]) -> InvalidParams:
    with pytest.raises(InvalidParams) as info:
        check_weights(specs)
    return info.value


def test_weights_must_be_finite() -> None:
    for bad in (float("nan"), float("inf"), float("-inf")):
        error = refused([SpecData("a", weight=bad)])
        assert error.param == "weight" and "'a'" in str(error)


def test_the_non_gate_weights_must_sum_above_zero() -> None:
    assert "sum to 0" in str(refused([SpecData("a", weight=1.0), SpecData("b", weight=-1.0)]))
    assert "sum to -1" in str(refused([SpecData("a", weight=-1.0)]))
    check_weights([SpecData("a", weight=3.0), SpecData("b", weight=-1.0)])  # a penalty, total 2
    check_weights([SpecData("a", weight=1.0), SpecData("g", weight=-5.0, gate=True)])  # gates are not summed
    check_weights([SpecData("g", gate=True)])  # gates alone: no sum to check
    # finite weights whose sum a double cannot hold: every sample's reward would be inf / inf, so masked
    assert "sum to inf" in str(refused([SpecData("a", weight=1e308), SpecData("b", weight=1e308)]))


def test_each_spec_needs_a_distinct_key() -> None:
    error = refused([SpecData("a"), SpecData("a")])
    assert error.param == "key" and "'a'" in str(error)
    check_weights([SpecData("a"), SpecData("a", key="a_strict")])


# -- params: the schema and coercion ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "hint", "expected"),
    [
        (3.0, int, 3),  # JSON's one number type, as the factory's int
        (3.0, int | None, 3),
        (None, int | None, None),
        (2, float, 2),  # an int is a float param's value as it is
        (0.5, float, 0.5),
        ([1, 2], tuple, (1, 2)),  # JSON has lists; a tuple param gets a tuple
        ([1, 2], list, [1, 2]),
        (4.0, None, 4),  # undeclared type: a whole number is an int
        (4.5, None, 4.5),
        ("x", str, "x"),
    ],
)
def test_coerce_value_gives_the_declared_type(value: Any, hint: Any, expected: Any) -> None:
    coerced = coerce_value("p", value, hint)
    assert coerced == expected and type(coerced) is type(expected)


@pytest.mark.parametrize(
    ("value", "hint", "message"),
    [
        (2.5, int, "must be an integer, got 2.5"),
        ("3", int, "must be int, got str '3'"),
        (3, str, "must be str, got int 3"),
        ("x", int | None, "must be int or null, got str 'x'"),
        ({"a": 1}, list, "must be list, got dict"),
    ],
)
def test_coerce_value_refuses_other_types_naming_the_param(value: Any, hint: Any, message: str) -> None:
    with pytest.raises(InvalidParams) as info:
        coerce_value("p", value, hint)
    assert info.value.param == "p" and message in str(info.value)


class Configurable(BaseGrader):
    """A grader with one param of each kind."""

    def __init__(self, n: int, ratio: float = 0.5, words: tuple[str, ...] = ("a", "b"), label: str = "") -> None:
        super().__init__()


class Open(BaseGrader):
    def __init__(self, n: int = 1, **options: Any) -> None:
        super().__init__()


def test_describe_params_reads_the_factory_signature() -> None:
    params, open_params, hints = describe_params(Configurable)
    assert [(p.name, p.required) for p in params] == [("n", True), ("ratio", False), ("words", False), ("label", False)]
    assert params[0] == ParamInfo("n", "int", None, True)
    assert params[1] == ParamInfo("ratio", "float", 0.5, False)
    assert params[2].default == ["a", "b"]  # defaults are shown as JSON
    assert not open_params and hints["n"] is int
    assert describe_params(Open)[1] is True  # **kwargs: any name may be a param


def test_a_function_grader_s_params_are_its_arguments_that_are_not_sample_fields() -> None:
    def mentions(response: str, reference: str, word: str = "grpc", times: int = 1) -> float:
        return float(response.count(word) >= times)

    params, open_params, _ = describe_params(FunctionGrader.wrap(mentions))
    assert [p.name for p in params] == ["word", "times"] and not open_params


# -- the registry and the engine, in process ------------------------------------------------------------


def exact(response: str, reference: str) -> float:
    """1.0 when the response is the reference."""
    return float(response == reference)


def short(response: str, limit: int = 3) -> float:
    """1.0 for a response of at most `limit` characters, else 0.0."""
    return float(len(response) <= limit)


async def nonempty(response: str) -> float:
    """1.0 for a non-empty response (async, so the engine gathers it on the loop)."""
    await asyncio.sleep(0)
    return float(bool(response))


def picky(response: str) -> float:
    """Raises on the response "boom"."""
    if response == "boom":
        raise RuntimeError("boom")
    return 1.0


def longest_first(responses: list[str]) -> list[int]:
    order = sorted(range(len(responses)), key=lambda i: -len(responses[i]))
    return [order.index(i) + 1 for i in range(len(responses))]


@pytest.fixture
def registry() -> Registry:
    registry = Registry([], make_manager())
    plugin = PluginInfo(name="unit", distribution="tests", version="0")
    for func in (exact, short, nonempty, picky):
        registry.add(plugin, FunctionGrader.wrap(func), name=func.__name__)
    registry.add(plugin, FunctionGrader.wrap(longest_first, mode=GraderMode.LISTWISE), name="longest_first")
    registry.add(plugin, Configurable, name="configurable")
    return registry


def test_the_registry_refuses_unknown_and_missing_params(registry: Registry) -> None:
    with pytest.raises(InvalidParams) as unknown:
        registry.build("short", {"limt": 3})
    assert unknown.value.param == "limt" and "allowed: limit" in str(unknown.value)
    with pytest.raises(InvalidParams) as missing:
        registry.build("configurable", {})
    assert missing.value.param == "n"
    with pytest.raises(InvalidParams) as wrong:
        registry.build("short", {"limit": 2.5})
    assert wrong.value.param == "limit"
    with pytest.raises(UnknownGrader, match="did you mean 'short'"):
        registry.build("shrt")


def test_the_registry_builds_once_per_params_and_names_what_it_built(registry: Registry) -> None:
    built = registry.build("short", {"limit": 5.0})
    assert built is registry.build("short", {"limit": 5.0})
    assert built is not registry.build("short", {"limit": 4})
    assert built.name == "short"
    assert built.evaluate(response="12345").score == 1.0 and built.evaluate(response="123456").score == 0.0
    assert registry.entry("longest_first").mode is GraderMode.LISTWISE


class PositionalEvaluate(BaseGrader):
    def evaluate(self, response: str = "", /) -> GraderScore:  # would grade "" for every sample
        return GraderScore(name=self.name, score=float(response == ""))


class PositionalAsync(BaseGrader):
    async def aevaluate(self, response: str, /) -> GraderScore:
        return GraderScore(name=self.name, score=1.0)


class PositionalParam(BaseGrader):
    def __init__(self, limit: int = 3, /) -> None:
        super().__init__()

    def evaluate(self, response: str) -> GraderScore:
        return GraderScore(name=self.name, score=1.0)


class PositionalSelf(BaseGrader):
    """Only `self` positional-only: every field and param still reaches it by keyword."""

    def __init__(self, /, limit: int = 3) -> None:
        super().__init__()

    def evaluate(self, /, response: str) -> GraderScore:
        return GraderScore(name=self.name, score=1.0)


def positional_function(response, /, reference=""):
    return 1.0


@pytest.mark.parametrize(
    ("factory", "where"),
    [
        (PositionalEvaluate, "'response' of PositionalEvaluate.evaluate"),
        (PositionalAsync, "'response' of PositionalAsync.aevaluate"),
        (PositionalParam, "'limit' of PositionalParam.__init__"),
        (FunctionGrader.wrap(positional_function), "'response' of positional_function"),
    ],
)
def test_registration_refuses_a_parameter_only_a_position_can_fill(factory: Any, where: str) -> None:
    """Sample fields and params are passed by keyword: such a grader failed every sample, or (with a default)
    silently graded its default for every sample."""
    registry = Registry([], make_manager())
    plugin = PluginInfo(name="unit", distribution="tests", version="0")
    with pytest.raises(TypeError, match=f"grader 'p': parameter {where} is positional-only"):
        registry.add(plugin, factory, name="p")
    with pytest.raises(UnknownGrader):
        registry.entry("p")
    registry.add(plugin, PositionalSelf, name="fine")
    assert registry.build("fine", {"limit": 2}).evaluate(response="x").score == 1.0


def engine_for(registry: Registry, **rewards_by_name: list[SpecData]) -> Engine:
    named = {name: Reward(name, specs) for name, specs in rewards_by_name.items()}
    return Engine(registry, pool=None, rewards=named)


def test_resolve_refuses_a_request_that_names_nothing_or_both(registry: Registry) -> None:
    engine = engine_for(registry, r=[SpecData("exact")])
    with pytest.raises(InvalidParams, match="either"):
        engine.resolve([SpecData("exact")], reward="r")
    with pytest.raises(InvalidParams, match="no grader"):
        engine.resolve([])
    with pytest.raises(UnknownReward):
        engine.resolve([], reward="nope")
    with pytest.raises(InvalidParams, match="sum to 0"):
        engine.resolve([SpecData("exact"), SpecData("short", weight=-1.0)])


def test_without_a_pool_every_grader_runs_inline(registry: Registry) -> None:
    engine = engine_for(registry)
    jobs = engine.resolve([SpecData("exact"), SpecData("nonempty")])
    assert [job.worker_capable for job in jobs] == [False, False]
    assert not engine.whole_chunks(jobs) and not any(job.in_worker for job in jobs)


def test_a_chunk_is_graded_by_every_grader_and_combined_by_the_formula(registry: Registry) -> None:
    specs = [
        SpecData("exact", weight=3.0),
        SpecData("nonempty", weight=1.0),
        SpecData("short", params={"limit": 2}, gate=True),
        SpecData("picky", weight=1.0),
    ]
    engine = engine_for(registry, r=specs)
    jobs = engine.resolve([], reward="r")
    chunk: list[tuple[int, Any]] = [
        (10, {"response": "ab", "reference": "ab"}),  # exact 1, nonempty 1, short 1, picky 1
        (11, {"response": "abc", "reference": "x"}),  # exact 0, nonempty 1, short 0, picky 1
        (12, SampleProblem("field 'response' is too long")),  # no grader sees it
        (13, {"response": "boom", "reference": "boom"}),  # picky raises: this sample only
    ]
    graded = asyncio.run(engine.grade_chunk(jobs, chunk))
    assert graded.indices == [10, 11, 12, 13]
    exact_column, nonempty_column, short_column, picky_column = graded.columns
    assert [r.score for r in exact_column if isinstance(r, GraderScore)] == [1.0, 0.0, 1.0]
    assert [r.score for r in short_column if isinstance(r, GraderScore)] == [1.0, 0.0, 0.0]
    for column in graded.columns:
        problem = column[2]
        assert isinstance(problem, GraderError) and problem.code == ErrorCode.INVALID_SAMPLE
        assert "too long" in problem.error
    assert isinstance(picky_column[3], GraderError) and picky_column[3].code == ErrorCode.GRADER_FAILED
    assert all(isinstance(r, GraderScore) for r in (*nonempty_column[:2], nonempty_column[3], *picky_column[:2]))
    assert graded.rewards == [
        pytest.approx(1.0 * (3 * 1.0 + 1.0 + 1.0) / 5),
        pytest.approx(0.0 * (3 * 0.0 + 1.0 + 1.0) / 5),
        None,
        None,
    ]


def test_a_slow_async_grader_holds_no_other_sample_beside_a_sync_grader(registry: Registry) -> None:
    """A plan of a judge-like async grader and a synchronous one (row by row): the sample the async grader
    is slow on is held back alone. Its judgment waits until every other sample of its chunk, and of the
    chunk behind it, has been handed on; had it held them, the batch would never finish."""
    released = asyncio.Event()

    async def judged(response: str) -> float:
        if response == "slow":
            await released.wait()
        return 1.0

    registry.add(
        PluginInfo(name="judge", distribution="tests", version="0"), FunctionGrader.wrap(judged), name="judged"
    )
    engine = engine_for(registry)
    plan = engine.resolve([SpecData("judged"), SpecData("nonempty")])
    samples = [{"response": "slow" if i == 0 else f"fast {i}"} for i in range(8)]
    batch = Batch(size=len(samples), chunk=lambda a, b: [(i, samples[i]) for i in range(a, b)])

    async def collect() -> list[int]:
        order: list[int] = []
        async for part in engine.grade_batch(plan, batch, engine.chunks(plan, 8, 4)):
            order.extend(part.indices)
            assert all(isinstance(r, GraderScore) for column in part.columns for r in column)
            if len(order) == len(samples) - 1:
                released.set()  # every other sample is in: only now may the slow one finish
        return order

    order = asyncio.run(asyncio.wait_for(collect(), 60))
    assert sorted(order) == list(range(8)) and order[-1] == 0


def test_a_batch_comes_back_in_chunks_covering_every_sample_once(registry: Registry) -> None:
    engine = engine_for(registry)
    jobs = engine.resolve([SpecData("short", params={"limit": 2}), SpecData("nonempty")])
    samples = [{"response": "x" * n} for n in range(7)]
    batch = Batch(size=len(samples), chunk=lambda a, b: [(i, samples[i]) for i in range(a, b)])

    async def collect() -> list[ChunkResult]:
        return [
            chunk
            async for chunk in engine.grade_batch(jobs, batch, engine.chunks(jobs, 7, 3))
            if isinstance(chunk, ChunkResult)
        ]

    chunks = asyncio.run(collect())
    assert sorted(len(c.indices) for c in chunks) == [1, 3, 3]
    by_index = {i: reward for c in chunks for i, reward in zip(c.indices, c.rewards, strict=True)}
    # mean of short (len <= 2) and nonempty (len > 0), each of weight 1
    expected = {n: ((n <= 2) + (n > 0)) / 2 for n in range(7)}
    assert by_index == pytest.approx(expected)


# -- the inline share: small bounded calls give the event loop back ----------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_inline_share_refuses_once_a_window_s_share_is_spent_and_allows_again_in_the_next() -> None:
    clock = _Clock()
    share = InlineShare(share=0.25, window=1.0, clock=clock)
    assert share.allows()
    share.spent(0.1)
    clock.now += 0.5
    assert share.allows()  # 0.1 s of 0.25 s spent
    share.spent(0.2)
    assert not share.allows()  # 0.3 s spent within the window: small calls now hop to the workers
    clock.now += 0.5  # a new window
    assert share.allows()


def test_a_spent_inline_share_sends_small_bounded_calls_to_the_workers(registry: Registry) -> None:
    engine = Engine(registry)
    grader = FunctionGrader.wrap(short)(limit=3)
    grader.bounded_cost = True  # a length: bounded by the input's size
    job = Job(SpecData(name="short"), grader, ("response",), worker_capable=True)
    assert engine.inline_small([job], 1000)
    assert not engine.inline_small([job], INLINE_MAX_BYTES + 1)
    engine.inline_share.spent(INLINE_MAX_SHARE * INLINE_WINDOW_SECONDS)
    assert not engine.inline_small([job], 1000)


def test_a_plan_whose_calls_grade_slowly_keeps_only_its_smaller_calls_inline(registry: Registry) -> None:
    """The expected time of a call is its size times its plan's learnt grading rate: a call expected to hold
    the event loop past INLINE_MAX_SECONDS goes to the workers."""
    engine = Engine(registry)
    grader = FunctionGrader.wrap(short)(limit=3)
    grader.bounded_cost = True
    plan = engine.plan([Job(SpecData(name="short"), grader, ("response",), worker_capable=True)])
    assert engine.inline_small(plan, 100_000)  # nothing learnt yet: small by its size alone
    plan.rate.learn(10_000, 10 * INLINE_MAX_SECONDS)  # 10,000 bytes took ten times the longest inline call
    assert not engine.inline_small(plan, 10_000)
    assert engine.inline_small(plan, 900)  # under a tenth of it: within the longest
    plan.rate.learn(0, 1.0)  # a chunk of unknown size teaches nothing
    assert engine.inline_small(plan, 900)
    for _ in range(20):  # the plan's calls grade fast again (another view): the average follows
        plan.rate.learn(10_000, INLINE_MAX_SECONDS / 100)
    assert engine.inline_small(plan, 10_000)


class Weighty(BaseGrader):
    """A heavy grader (it would run in the workers): its calls are cut in guided chunks."""

    heavy = True

    def evaluate(self, response: str = "") -> GraderScore:
        return GraderScore(self.name, 1.0)


def test_heavy_chunks_shrink_as_the_samples_are_handed_out(registry: Registry) -> None:
    registry.add(PluginInfo(name="unit", distribution="tests", version="0"), Weighty, name="weighty")
    engine = engine_for(registry)  # no pool: one share per worker of the 1 process that grades
    heavy, cheap = engine.resolve([SpecData("weighty")]), engine.resolve([SpecData("exact")])
    chunks = list(engine.chunks(heavy, 1024))
    sizes = [b - a for a, b in chunks]
    assert [a for a, _ in chunks] == [0, *(b for _, b in chunks[:-1])] and chunks[-1][1] == 1024
    # each chunk: the samples left over GUIDED_SHARES (2) x 1 worker, at most HEAVY_CHUNK, at least HEAVY_MIN_CHUNK
    assert sizes[:6] == [HEAVY_CHUNK, HEAVY_CHUNK, HEAVY_CHUNK, 128, 64, 32]
    assert sizes == sorted(sizes, reverse=True) and min(sizes[:-1]) == HEAVY_MIN_CHUNK
    assert list(engine.chunks(heavy, 5)) == [(0, 5)]  # never below the minimum but never past the end
    assert list(engine.chunks(heavy, 1024, requested=100))[:2] == [(0, 100), (100, 200)]  # the request's size wins
    assert list(engine.chunks(cheap, 2500)) == [(0, 1024), (1024, 2048), (2048, 2500)]
    many = list(engine.chunks(heavy, 100_000))
    assert len(many) <= MAX_CHUNKS_PER_CALL and many[-1][1] == 100_000
    assert engine.unissued == 0


def test_one_chunk_says_what_chunks_cuts_without_cutting(registry: Registry) -> None:
    """`one_chunk` (which lets a small call be graded here and now) agrees with `chunks` wherever the sizes are
    fixed, and never claims one chunk where they are guided (decided as the samples are handed out)."""
    registry.add(PluginInfo(name="unit", distribution="tests", version="0"), Weighty, name="weighty")
    engine = engine_for(registry)
    heavy, cheap = engine.resolve([SpecData("weighty")]), engine.resolve([SpecData("exact")])
    for samples in (1, 5, CHEAP_CHUNK, CHEAP_CHUNK + 1, 100_000):
        for requested in (0, 1, 100, CHEAP_CHUNK, 5_000):
            for jobs in (cheap, heavy):
                whole = list(engine.chunks(jobs, samples, requested)) == [(0, samples)]
                fixed = bool(requested) or jobs is cheap
                assert engine.one_chunk(jobs, samples, requested) == (whole and fixed), (samples, requested)
    assert engine.unissued == 0


def test_heavy_chunks_stay_big_while_other_calls_samples_wait(registry: Registry) -> None:
    """Guided over the server, not the call: a call's tail is cut small only when nothing waits behind it."""
    registry.add(PluginInfo(name="unit", distribution="tests", version="0"), Weighty, name="weighty")
    engine = engine_for(registry)
    heavy = engine.resolve([SpecData("weighty")])
    alone = [b - a for a, b in engine.chunks(heavy, 1024)]  # a call with nothing behind it
    first, second = engine.chunks(heavy, 1024), engine.chunks(heavy, 1024)
    assert next(second) == (0, HEAVY_CHUNK)  # the second call starts: its 1,024 samples wait
    # the first call's 1,024 are handed out while the second's 768 still wait: no chunk of it shrinks
    assert [b - a for a, b in first] == [HEAVY_CHUNK] * 4
    # the second call, alone now, shrinks as a call with nothing behind it does, from its 2nd chunk on
    assert engine.unissued == 1024 - HEAVY_CHUNK
    assert [b - a for a, b in second] == alone[1:] and len(alone) > 5
    assert engine.unissued == 0


def test_a_heavy_call_that_ends_early_stops_counting_its_samples_as_waiting(registry: Registry) -> None:
    registry.add(PluginInfo(name="unit", distribution="tests", version="0"), Weighty, name="weighty")
    engine = engine_for(registry)
    jobs = engine.resolve([SpecData("weighty")])
    samples = [{"response": "x"}] * 600
    batch = Batch(size=len(samples), chunk=lambda a, b: [(i, samples[i]) for i in range(a, b)])

    planned = engine.chunks(jobs, len(samples))  # held here, so only grade_batch's close can end it

    async def first_chunk_only() -> int:
        graded = engine.grade_batch(jobs, batch, planned)
        async for chunk in graded:
            await graded.aclose()  # the caller went away after one chunk
            assert isinstance(chunk, ChunkResult)
            return len(chunk.indices)
        raise AssertionError("no chunk")

    assert asyncio.run(first_chunk_only()) < len(samples)  # one chunk answered, the rest never handed out
    assert engine.unissued == 0  # its other samples no longer keep other calls' chunks big


def test_an_identity_memo_keeps_equal_objects_apart_and_forgets_each_with_it() -> None:
    """What is worked out once per built grader is kept by identity: objects that compare equal (or cannot be
    hashed at all, as a dataclass grader) each get their own entry, and an entry goes with its object."""

    class Equal:  # every instance equal to every other, and no hash
        __hash__ = None  # type: ignore[assignment]

        def __eq__(self, other: object) -> bool:
            return True

    memo: IdentityMemo[Equal, str] = IdentityMemo()
    a, b = Equal(), Equal()
    assert memo.put(a, "a") == "a" and memo.get(a) == "a"
    assert memo.get(b) is None
    memo.put(b, "b")
    assert (memo.get(a), memo.get(b), len(memo)) == ("a", "b", 2)
    del a
    gc.collect()
    assert len(memo) == 1 and memo.get(b) == "b"
