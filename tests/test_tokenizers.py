"""Tests of data.tokenizers: BERT WordPiece behaviour, vocab files, training, save/load, CLI."""

import json
import os

import numpy as np
import pytest

from data import corpora, tokenizers
from data.tokenizers import TokenizerError, WordPieceTokenizer
from data.tokenizers import cli as tokenizers_cli
from tests import cli_run

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
    # No segmentation ("h" is not in the vocab) is one [UNK]; as in the original, "[MASK]"
    # written in text is not the mask token.
    assert uncased.encode("xyz hello " + "h" * 101) == [100, uncased.token_to_id("hello"), 100]
    assert _pieces(uncased, "[MASK]") == ["[", "mask", "]"]
    assert uncased.encode("") == []
    texts = ["Hello, world.", "", "unaffable cafe", "xyz"]
    assert uncased.encode_batch(texts) == [uncased.encode(t) for t in texts]
    assert uncased.token_to_id("##aff") == 107 and uncased.token_to_id("nope") is None
    with pytest.raises(IndexError):
        uncased.id_to_token(-1)


def _bert_wordpiece(word, vocab, unk_token="[UNK]", max_input_chars_per_word=200):
    """google-research/bert tokenization.py `WordpieceTokenizer.tokenize` (its defaults)
    for one word, transcribed: greedy longest-match-first, [UNK] for a longer word."""
    chars = list(word)
    if len(chars) > max_input_chars_per_word:
        return [unk_token]
    is_bad, start, sub_tokens = False, 0, []
    while start < len(chars):
        end, cur_substr = len(chars), None
        while start < end:
            substr = "".join(chars[start:end])
            if start > 0:
                substr = "##" + substr
            if substr in vocab:
                cur_substr = substr
                break
            end -= 1
        if cur_substr is None:
            is_bad = True
            break
        sub_tokens.append(cur_substr)
        start = end
    return [unk_token] if is_bad else sub_tokens


def test_wordpiece_words_up_to_200_characters_are_word_pieced(uncased):
    # BERT's WordpieceTokenizer(max_input_chars_per_word=200); the tokenizers library's
    # default, 100, would make the 149- and 200-character words [UNK].
    vocab = set(_UNCASED)
    for word in ["un" + "aff" * 49, "un" + "aff" * 66, "un" + "aff" * 66 + "s", "unaffable"]:
        assert _pieces(uncased, word) == _bert_wordpiece(word, vocab), len(word)
    assert _pieces(uncased, "un" + "aff" * 49) == ["un"] + ["##aff"] * 49  # 149 characters
    assert _pieces(uncased, "un" + "aff" * 66 + "s") == ["[UNK]"]  # 201 characters


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
    return tokenizers.train_wordpiece(_topic_documents(3000), 2000)


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

    sentences = [s for d in _topic_documents(3150)[600:] for s in d]  # not trained on
    for path in [tmp_path / "tok", tmp_path / "tok" / "vocab.txt"]:  # directory or bare vocab
        loaded = tokenizers.load_tokenizer(str(path))
        assert loaded.identity() == trained.identity()
        assert loaded.encode_batch(sentences) == trained.encode_batch(sentences)
    identity = trained.identity()
    assert identity["kind"] == "wordpiece" and identity["vocab_size"] == trained.vocab_size
    assert len(identity["vocab_sha256"]) == 64

    (tmp_path / "tok" / "tokenizer_config.json").write_text('{"kind": "morse"}')
    with pytest.raises(TokenizerError, match="unknown tokenizer kind 'morse'"):
        tokenizers.load_tokenizer(str(tmp_path / "tok"))


@pytest.fixture
def _run_cli(capsys):
    """`python -m data.tokenizers ARGS`, run in this process (tests/cli_run.py)."""
    return lambda *args: cli_run.run(tokenizers_cli.main, args, capsys)


def test_cli_train(tmp_path, _run_cli):
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


def test_cli_user_error(tmp_path, _run_cli):
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


def test_wordpiece_word_start_mask(uncased):
    starts = uncased.word_start_mask()
    assert starts.dtype == bool and starts.shape == (uncased.vocab_size,)
    for token, expected in [("un", True), ("##aff", False), ("##able", False), (",", True), ("[CLS]", True)]:
        assert starts[uncased.token_to_id(token)] == expected, token
    assert uncased.pair_format == "bert"


