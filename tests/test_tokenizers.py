"""Tests of data.tokenizers: BERT WordPiece behaviour, vocab files, training, save/load, CLI."""

import json
import os
import subprocess
import sys

import pytest

from data import corpora, tokenizers
from data.tokenizers import TokenizerError, WordPieceTokenizer

# The published BERT layout: [PAD]=0, [unused0..98]=1..99, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103.
_HEAD = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_UNCASED = _HEAD + [
    "hello",
    "world",
    "un",
    "##aff",
    "##able",
    ",",
    ".",
    "!",
    "[",
    "]",
    "mask",
    "cafe",
    "the",
    "##s",
]
_CASED = _HEAD + ["Hello", "H\u00e9llo", "hello", "caf\u00e9", "cafe", "Caf", "##\u00e9", "."]


def _vocab_file(directory, tokens, name="vocab.txt"):
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return path


@pytest.fixture
def uncased(tmp_path):
    return WordPieceTokenizer.from_vocab_file(_vocab_file(tmp_path, _UNCASED))


@pytest.fixture
def cased(tmp_path):
    return WordPieceTokenizer.from_vocab_file(_vocab_file(tmp_path, _CASED))


def _pieces(tokenizer, text):
    return [tokenizer.id_to_token(i) for i in tokenizer.encode(text)]


def test_uncased_bert_behaviour(uncased):
    assert (uncased.pad_id, uncased.unk_id, uncased.cls_id, uncased.sep_id, uncased.mask_id) == (
        0,
        100,
        101,
        102,
        103,
    )
    assert uncased.special_ids == frozenset({0, 101, 102, 103})  # [UNK] is text: maskable
    assert uncased.vocab_size == len(_UNCASED)
    # Lowercased, accents stripped, punctuation split off, greedy longest-match wordpieces.
    assert _pieces(uncased, "H\u00e9llo, WORLD! Caf\u00e9s") == ["hello", ",", "world", "!", "cafe", "##s"]
    assert _pieces(uncased, "unaffable") == ["un", "##aff", "##able"]
    # No segmentation, or a word over 100 characters, is one [UNK]; as in the original,
    # "[MASK]" written in text is not the mask token.
    assert uncased.encode("xyz hello " + "h" * 101) == [100, uncased.token_to_id("hello"), 100]
    assert _pieces(uncased, "[MASK]") == ["[", "mask", "]"]
    assert uncased.encode("") == []
    texts = ["Hello, world.", "", "unaffable cafe", "xyz"]
    assert uncased.encode_batch(texts) == [uncased.encode(t) for t in texts]
    assert uncased.token_to_id("##aff") == 107 and uncased.token_to_id("nope") is None
    with pytest.raises(IndexError):
        uncased.id_to_token(-1)


def test_cased_keeps_case_and_accents(cased):
    assert _pieces(cased, "H\u00e9llo Hello hello HELLO") == ["H\u00e9llo", "Hello", "hello", "[UNK]"]
    assert _pieces(cased, "caf\u00e9 Caf\u00e9") == ["caf\u00e9", "Caf", "##\u00e9"]
    assert cased.identity()["lowercase"] is False and cased.identity()["strip_accents"] is False


def test_decode(uncased):
    text = "hello, world. unaffable!"
    ids = uncased.encode(text)
    assert uncased.decode(ids) == text
    assert uncased.decode([0, *uncased.encode("hello world"), 0, 0]) == "hello world"


def test_casing_inference_and_override(tmp_path):
    uncased_path = _vocab_file(tmp_path, _UNCASED, "uncased.txt")
    cased_path = _vocab_file(tmp_path, _CASED, "cased.txt")
    # Bracketed reserved tokens ([PAD], [UNK], ...) are uppercase but do not count.
    assert WordPieceTokenizer.from_vocab_file(uncased_path).identity()["lowercase"] is True
    assert WordPieceTokenizer.from_vocab_file(cased_path).identity()["lowercase"] is False
    forced = WordPieceTokenizer.from_vocab_file(cased_path, lowercase=True, strip_accents=False)
    assert _pieces(forced, "CAF\u00c9 Caf\u00e9") == ["caf\u00e9", "caf\u00e9"]  # lowercased, accent kept
    assert forced.identity()["strip_accents"] is False


