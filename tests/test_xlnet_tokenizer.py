"""XLNet's SentencePiece tokenizer (data/tokenizers/xlnet.py): the original's special ids and
start-piece rule, its pair layout, loading a bare spiece.model as XLNet's (not ALBERT's), the
`train` command, and the ids transformers' XLNetTokenizer gives for the same model."""

import numpy as np
import pytest
import transformers

from data import tokenizers
from data.tokenizers import cli as tokenizer_cli
from data.tokenizers.base import TokenizerError
from tests import cli_run
from tests.test_tokenizers import _topic_documents

TEXT = "Hello World, in 1990, the 1987 thing's done: naïve ``quotes''."


@pytest.fixture(scope="module")
def xlnet():
    return tokenizers.train_xlnet_sentencepiece(_topic_documents(600), 600, lowercase=False)


def test_the_originals_special_pieces_and_ids(xlnet):
    assert [xlnet.id_to_token(i) for i in range(17)] == [
        "<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>",
        ".", "(", ")", '"', "-", "\u2013", "\u00a3", "\u20ac",
    ]  # fmt: skip
    assert (xlnet.unk_id, xlnet.cls_id, xlnet.sep_id, xlnet.pad_id, xlnet.mask_id, xlnet.eod_id) == (
        0,
        3,
        4,
        5,
        6,
        7,
    )
    assert xlnet.vocab_size == 600 and xlnet.pair_format == "xlnet"
    # Control symbols are never produced from text; the text keeps its case, loses its accents.
    assert not {xlnet.cls_id, xlnet.eod_id} & set(xlnet.encode("<cls> <eod>"))
    assert "Hello" in xlnet.decode(xlnet.encode(TEXT)) and "naive" in xlnet.decode(xlnet.encode(TEXT))


def test_start_pieces_are_xlnets():
    """`_is_start_piece`: "▁" or "<" first, or a lone ASCII punctuation mark but "'", which
    its set writes as a second '"'. Digits and letters without "▁" continue a word (ALBERT's
    rule would start one at "87")."""
    pieces = ["▁the", "87", "s", ",", "'", "<eod>", "é", "▁"]
    starts = tokenizers.XLNetTokenizer.word_starts(pieces, ())
    np.testing.assert_array_equal(starts, [True, False, False, True, False, True, False, True])


def test_pairs_end_with_cls(xlnet):
    ids, segments, _ = tokenizers.pair_inputs(xlnet, [10, 11], [12], 16)
    assert (ids, segments) == ([10, 11, 4, 12, 4, 3], [0, 0, 0, 1, 1, 2])
    ids, segments, _ = tokenizers.pair_inputs(xlnet, [10, 11], None, 16)
    assert (ids, segments) == ([10, 11, 4, 3], [0, 0, 0, 2])


def test_a_bare_spiece_model_with_eod_loads_as_xlnets(xlnet, tmp_path):
    xlnet.save(str(tmp_path / "saved"))
    loaded = tokenizers.load_tokenizer(str(tmp_path / "saved"))
    assert type(loaded) is tokenizers.XLNetTokenizer and loaded.identity() == xlnet.identity()
    bare = tokenizers.load_tokenizer(str(tmp_path / "saved" / "spiece.model"))
    assert type(bare) is tokenizers.XLNetTokenizer and bare.encode(TEXT) == xlnet.encode(TEXT)
    albert = tokenizers.train_sentencepiece(_topic_documents(300), 400)
    albert.save(str(tmp_path / "albert"))
    assert (
        type(tokenizers.load_tokenizer(str(tmp_path / "albert" / "spiece.model")))
        is tokenizers.SentencePieceTokenizer
    )
    with pytest.raises(
        TokenizerError,
        match="the model has no <s> piece: XLNet needs <unk>, <s>, </s>, <cls>, <sep>, <pad>, <mask>, <eod>",
    ):
        tokenizers.XLNetTokenizer(albert._proto, source="albert.model")


def test_transformers_xlnet_tokenizer_gives_our_ids(xlnet, tmp_path):
    (tmp_path / "spiece.model").write_bytes(xlnet._proto)  # transformers 5 reads it by from_pretrained
    theirs = transformers.XLNetTokenizer.from_pretrained(str(tmp_path), do_lower_case=False)
    for text in (TEXT, "Sentences of 3,000 words,", "  spaced   out\ttext "):
        assert theirs.encode(text, add_special_tokens=False) == xlnet.encode(text), text
    pair = theirs("first part", "second", return_token_type_ids=True)
    ids, segments, _ = tokenizers.pair_inputs(xlnet, xlnet.encode("first part"), xlnet.encode("second"), 64)
    assert (pair["input_ids"], pair["token_type_ids"]) == (ids, segments)


def test_the_train_command_makes_xlnets_vocab(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(d) for d in _topic_documents(300)) + "\n")
    result = cli_run.run(
        tokenizer_cli.main,
        [
            "train",
            f"--corpus={corpus}",
            "--kind=xlnet_spm",
            "--vocab_size=300",
            "--cased",
            f"--output={tmp_path / 'tok'}",
        ],
        capsys,
    )
    assert result.returncode == 0 and "300 tokens (xlnet_spm, cased)" in result.stdout
    assert tokenizers.load_tokenizer(str(tmp_path / "tok")).eod_id == 7