# ---------------------------------------------------------------- byte-level BPE


def _bytes_to_unicode():
    """GPT-2's encoder.py byte -> printable character table, written out independently."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _gpt2_reference_encode(text, vocab, merges):
    """GPT-2's encoder.py `Encoder.encode`: regex split, byte map, lowest-rank merge first."""
    import regex

    byte_chars = _bytes_to_unicode()
    ranks = {pair: r for r, pair in enumerate(merges)}
    ids = []
    for word in regex.findall(_GPT2_SPLIT, text):
        parts = [byte_chars[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            pairs = [(parts[i], parts[i + 1]) for i in range(len(parts) - 1)]
            best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
            if best not in ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i < len(parts) - 1 and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids.extend(vocab[p] for p in parts)
    return ids


def _write_bpe_files(directory, vocab, merges):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


# RoBERTa's layout in miniature: <s> <pad> </s> <unk> first, <mask> last.
_TINY_VOCAB = {
    "<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3,
    "h": 4, "e": 5, "l": 6, "o": 7, "\u0120": 8, ",": 9,
    "ll": 10, "he": 11, "hell": 12, "\u0120he": 13, "<mask>": 14,
}  # fmt: skip
# Rank order matters: in " hello", "he ll" (rank 2) must win over "Ġ he" (rank 3).
_TINY_MERGES = [("l", "l"), ("h", "e"), ("he", "ll"), ("\u0120", "he")]


def test_published_format_bpe_encodes_known_ids(tmp_path):
    _write_bpe_files(tmp_path / "roberta", _TINY_VOCAB, _TINY_MERGES)
    tok = tokenizers.load_tokenizer(str(tmp_path / "roberta"))  # kind detected from the files
    assert tok.identity()["kind"] == "bpe" and tok.pair_format == "roberta"
    assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 14)
    assert tok.special_ids == {0, 1, 2, 14}
    # By hand: "hello" -> h e ll o -> he ll o -> hell o; " he" -> Ġ he -> Ġhe; "," alone.
    text = "hello, hello he"
    assert tok.encode(text) == [12, 7, 9, 8, 12, 7, 13]
    assert tok.encode(text) == _gpt2_reference_encode(text, _TINY_VOCAB, _TINY_MERGES)
    assert tok.decode([1, *tok.encode(text), 1]) == text
    starts = tok.word_start_mask()
    assert [tok.id_to_token(i) for i in np.flatnonzero(starts)] == [
        "<s>",
        "<pad>",
        "</s>",
        "<unk>",
        "\u0120",
        "\u0120he",
        "<mask>",
    ]
    # HF's own tokenizer_config.json (no "kind") does not hide the files.
    (tmp_path / "roberta" / "tokenizer_config.json").write_text('{"model_max_length": 512}')
    assert tokenizers.load_tokenizer(str(tmp_path / "roberta")).identity() == tok.identity()
    # A bare vocab.json path finds merges.txt beside it.
    assert tokenizers.load_tokenizer(str(tmp_path / "roberta" / "vocab.json")).identity() == tok.identity()


def test_bpe_file_errors(tmp_path):
    _write_bpe_files(tmp_path / "a", _TINY_VOCAB, _TINY_MERGES)
    os.remove(tmp_path / "a" / "merges.txt")
    with pytest.raises(
        TokenizerError, match=r"^'.*merges\.txt' not found: a byte-level BPE vocab\.json needs"
    ):
        tokenizers.load_tokenizer(str(tmp_path / "a"))
    _write_bpe_files(tmp_path / "b", _TINY_VOCAB, _TINY_MERGES)
    (tmp_path / "b" / "vocab.json").write_text("h 4\ne 5\n")
    with pytest.raises(
        TokenizerError, match=r"^.*vocab\.json: not valid JSON \(.*\): a BPE vocab\.json maps"
    ):
        tokenizers.load_tokenizer(str(tmp_path / "b"))
    gpt2_style = {k: v for k, v in _TINY_VOCAB.items() if k != "<mask>"}
    _write_bpe_files(tmp_path / "c", gpt2_style, _TINY_MERGES)
    with pytest.raises(TokenizerError, match=r"the vocab has no <mask> token: RoBERTa needs"):
        tokenizers.load_tokenizer(str(tmp_path / "c"))


def _topic_documents(n_sentences):
    """Sentences of Python's own documentation (`pydoc_data.topics`), five per document."""
    import pydoc_data.topics

    text = " ".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    sentences = [s.strip() for s in " ".join(text.split()).split(". ") if len(s.strip()) > 10][:n_sentences]
    return [sentences[i : i + 5] for i in range(0, len(sentences), 5)]


@pytest.fixture(scope="module")
def trained_bpe():
    return tokenizers.train_bpe(_topic_documents(600), 700)


def test_train_bpe_save_load(trained_bpe, tmp_path):
    tok = trained_bpe
    assert [tok.id_to_token(i) for i in range(5)] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    assert tok.vocab_size == 700
    sentences = [s for d in _topic_documents(800)[120:] for s in d]
    for s in sentences + ["Caf\u00e9 \u00fcber \U0001f600 x\ty  z"]:  # every byte is in the vocab
        ids = tok.encode(s)
        assert tok.unk_id not in ids and tok.decode(ids) == s
    tok.save(str(tmp_path / "bpe"))
    assert sorted(os.listdir(tmp_path / "bpe")) == ["merges.txt", "tokenizer_config.json", "vocab.json"]
    loaded = tokenizers.load_tokenizer(str(tmp_path / "bpe"))
    assert loaded.identity() == tok.identity() and loaded.identity()["kind"] == "bpe"
    assert loaded.encode_batch(sentences) == tok.encode_batch(sentences)
    # The saved files are in GPT-2's published format: an independent GPT-2 encoder agrees.
    vocab = json.loads((tmp_path / "bpe" / "vocab.json").read_text(encoding="utf-8"))
    merges = [
        tuple(line.split(" ")) for line in (tmp_path / "bpe" / "merges.txt").read_text().splitlines()[1:]
    ]
    for s in sentences[:40]:
        assert tok.encode(s) == _gpt2_reference_encode(s, vocab, merges)
    starts = tok.word_start_mask()
    the = tok.encode(" the")
    assert len(the) == 1 and starts[the[0]]  # "Ġthe"
    assert all(starts[i] == tok.id_to_token(i).startswith("\u0120") for i in range(5, tok.vocab_size))


# ---------------------------------------------------------------- SentencePiece


@pytest.fixture(scope="module")
def trained_sp():
    return tokenizers.train_sentencepiece(_topic_documents(600), 600)


def test_train_sentencepiece_albert_layout(trained_sp):
    tok = trained_sp
    assert [tok.id_to_token(i) for i in range(13)] == [
        "<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]", "(", ")", '"', "-", ".", "\u2013", "\u00a3", "\u20ac"
    ]  # fmt: skip
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.vocab_size == 600 and tok.pair_format == "bert"
    # Control symbols are never produced from text.
    assert tok.mask_id not in tok.encode("[MASK]") and tok.cls_id not in tok.encode("[CLS]")
    known = 0
    for s in [s for d in _topic_documents(800)[120:] for s in d][:50]:
        ids = tok.encode(s)
        if tok.unk_id not in ids:  # characters below the coverage (e.g. "~") are <unk>, decoded " ⁇ "
            known += 1
            assert tok.decode(ids) == tokenizers.albert_preprocess(s, lowercase=True)
    assert known >= 40


def test_albert_normalisation_of_published_model(trained_sp, tmp_path):
    # A bare spiece.model, as ALBERT publishes it, loads as uncased SentencePiece.
    (tmp_path / "albert").mkdir()
    trained_sp.save(str(tmp_path / "trained"))
    (tmp_path / "albert" / "spiece.model").write_bytes((tmp_path / "trained" / "spiece.model").read_bytes())
    tok = tokenizers.load_tokenizer(str(tmp_path / "albert"))
    assert tok.identity() == trained_sp.identity() and tok.identity()["kind"] == "sentencepiece"
    assert (
        tokenizers.albert_preprocess("  Caf\u00e9  ``Na\u00efve''  CAT ", lowercase=True)
        == 'cafe "naive" cat'
    )
    assert tokenizers.albert_preprocess("Caf\u00e9 ''x''", lowercase=False) == 'Cafe "x"'
    assert tok.encode("  THE Caf\u00e9  ``Na\u00efve'' ") == tok.encode('the cafe "naive"')
    assert tok.decode(tok.encode("The ``Value''")) == 'the "value"'
    # ALBERT's encode_pieces: a digit + "," piece is split so the comma stands alone.
    pieces = tok.pieces("in 1990, the")
    assert "," in pieces and not any(p.endswith(",") and len(p) > 1 for p in pieces)
    assert "".join(pieces).replace("\u2581", " ").strip() == "in 1990, the"
    # A bare .model path works too.
    assert tokenizers.load_tokenizer(str(tmp_path / "albert" / "spiece.model")).identity() == tok.identity()


def test_sentencepiece_batch_is_each_text_alone(trained_sp, monkeypatch):
    """One SentencePiece call over the batch (threads limited or not) gives each text's ids,
    ALBERT's digit-comma split included."""
    from data.tokenizers import threads

    monkeypatch.setattr(threads, "_limit", None)  # both restored after the test
    monkeypatch.setenv("RAYON_NUM_THREADS", "")
    texts = [s for d in _topic_documents(200)[:20] for s in d] + [
        "in 1990, the",
        "1,000,000 ``x'' Caf\u00e9",
        "",
    ]
    alone = [trained_sp.encode(t) for t in texts]
    assert trained_sp.encode_batch(texts) == alone
    tokenizers.limit_threads(1)
    assert trained_sp.encode_batch(texts) == alone


def test_sentencepiece_word_start_mask(trained_sp):
    tok = trained_sp
    starts = tok.word_start_mask()
    assert starts.dtype == bool and starts.shape == (tok.vocab_size,)
    for token in ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]", "(", '"', "."]:
        assert starts[tok.token_to_id(token)], token
    pieces = tok.pieces("the functions returned")
    assert pieces[0] == "\u2581the" and starts[tok.token_to_id(pieces[0])]
    continuations = [p for p in pieces if not p.startswith("\u2581")]
    assert continuations and not any(starts[tok.token_to_id(p)] for p in continuations)
    if tok.token_to_id(",") is not None:
        assert starts[tok.token_to_id(",")]  # a lone punctuation piece, as ALBERT's _is_start_piece


def test_sentencepiece_errors(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "spiece.model").write_bytes(b"this is not a protobuf")
    with pytest.raises(
        TokenizerError, match=r"^.*spiece\.model: not a SentencePiece model: pass a \.model file"
    ):
        tokenizers.load_tokenizer(str(tmp_path / "bad"))
    with pytest.raises(TokenizerError, match="no sentences"):
        tokenizers.train_sentencepiece([], 100)
    with pytest.raises(TokenizerError, match="^SentencePiece training failed: .*[Vv]ocabulary size"):
        tokenizers.train_sentencepiece([["a b c", "b c d"]], 5000)


def test_identity_distinguishes_kinds(trained, trained_bpe, trained_sp):
    kinds = [t.identity()["kind"] for t in (trained, trained_bpe, trained_sp)]
    assert kinds == ["wordpiece", "bpe", "sentencepiece"]
    assert [t.identity().get("pair_format", "bert") for t in (trained, trained_bpe, trained_sp)] == [
        "bert",
        "roberta",
        "bert",
    ]


@pytest.mark.parametrize(
    "kind,written,files",
    [
        ("bpe", "vocab.json", ["merges.txt", "tokenizer_config.json", "vocab.json"]),
        ("sentencepiece", "spiece.model", ["spiece.model", "tokenizer_config.json"]),
    ],
)
@pytest.mark.slow
def test_cli_train_kinds(tmp_path, kind, written, files, _run_cli):
    output = tmp_path / "tok"
    result = _run_cli("train", "--corpus=demo", f"--kind={kind}", "--vocab_size=400", f"--output={output}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {output}/{written}: 400 tokens ({kind}")
    assert sorted(os.listdir(output)) == files
    loaded = tokenizers.load_tokenizer(str(output))
    assert loaded.identity()["kind"] == kind and loaded.vocab_size == 400


def test_cli_bpe_rejects_cased(tmp_path, _run_cli):
    result = _run_cli("train", "--corpus=demo", "--kind=bpe", "--cased", f"--output={tmp_path}/tok")
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: --cased does not apply to --kind=bpe: byte-level BPE always keeps case"
    ]


