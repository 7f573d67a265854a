"""A sample without an input its grader requires is that sample's INVALID_SAMPLE, naming the input and the
keys the sample carried; an empty string that is sent is graded as the grader grades it. Against the real
server, through every way samples travel: one sample, a batch of messages, a batch of columns."""

from __future__ import annotations

from grpcgrade.client import result_to_dict
from grpcgrade.service.convert import SampleColumns


def error_of(result) -> tuple[str, str]:
    (only,) = result.results
    assert only.HasField("error"), only
    return only.error.code, only.error.message


def test_a_typical_rl_dataset_row_is_refused_not_scored(client):
    """The issue's trap: `completion` and `answer` are not sample fields; two absent texts used to "match"."""
    result = client.evaluate({"completion": "Paris is it", "answer": "London"}, ["string_match"])
    code, message = error_of(result)
    assert code == "INVALID_SAMPLE"
    assert "'response'" in message and "'reference'" in message and "string_match" in message
    assert "answer, completion" in message  # the keys it did carry: the fix is usually a rename
    assert not result.HasField("reward")


def test_an_empty_string_that_is_sent_is_graded(client):
    result = result_to_dict(client.evaluate({"response": "", "reference": ""}, ["string_match"]))
    assert result["results"][0]["score"] == 1.0  # OpenJudge's exact match of two empty texts
    result = client.evaluate({"response": "72", "reference": ""}, ["math_exact"])
    assert not result.results[0].HasField("error")  # graded: "the reference contains no number"


def test_one_sample_missing_an_input_costs_no_other_sample_its_result(client):
    samples = [
        {"response": "London", "reference": "London"},
        {"response": "London"},  # no reference
        {"response": "London", "reference": None},  # None: not sent
        {"response": "Paris", "reference": "London"},
    ]
    results = client.batch_evaluate(samples, ["string_match"])
    assert [r.results[0].score for r in (results[0], results[3])] == [1.0, 0.0]
    for r in (results[1], results[2]):
        code, message = error_of(r)
        assert code == "INVALID_SAMPLE" and "'reference'" in message and "carried: response" in message


def test_columns_with_a_field_absent_from_some_samples(client):
    columns = SampleColumns(response=["72", "72", "7"], reference=["72", None, "7"])
    assert not columns.columnar  # a column is sent for all samples or none: these travel as samples
    results = client.batch_evaluate(columns, ["math_exact"])
    assert error_of(results[1])[0] == "INVALID_SAMPLE"
    assert not results[0].results[0].HasField("error") and not results[2].results[0].HasField("error")


def test_a_column_no_sample_sent_fails_every_sample(client):
    columns = SampleColumns(response=["72"] * 3)
    assert columns.columnar
    for r in client.batch_evaluate(columns, ["math_exact", "think_format"]):
        assert [x.error.code for x in r.results] == ["INVALID_SAMPLE"] * 2
        assert "'reference'" in r.results[0].error.message
        assert not r.HasField("reward")
    table = client.batch_scores(columns, ["math_exact", "think_format"])  # RESULT_VIEW_COLUMNS
    assert table.rewards == [None] * 3 and table.masked == 3


def test_graders_that_require_nothing_still_grade_bare_samples(client):
    result = client.evaluate({"response": "<think>\nx\n</think>\n72"}, ["think_format"])
    assert not result.results[0].HasField("error")


def test_a_parameter_without_default_is_required_and_aliases_are_the_reference():
    from grpcgrade.core.samples import missing_input, requirements
    from grpcgrade.grader import FunctionGrader

    def judge(response, ground_truth, style="plain", **kwargs):
        return 1.0

    inputs = FunctionGrader(judge).input_names()
    assert inputs.required == {"response", "ground_truth"}
    assert FunctionGrader(judge, ground_truth="x").input_names().required == {"response"}  # bound by params
    required = requirements([("judge", inputs)])
    assert required == {"response": "judge", "reference": "judge"}
    assert missing_input({"response", "reference"}, required) is None
    problem = missing_input({"response", "answer"}, required)
    assert problem is not None and "'reference'" in str(problem) and "carried: answer, response" in str(problem)