def test_vocab_file_errors(tmp_path):
    missing_mask = _vocab_file(tmp_path, [t for t in _UNCASED if t != "[MASK]"], "no_mask.txt")
    with pytest.raises(TokenizerError, match=r"^.*no_mask\.txt: the vocab has no \[MASK\] token"):
        WordPieceTokenizer.from_vocab_file(missing_mask)
    with pytest.raises(TokenizerError, match=r"^vocab file '.*absent\.txt' not found"):
        WordPieceTokenizer.from_vocab_file(str(tmp_path / "absent.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(TokenizerError, match=r"^vocab file '.*empty\.txt' is empty"):
        WordPieceTokenizer.from_vocab_file(str(tmp_path / "empty.txt"))
    duplicate = _vocab_file(tmp_path, _UNCASED + ["hello"], "dup.txt")
    with pytest.raises(TokenizerError, match=r"token 'hello' appears twice \(ids 104 and"):
        WordPieceTokenizer.from_vocab_file(duplicate)
    with pytest.raises(TokenizerError, match=r"^no tokenizer at '.*nowhere'"):
        tokenizers.load_tokenizer(str(tmp_path / "nowhere"))


@pytest.fixture(scope="module")
def trained():
    documents = [d.sentences for d in corpora.demo_documents()[:200]]
    return tokenizers.train_wordpiece(documents, 2000)


def test_train_wordpiece(trained):
    assert [trained.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (trained.pad_id, trained.unk_id, trained.cls_id, trained.sep_id, trained.mask_id) == (
        0,
        1,
        2,
        3,
        4,
    )
    assert 1000 < trained.vocab_size <= 2000
    assert any(trained.id_to_token(i).startswith("##") for i in range(trained.vocab_size))
    sentence = "the function returns a new list of the attributes of this object."
    ids = trained.encode(sentence)
    assert trained.unk_id not in ids and len(ids) < len(sentence.split()) * 3
    assert trained.decode(ids) == sentence
    assert trained.encode("The FUNCTION") == trained.encode("the function")  # uncased
    # Special tokens in text stay text, as for a loaded vocab.
    assert trained.mask_id not in trained.encode("[MASK]")


def test_train_wordpiece_errors():
    with pytest.raises(TokenizerError, match="no sentences"):
        tokenizers.train_wordpiece([], 100)
    with pytest.raises(TokenizerError, match="vocab_size 5 is too small"):
        tokenizers.train_wordpiece([["a b c"]], 5)


def test_save_and_load(trained, tmp_path):
    trained.save(str(tmp_path / "tok"))
    assert json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text()) == {
        "kind": "wordpiece",
        "lowercase": True,
        "strip_accents": True,
    }
    vocab_lines = (tmp_path / "tok" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert vocab_lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(vocab_lines) == trained.vocab_size + 1  # final newline

    sentences = [s for d in corpora.demo_documents()[200:230] for s in d.sentences]
    for path in [tmp_path / "tok", tmp_path / "tok" / "vocab.txt"]:  # directory or bare vocab
        loaded = tokenizers.load_tokenizer(str(path))
        assert loaded.identity() == trained.identity()
        assert loaded.encode_batch(sentences) == trained.encode_batch(sentences)
    identity = trained.identity()
    assert identity["kind"] == "wordpiece" and identity["vocab_size"] == trained.vocab_size
    assert len(identity["vocab_sha256"]) == 64

    (tmp_path / "tok" / "tokenizer_config.json").write_text('{"kind": "sentencepiece"}')
    with pytest.raises(TokenizerError, match="unknown tokenizer kind 'sentencepiece'"):
        tokenizers.load_tokenizer(str(tmp_path / "tok"))


def _run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "data.tokenizers", *args],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        timeout=120,
    )


def test_cli_train(tmp_path):
    corpus = tmp_path / "corpus.txt"
    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma".split()
    with open(corpus, "w") as f:
        for d in range(60):
            for s in range(4):
                f.write(" ".join(words[(d + s + k) % len(words)] for k in range(6)).capitalize() + f" {d}.\n")
            f.write("\n")
    expected_docs = sum(not corpora.is_heldout(doc, 0.1) for doc in corpora.iter_documents(str(corpus)))
    assert 40 < expected_docs < 60  # some documents are held out
    output = tmp_path / "tok"
    result = _run_cli(
        "train",
        f"--corpus={corpus}",
        "--vocab_size=300",
        f"--output={output}",
        "--cased",
        "--eval_fraction=0.1",
    )
    assert result.returncode == 0, result.stderr
    loaded = tokenizers.load_tokenizer(str(output))
    assert result.stdout == (
        f"wrote {output}/vocab.txt: {loaded.vocab_size} tokens (wordpiece, cased) "
        f"from {expected_docs} documents\n"
    )
    assert loaded.identity()["lowercase"] is False
    assert loaded.decode(loaded.encode("Alpha beta 7.")) == "Alpha beta 7."


def test_cli_user_error(tmp_path):
    result = _run_cli(
        "train", f"--corpus={tmp_path}/missing*.txt", "--vocab_size=300", f"--output={tmp_path}/tok"
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    # TensorFlow may log to stderr at import; the one message of ours is the error line.
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        f"error: no files match '{tmp_path}/missing*.txt': check the path or glob"
    ]
    assert not (tmp_path / "tok").exists()