def test_pair_inputs_layouts(trained_bpe, uncased):
    """BERT's [CLS] A [SEP] B [SEP] (types 0/1) and RoBERTa's <s> A </s></s> B </s> (types 0),
    truncation by the longer side, single texts as [CLS] A [SEP]."""
    a, b = [11, 12, 13, 14, 15], [21, 22]
    bert = (uncased.cls_id, uncased.sep_id)
    ids, types, cut = tokenizers.pair_inputs(uncased, a, b, 16)
    assert ids == [bert[0], *a, bert[1], *b, bert[1]] and types == [0] * 7 + [1] * 3 and not cut
    cls, sep = trained_bpe.cls_id, trained_bpe.sep_id
    ids, types, cut = tokenizers.pair_inputs(trained_bpe, a, b, 16)
    assert ids == [cls, *a, sep, sep, *b, sep] and types == [0] * 11 and not cut
    ids, types, cut = tokenizers.pair_inputs(trained_bpe, a, b, 8)  # 4 specials leave 4: A 2, B 2
    assert ids == [cls, 11, 12, sep, sep, 21, 22, sep] and cut
    ids, types, cut = tokenizers.pair_inputs(uncased, a, None, 5)
    assert ids == [bert[0], 11, 12, 13, bert[1]] and types == [0] * 5 and cut


