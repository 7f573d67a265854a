"""The worker-pool path gives exactly the results of the inline path."""

from __future__ import annotations

import random

import pytest
from google.protobuf.json_format import MessageToDict

from grpcgrade.testing import start_server
from grpcgrade.v1 import grading_pb2 as pb

WORDS = "the a cat dog sat on mat rug reward policy 机器 学习 是 人工 智能 , . ! 3.14 42".split()
HEAVY = [
    {"name": "similarity", "key": "chrf", "params": {"algorithm": "chrf"}},
    {"name": "similarity", "key": "rougeL", "params": {"algorithm": "rougeL"}},
    {"name": "similarity", "key": "bleu", "params": {"algorithm": "bleu"}},
    {"name": "similarity", "key": "meteor", "params": {"algorithm": "meteor"}},
    {"name": "similarity", "key": "cosine", "params": {"algorithm": "cosine"}},
    {"name": "ngram_repetition_penalty", "key": "ngram", "params": {"tokenizer_type": "jieba"}},
    {"name": "string_match", "key": "overlap", "params": {"algorithm": "word_overlap"}},
]


@pytest.fixture(scope="module")
def inline_server(tmp_path_factory, plugin_env):
    srv = start_server(tmp_path_factory.mktemp("inline"), "--workers", "0", env=plugin_env)
    yield srv
    srv.stop()


def test_worker_pool_and_inline_grading_agree(server, inline_server):
    rng = random.Random(11)

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 30)))

    samples = [{"id": str(i), "response": text(), "reference": text()} for i in range(300)]
    with server.client(timeout=120, chunk_size=70) as pooled, inline_server.client(timeout=120) as inline:
        by_pool = pooled.batch_evaluate(samples, HEAVY)
        by_inline = inline.batch_evaluate(samples, HEAVY)
    assert [MessageToDict(r) for r in by_pool] == [MessageToDict(r) for r in by_inline]
    assert all(not res.HasField("error") for r in by_pool for res in r.results)


CHEAP = [
    "json_validator",
    {"name": "string_match", "key": "regex", "params": {"algorithm": "regex_match"}},
    {"name": "length_penalty", "params": {"min_length": 5, "max_length": 40}, "weight": 0.5},
    {"name": "reasoning_format", "gate": True},
]


@pytest.mark.parametrize("view", [pb.RESULT_VIEW_FULL, pb.RESULT_VIEW_SCORES], ids=["full", "scores"])
@pytest.mark.parametrize("extra", [[], ["attentive"]], ids=["whole-chunks", "per-grader"])
def test_cheap_graders_and_bad_samples_agree_on_every_path(server, inline_server, view, extra):
    rng = random.Random(5)
    samples = []
    for i in range(500):
        response = rng.choice(['{"a": 1}', "<think>x</think> 42", "[1, 2", " ".join(rng.sample(WORDS, 6))])
        sample = {"id": f"s{i}", "response": response, "reference": "[0-9]+"}
        if i % 97 == 3:
            sample["extra"] = {"response": "collides"}  # a bad sample: INVALID_SAMPLE for every grader
        samples.append(sample)
    graders = CHEAP + extra
    with server.client(timeout=120, chunk_size=150) as pooled, inline_server.client(timeout=120) as inline:
        by_pool = pooled.batch_evaluate(samples, graders, view=view)
        by_inline = inline.batch_evaluate(samples, graders, view=view)
    assert [MessageToDict(r) for r in by_pool] == [MessageToDict(r) for r in by_inline]
    assert [r.id for r in by_pool] == [s["id"] for s in samples]
    bad = [r for r, s in zip(by_pool, samples, strict=True) if "extra" in s]
    assert bad and all(res.error.code == "INVALID_SAMPLE" for r in bad for res in r.results)
    assert sum(r.HasField("reward") for r in by_pool) == len(samples) - len(bad)
