"""The examples of docs/deliberate-differences.md, sent to a real server: each shows a difference from the
references (decisions.md), and the expected values are the rules stated there, worked by hand."""

from __future__ import annotations

import json

import pytest
from doc_examples import DOCS, blocks

PAGE = "deliberate-differences.md"
EXAMPLES = [json.loads(block) for block in blocks(PAGE, "json")]
DEEP = "[" * 1100 + "]" * 1100  # the page's `DEEP`


def test_the_page_lists_the_differences_of_decisions_md_in_order():
    headings = [line for line in (DOCS / PAGE).read_text().splitlines() if line.startswith("## ")]
    labels = [h.split(":")[0][3:] for h in headings if h[3] in "DK" and ":" in h]
    assert labels == ["D1", "D2", "D3", "D4", "D5", "D6", "D7", "D8", "D9", "D10", "D11", "D12", "K1"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: json.dumps(e["graders"])[:60])
def test_docs_example(client, example):
    sample = json.loads(json.dumps(example["sample"]).replace('"DEEP"', json.dumps(DEEP)))
    reply = client.evaluate(sample, example["graders"])
    expect = example["expect"]
    if "scores" in expect:
        assert [r.score for r in reply.results] == pytest.approx(expect["scores"])
        assert not any(r.HasField("error") for r in reply.results)
    if "errors" in expect:
        assert [r.error.code for r in reply.results] == expect["errors"]
    if "keys" in expect:
        assert [r.key for r in reply.results] == expect["keys"]
    assert (reply.reward if reply.HasField("reward") else None) == pytest.approx(expect["reward"])