def test_roberta_pair_inputs_match_transformers(trained_bpe, tmp_path):
    """The same ids as transformers' RoBERTa tokenizer on our exported tokenizer folder."""
    import transformers  # requirements-test.txt

    from interop import convert
    from models.encoder import EncoderConfig

    convert.write_hf_tokenizer(trained_bpe, EncoderConfig(vocab_size=trained_bpe.vocab_size), str(tmp_path))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    pairs = [
        ("The object is created.", "It is then returned to the caller."),
        ('A quote " and an émoji 😀', "  two  spaces"),
    ]
    for a, b in pairs:
        expected = theirs(a, b, truncation="longest_first", max_length=12)["input_ids"]
        ours, _, _ = tokenizers.pair_inputs(trained_bpe, trained_bpe.encode(a), trained_bpe.encode(b), 12)
        assert ours == expected, (a, b)
        expected = theirs(a, b)["input_ids"]
        assert (
            tokenizers.pair_inputs(trained_bpe, trained_bpe.encode(a), trained_bpe.encode(b), 512)[0]
            == expected
        )


# ---------------------------------------------------------------- documents (pretraining data)


@pytest.mark.parametrize("name", ["trained", "trained_bpe", "trained_sp"])
def test_documents_encode_as_their_joined_text(name, request):
    """`encode_documents` (what preprocessing stores): a document's sentence ids, concatenated,
    are the ids of its sentences joined by single spaces. Byte-level BPE needs the joining
    space ("ĠThe"); WordPiece and SentencePiece split at whitespace first, so each sentence
    alone already gives the same ids (SentencePiece's "▁" at each sentence start is the
    joining space)."""
    tok = request.getfixturevalue(name)
    documents = _topic_documents(800)[120:150] + [["It ends here.", "The next one starts.", "3 more."]]
    encoded = tok.encode_documents(documents)
    assert [len(ids) for ids in encoded] == [len(doc) for doc in documents]
    for doc, ids in zip(documents, encoded):
        assert [t for s in ids for t in s] == tok.encode(" ".join(doc)), doc
        assert all(ids)
    assert encoded[:2] == [tok.encode_documents([doc])[0] for doc in documents[:2]]
    last = [t for s in encoded[-1] for t in s]
    if name == "trained_bpe":
        assert tok.decode(last) == "It ends here. The next one starts. 3 more."
        assert encoded[-1][0] == tok.encode("It ends here.")  # a document's first word: no space
        assert all(tok.id_to_token(s[0]).startswith("\u0120") for s in encoded[-1][1:])


def test_bpe_documents_match_gpt2_on_the_whole_line(trained_bpe, tmp_path):
    """fairseq encodes each input line (a paragraph) whole with GPT-2's encoder
    (examples/roberta/multiprocessing_bpe_encoder.py); our documents match the transcribed
    GPT-2 encoder on the joined text."""
    trained_bpe.save(str(tmp_path / "bpe"))
    vocab = json.loads((tmp_path / "bpe" / "vocab.json").read_text(encoding="utf-8"))
    merges = [
        tuple(line.split(" ")) for line in (tmp_path / "bpe" / "merges.txt").read_text().splitlines()[1:]
    ]
    documents = _topic_documents(800)[120:140]
    for doc, ids in zip(documents, trained_bpe.encode_documents(documents)):
        assert [t for s in ids for t in s] == _gpt2_reference_encode(" ".join(doc), vocab, merges)


def _albert_is_start_piece_sp(piece):
    """google-research/albert create_pretraining_data.py `_is_start_piece_sp`, transcribed
    (Python 3: `six.ensure_str` of a str is the str; the "€"/"£" entries are bytes)."""
    special_pieces = set(list('!"#$%&"()*+,-./:;?@[\\]^_`{|}~'))
    special_pieces.add("€".encode("utf-8"))
    special_pieces.add("£".encode("utf-8"))
    english_chars = set(list("abcdefghijklmnopqrstuvwxyz"))
    if (
        piece.startswith("▁")
        or piece.startswith("<")
        or piece in special_pieces
        or not all([i.lower() in english_chars.union(special_pieces) for i in piece])
    ):
        return True
    else:
        return False


def test_sentencepiece_word_starts_are_albert_is_start_piece(trained_sp):
    tok = trained_sp
    starts = tok.word_start_mask()
    for i in range(tok.vocab_size):
        piece = tok.id_to_token(i)
        # [CLS]/[SEP] are boundaries in ALBERT's loop before the rule is asked; [MASK] is not text.
        expected = piece in tokenizers.SP_CONTROL_SYMBOLS or _albert_is_start_piece_sp(piece)
        assert starts[i] == expected, piece
    # Digits, apostrophes and "=" start words in the middle of one: "1987" and "don't" are
    # several units for whole-word and n-gram masking, as in ALBERT.
    pieces = tok.pieces("in 1987 he said don't a=b")
    inner = [p for p in pieces if not p.startswith("\u2581") and not p.isalpha()]
    assert {"9", "'", "="} <= set(inner), pieces
    assert all(starts[tok.token_to_id(p)] for p in inner)


# ---------------------------------------------------------------- fits_vocab, transformers' settings, kinds


@pytest.mark.parametrize("name", ["trained", "trained_bpe", "trained_sp"])
def test_fits_vocab_is_equal_sizes(name, request):
    """A model's embedding table fits these tokenizers only at their exact size (DeBERTa's
    tokenizers also fit larger tables: tests/test_deberta_tokenizer.py)."""
    tok = request.getfixturevalue(name)
    n = tok.vocab_size
    assert tok.fits_vocab(n) and not tok.fits_vocab(n + 1) and not tok.fits_vocab(n - 1)


_BERT_SPECIALS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def test_hf_special_tokens_and_settings(trained, cased, trained_bpe, trained_sp, tmp_path):
    """What interop.convert.write_hf_tokenizer writes for transformers, per kind."""
    assert trained.hf_special_tokens() == _BERT_SPECIALS and cased.hf_special_tokens() == _BERT_SPECIALS
    assert trained.hf_settings() == {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": True,
        "strip_accents": True,
        "tokenize_chinese_chars": True,
    }
    assert cased.hf_settings() == {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": False,
        "strip_accents": False,
        "tokenize_chinese_chars": True,
    }
    accents_kept = WordPieceTokenizer.from_vocab_file(
        _vocab_file(tmp_path, _CASED), lowercase=True, strip_accents=False
    )
    assert accents_kept.hf_settings()["do_lower_case"] is True
    assert accents_kept.hf_settings()["strip_accents"] is False
    # RobertaTokenizer names <s> and </s> also bos and eos.
    assert trained_bpe.hf_special_tokens() == {
        "unk_token": "<unk>",
        "sep_token": "</s>",
        "pad_token": "<pad>",
        "cls_token": "<s>",
        "mask_token": "<mask>",
        "bos_token": "<s>",
        "eos_token": "</s>",
    }
    assert trained_bpe.hf_settings() == {"tokenizer_class": "RobertaTokenizer", "add_prefix_space": False}
    assert trained_sp.hf_special_tokens() == {
        "unk_token": "<unk>",
        "sep_token": "[SEP]",
        "pad_token": "<pad>",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    assert trained_sp.hf_settings() == {"tokenizer_class": "AlbertTokenizer", "do_lower_case": True}
    trained_sp.save(str(tmp_path / "sp"))
    cased_sp = tokenizers.SentencePieceTokenizer.from_model_file(str(tmp_path / "sp" / "spiece.model"), False)
    assert cased_sp.hf_settings() == {"tokenizer_class": "AlbertTokenizer", "do_lower_case": False}
    # Only DeBERTa's tokenizers fix settings of their transformers class.
    for tok in (trained, trained_bpe, trained_sp):
        assert tok.HF_FIXED_SETTINGS == {}


@pytest.mark.parametrize("name", ["trained", "cased", "trained_bpe", "trained_sp"])
def test_hf_methods_are_what_the_export_writes(name, request, tmp_path):
    """interop.convert.write_hf_tokenizer's tokenizer_config.json: our config, the transformers
    class, model_max_length, the special tokens and the class's settings;
    special_tokens_map.json: the special tokens."""
    from interop import convert
    from models.encoder import EncoderConfig

    tok = request.getfixturevalue(name)
    tok.save(str(tmp_path / "ours"))
    ours = json.loads((tmp_path / "ours" / "tokenizer_config.json").read_text())
    convert.write_hf_tokenizer(
        tok, EncoderConfig(vocab_size=tok.vocab_size, max_position_embeddings=128), str(tmp_path / "hf")
    )
    written = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert written == {**ours, "model_max_length": 128, **tok.hf_special_tokens(), **tok.hf_settings()}
    specials = json.loads((tmp_path / "hf" / "special_tokens_map.json").read_text())
    assert specials == tok.hf_special_tokens()


def test_kinds_load_through_the_registry(trained, trained_bpe, trained_sp, tmp_path, monkeypatch):
    assert tokenizers.registered_kinds() == tokenizers.ALL_KINDS
    assert tokenizers.ALL_KINDS == (
        "wordpiece",
        "bpe",
        "sentencepiece",
        "deberta_bpe",
        "deberta_spm",
        "xlnet_spm",
        "tokenizer_json",
    )
    assert tokenizers.KINDS == ("wordpiece", "bpe", "sentencepiece", "xlnet_spm")
    for tok in (trained, trained_bpe, trained_sp):
        tok.save(str(tmp_path / tok.identity()["kind"]))
        loaded = tokenizers.load_tokenizer(str(tmp_path / tok.identity()["kind"]))
        assert type(loaded) is type(tok) and loaded.identity() == tok.identity()
    # A kind registered by another module loads through its loader, given the directory and config.
    monkeypatch.setattr(tokenizers.base, "_KIND_LOADERS", dict(tokenizers.base._KIND_LOADERS))
    calls = []
    tokenizers.register_kind("morse", lambda directory, config: calls.append((directory, config)) or trained)
    (tmp_path / "morse").mkdir()
    (tmp_path / "morse" / "tokenizer_config.json").write_text('{"kind": "morse", "dots": 3}')
    assert tokenizers.load_tokenizer(str(tmp_path / "morse")) is trained
    assert calls == [(str(tmp_path / "morse"), {"kind": "morse", "dots": 3})]
    with pytest.raises(ValueError, match="tokenizer kind 'bpe' is registered twice"):
        tokenizers.register_kind("bpe", tokenizers.ByteLevelBPETokenizer.from_directory)


@pytest.mark.parametrize("kind", ['"morse"', '["wordpiece"]', "{}", "null", "7"])
def test_unknown_kind_is_one_line(kind, tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(_UNCASED) + "\n")  # not read: the config names the kind
    (tmp_path / "tokenizer_config.json").write_text(f'{{"kind": {kind}}}')
    with pytest.raises(TokenizerError) as e:
        tokenizers.load_tokenizer(str(tmp_path))
    assert str(e.value) == (
        f"{tmp_path}/tokenizer_config.json: unknown tokenizer kind {json.loads(kind)!r}: "
        "this version reads wordpiece, bpe, sentencepiece, deberta_bpe, deberta_spm, xlnet_spm, "
        "tokenizer_json"
    )
