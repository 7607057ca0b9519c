"""Tests of DeBERTa's tokenizers (data.tokenizers): v2/v3 SentencePiece and v1 byte-level BPE,
against transformers' DebertaV2Tokenizer / DebertaTokenizer on tiny vocabs trained here, and
their import/export through interop.convert."""

import json
import os
import unicodedata

import numpy as np
import pytest

from data import tokenizers
from data.tokenizers import DebertaBPETokenizer, DebertaSentencePieceTokenizer, TokenizerError
from interop import convert
from models.encoder import EncoderConfig
from tests import spm_files

# Punctuation, digits, runs of whitespace, accents (NFC and NFD), other scripts, an emoji;
# characters the tiny models never saw become [UNK] (SentencePiece) or bytes (BPE). No
# compatibility characters ("ﬁ", fullwidth digits): see test_hf_normalises_with_nfc.
TEXTS = [
    "The object is created, then returned to the caller.",
    "Numbers: 3.14, 1,000 and 2024-01-05! (x+y)*z",
    "  several   spaces\tand a tab\nand a newline  ",
    "Caf\u00e9 na\u00efve \u00fcber Zu\u0308rich",
    "emoji \U0001f600 and \u6f22\u5b57 and \u0416\u0443\u043a",
    "don't stop; it's fine",
    "x",
    "",
]
PAIRS = [
    ("The object is created.", "It is then returned to the caller."),
    ('A quote " and an \u00e9moji \U0001f600', "  two  spaces"),
    ("short", "a much longer second text with many words in it, which will be cut"),
]


def _one_line(excinfo):
    message = str(excinfo.value)
    assert message and "\n" not in message, message
    return message


def _fmt(model_type):
    """The ModelFormat of a family (interop.convert.FORMATS), whose read_tokenizer reads its folders."""
    return convert.FORMATS[model_type]


# ---------------------------------------------------------------- v2/v3: SentencePiece


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
    """A folder as HF publishes DeBERTa-v3: spm.model and nothing else of ours."""
    directory = tmp_path_factory.mktemp("deberta_v3")
    (directory / "spm.model").write_bytes(spm_files.train_spm())
    return directory


@pytest.fixture(scope="module")
def ours_v2(spm_dir):
    return DebertaSentencePieceTokenizer.from_model_file(str(spm_dir / "spm.model"))


@pytest.fixture(scope="module")
def hf_v2(spm_dir):
    import transformers  # requirements-test.txt

    # transformers 5.x builds DebertaV2Tokenizer from spm.model only through from_pretrained
    # (its constructor's vocab_file is not read).
    return transformers.DebertaV2Tokenizer.from_pretrained(str(spm_dir))


def test_spm_layout_and_special_ids(ours_v2, hf_v2):
    tok = ours_v2
    assert [tok.id_to_token(i) for i in range(4)] == ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    # [MASK] is not an spm piece: it comes after the 800 pieces, as in HF (128000 published).
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 800)
    assert tok.vocab_size == 801 and tok.id_to_token(800) == "[MASK]" and tok.token_to_id("[MASK]") == 800
    assert tok.special_ids == frozenset({0, 1, 2, 800})  # [UNK] is text: maskable
    assert tok.pair_format == "bert"
    assert (hf_v2.pad_token_id, hf_v2.cls_token_id, hf_v2.sep_token_id, hf_v2.unk_token_id) == (0, 1, 2, 3)
    assert hf_v2.mask_token_id == 800 and len(hf_v2) == 801
    with pytest.raises(IndexError):
        tok.id_to_token(801)


def test_spm_ids_match_transformers(ours_v2, hf_v2):
    tok = ours_v2
    encoded = tok.encode_batch(TEXTS)
    assert encoded == [tok.encode(t) for t in TEXTS]
    for text, ids in zip(TEXTS, encoded):
        assert ids == hf_v2(text, add_special_tokens=False)["input_ids"], text
        # A single text is [CLS] A [SEP], as HF's template.
        assert tokenizers.pair_inputs(tok, ids, None, 512)[0] == hf_v2(text)["input_ids"], text
    assert any(tok.unk_id in ids for ids in encoded)  # the tiny model lacks some characters
    assert tok.encode("The") != tok.encode("the")  # no lowercasing


def test_spm_pairs_match_transformers(ours_v2, hf_v2):
    """[CLS] A [SEP] B [SEP] with segment ids 0/1, as HF. (Truncation is pair_inputs' BERT rule,
    shared by every tokenizer; HF's longest_first breaks ties the other way.)"""
    tok = ours_v2
    for a, b in PAIRS:
        expected = hf_v2(a, b)
        ids, segments, cut = tokenizers.pair_inputs(tok, tok.encode(a), tok.encode(b), 512)
        assert (ids, segments, cut) == (expected["input_ids"], expected["token_type_ids"], False), (a, b)


def test_hf_normalises_with_nfc(ours_v2, hf_v2):
    """A known difference: ours (like microsoft/DeBERTa's SPMTokenizer) normalises with the spm
    model's own rule (nmt_nfkc: NFKC); transformers 5.x's DebertaV2Tokenizer uses NFC, so
    compatibility characters differ. Ours equals the NFKC of the text."""
    text = "\ufb01ne \uff11\uff12"  # "ﬁne １２"
    assert (
        ours_v2.encode(text)
        == ours_v2.encode(unicodedata.normalize("NFKC", text))
        == ours_v2.encode("fine 12")
    )
    assert hf_v2(text, add_special_tokens=False)["input_ids"] != ours_v2.encode(text)


def _is_whitespace(char):
    """microsoft/DeBERTa DeBERTa/deberta/spm_tokenizer.py, transcribed (also _is_control,
    _is_punctuation, _part_of_whole_word below)."""
    if char == " " or char == "\t" or char == "\n" or char == "\r":
        return True
    cat = unicodedata.category(char)
    if cat == "Zs":
        return True
    return False


def _is_control(char):
    if char == "\t" or char == "\n" or char == "\r":
        return False
    cat = unicodedata.category(char)
    if cat.startswith("C"):
        return True
    return False


def _is_punctuation(char):
    cp = ord(char)
    if (
        (cp >= 33 and cp <= 47)
        or (cp >= 58 and cp <= 64)
        or (cp >= 91 and cp <= 96)
        or (cp >= 123 and cp <= 126)
    ):
        return True
    cat = unicodedata.category(char)
    if cat.startswith("P"):
        return True
    return False


_SPECIAL_TOKENS = ["[MASK]", "[SEP]", "[PAD]", "[UNK]", "[CLS]"]


def _part_of_whole_word(token, word_start="\u2581"):
    """`SPMTokenizer.part_of_whole_word(token)` (is_bos=False); gpt2_tokenizer.py's is the same
    on the token's decoded text with word_start " " and without the special-token test."""
    if (
        len(token) == 1
        and (_is_whitespace(list(token)[0]) or _is_control(list(token)[0]) or _is_punctuation(list(token)[0]))
    ) or token in _SPECIAL_TOKENS:
        return False
    return not token.startswith(word_start)


def test_spm_word_start_mask_is_original_part_of_whole_word(ours_v2):
    tok = ours_v2
    starts = tok.word_start_mask()
    assert starts.dtype == bool and starts.shape == (tok.vocab_size,)
    for i in range(tok.vocab_size):
        assert starts[i] == (not _part_of_whole_word(tok.id_to_token(i))), tok.id_to_token(i)
    assert all(starts[[tok.pad_id, tok.cls_id, tok.sep_id, tok.unk_id, tok.mask_id]])
    # "▁function" "s": one word; "," and "'" are words of their own, so "▁do" "n" "'" "t" is 2.
    pieces = [tok.id_to_token(i) for i in tok.encode("the functions returned, don't")]
    assert {"s", ",", "'"} <= set(pieces), pieces
    assert [p for p in pieces if starts[tok.token_to_id(p)]] == [p for p in pieces if p[0] in "\u2581,'"]


def test_spm_decode(ours_v2):
    tok = ours_v2
    text = "The object is created, then returned to the caller."
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode("  two   spaces\tand\na newline ")) == "two spaces and a newline"
    ids = [tok.cls_id, *tok.encode("the object"), tok.mask_id, *tok.encode("returned"), tok.sep_id, 0, 0]
    assert tok.decode(ids) == "[CLS] the object [MASK] returned [SEP]"
    unknown = tok.encode("x \u6f22")
    assert tok.unk_id in unknown and tok.decode(unknown) == "x [UNK]"


def test_spm_documents_encode_as_their_joined_text(ours_v2):
    # Without runs of "*": spm breaks ties between equal-score segmentations ("*" "**" vs "**"
    # "*") differently at different offsets, alone or joined, whatever the tokenizer.
    sentences = [s for s in spm_files.sentences(900)[800:] if "**" not in s]
    documents = [sentences[i : i + 5] for i in range(0, 60, 5)] + [
        ["It ends here.", "The next one.", "3 more."]
    ]
    encoded = ours_v2.encode_documents(documents)
    for doc, ids in zip(documents, encoded):
        assert [t for s in ids for t in s] == ours_v2.encode(" ".join(doc)), doc


def test_spm_save_and_load(ours_v2, spm_dir, tmp_path):
    ours_v2.save(str(tmp_path / "saved"))
    assert sorted(os.listdir(tmp_path / "saved")) == ["spm.model", "tokenizer_config.json"]
    loaded = tokenizers.load_tokenizer(str(tmp_path / "saved"))
    assert isinstance(loaded, DebertaSentencePieceTokenizer)
    assert loaded.identity() == ours_v2.identity() and loaded.identity()["kind"] == "deberta_spm"
    assert loaded.encode_batch(TEXTS) == ours_v2.encode_batch(TEXTS)
    # A published folder (spm.model alone, or with HF's own tokenizer_config.json) and the bare
    # file are recognised by the name spm.model.
    assert tokenizers.load_tokenizer(str(spm_dir)).identity() == ours_v2.identity()
    assert tokenizers.load_tokenizer(str(spm_dir / "spm.model")).identity() == ours_v2.identity()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "spm.model").write_bytes((spm_dir / "spm.model").read_bytes())
    (tmp_path / "hf" / "tokenizer_config.json").write_text('{"do_lower_case": false, "vocab_type": "spm"}')
    assert tokenizers.load_tokenizer(str(tmp_path / "hf")).identity() == ours_v2.identity()


def test_spm_export_loads_in_transformers(ours_v2, tmp_path):
    """write_hf_tokenizer's folder: AutoTokenizer gives DebertaV2Tokenizer with our ids, and
    read_tokenizer (model_type "deberta-v2") gives our tokenizer back."""
    import transformers

    out = str(tmp_path / "export")
    convert.write_hf_tokenizer(ours_v2, EncoderConfig(vocab_size=ours_v2.vocab_size), out)
    settings = json.loads((tmp_path / "export" / "tokenizer_config.json").read_text())
    assert settings["tokenizer_class"] == "DebertaV2Tokenizer" and settings["mask_token"] == "[MASK]"
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert type(theirs).__name__ == "DebertaV2Tokenizer"
    assert (theirs.pad_token_id, theirs.cls_token_id, theirs.sep_token_id, theirs.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert theirs.mask_token_id == ours_v2.mask_id and len(theirs) == ours_v2.vocab_size
    for text in TEXTS:
        assert (
            theirs(text)["input_ids"] == tokenizers.pair_inputs(ours_v2, ours_v2.encode(text), None, 512)[0]
        )
    for a, b in PAIRS:
        ids, segments, _ = tokenizers.pair_inputs(ours_v2, ours_v2.encode(a), ours_v2.encode(b), 512)
        assert (ids, segments) == (theirs(a, b)["input_ids"], theirs(a, b)["token_type_ids"])
    back = convert.read_tokenizer(_fmt("deberta-v2"), out, out)
    assert back.identity() == ours_v2.identity()


def test_spm_user_defined_special_pieces(tmp_path):
    """The same with [PAD] [CLS] [SEP] as user-defined pieces (ids 0..2) instead of control
    ones: same ids as HF for text without special tokens written in it."""
    import transformers

    layout = dict(pad_id=-1, bos_id=-1, eos_id=-1, user_defined_symbols=["[PAD]", "[CLS]", "[SEP]"])
    (tmp_path / "spm.model").write_bytes(spm_files.train_spm(800, **layout))
    tok = tokenizers.load_tokenizer(str(tmp_path))
    theirs = transformers.DebertaV2Tokenizer.from_pretrained(str(tmp_path))
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 800)
    assert theirs.mask_token_id == 800
    for text in TEXTS:
        assert tok.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text


def test_spm_with_a_mask_piece_keeps_its_id(tmp_path):
    """A model that has [MASK] (here a user-defined piece) keeps its id and adds nothing, as
    the original's add_special_token and HF do."""
    import transformers

    (tmp_path / "spm.model").write_bytes(spm_files.train_spm(300, user_defined_symbols=["[MASK]"]))
    tok = DebertaSentencePieceTokenizer.from_model_file(str(tmp_path / "spm.model"))
    assert tok.mask_id == 4 and tok.vocab_size == 300
    assert transformers.DebertaV2Tokenizer.from_pretrained(str(tmp_path)).mask_token_id == 4


def test_spm_errors(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "spm.model").write_bytes(b"this is not a protobuf")
    with pytest.raises(
        TokenizerError, match=r"spm\.model: not a SentencePiece model: pass a \.model file"
    ) as e:
        tokenizers.load_tokenizer(str(tmp_path / "bad"))
    _one_line(e)
    # spm's default layout (<unk> <s> </s>) is not DeBERTa's.
    plain = spm_files.train_spm(
        200,
        pad_id=-1,
        pad_piece="<pad>",
        bos_piece="<s>",
        eos_piece="</s>",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        unk_piece="<unk>",
    )
    with pytest.raises(
        TokenizerError, match=r"the model has no \[PAD\] piece: DeBERTa's spm\.model holds"
    ) as e:
        DebertaSentencePieceTokenizer(plain, source="plain.model")
    _one_line(e)
    with pytest.raises(TokenizerError, match="not found"):
        DebertaSentencePieceTokenizer.from_model_file(str(tmp_path / "missing.model"))
    # read_tokenizer: no spm.model, or settings our tokenizer does not implement.
    (tmp_path / "empty").mkdir()
    fmt = _fmt("deberta-v2")
    with pytest.raises(convert.ConversionError, match=r"no spm\.model: a DeBERTa-v2/v3 folder needs") as e:
        convert.read_tokenizer(fmt, str(tmp_path / "empty"), "empty")
    _one_line(e)
    (tmp_path / "lower").mkdir()
    (tmp_path / "lower" / "spm.model").write_bytes(spm_files.train_spm(200))
    (tmp_path / "lower" / "tokenizer_config.json").write_text('{"do_lower_case": true}')
    with pytest.raises(convert.ConversionError, match=r"do_lower_case=True: only do_lower_case=False") as e:
        convert.read_tokenizer(fmt, str(tmp_path / "lower"), "lower")
    _one_line(e)


# ---------------------------------------------------------------- v1: byte-level BPE


def _bytes_to_unicode():
    """GPT-2's byte -> printable character table (microsoft/DeBERTa gpt2_bpe_utils.py)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """DeBERTa v1's published layout in miniature: [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, the 256
    byte symbols and merges, and [MASK] last; vocab.json + merges.txt as HF stores them."""
    import tokenizers as hf_tokenizers

    trainer = hf_tokenizers.trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]"],
        initial_alphabet=hf_tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE())
    bpe.pre_tokenizer = hf_tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.train_from_iterator([spm_files.sentences(800)], trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    vocab = {**model["vocab"], "[MASK]": len(model["vocab"])}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    directory = tmp_path_factory.mktemp("deberta_v1")
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (directory / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(m + "\n" for m in merges), encoding="utf-8"
    )
    (directory / "tokenizer_config.json").write_text('{"do_lower_case": false, "vocab_type": "gpt2"}')
    return directory


@pytest.fixture(scope="module")
def ours_v1(bpe_dir):
    return tokenizers.load_tokenizer(str(bpe_dir))  # told from RoBERTa's by [CLS]


@pytest.fixture(scope="module")
def hf_v1(bpe_dir):
    import transformers

    return transformers.DebertaTokenizer.from_pretrained(str(bpe_dir))


def test_bpe_layout_and_ids_match_transformers(ours_v1, hf_v1):
    tok = ours_v1
    assert isinstance(tok, DebertaBPETokenizer) and tok.identity()["kind"] == "deberta_bpe"
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 600)
    assert (
        tok.vocab_size == 601 and tok.special_ids == frozenset({0, 1, 2, 600}) and tok.pair_format == "bert"
    )
    assert (hf_v1.pad_token_id, hf_v1.cls_token_id, hf_v1.sep_token_id, hf_v1.unk_token_id) == (0, 1, 2, 3)
    assert hf_v1.mask_token_id == 600
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf_v1(text, add_special_tokens=False)["input_ids"], text
        assert tokenizers.pair_inputs(tok, ids, None, 512)[0] == hf_v1(text)["input_ids"], text
        assert tok.unk_id not in ids and tok.decode(ids) == text  # byte-level: lossless
    assert tok.encode_batch(TEXTS) == [tok.encode(t) for t in TEXTS]


def test_bpe_pairs_are_bert_layout(ours_v1, hf_v1):
    """[CLS] A [SEP] B [SEP], segment ids 0/1, as microsoft/DeBERTa and transformers 4.x. (HF
    5.18's DebertaTokenizer template writes [CLS] A [SEP] [SEP] B [SEP], all type 0: not
    followed, so the pair is compared piecewise.)"""
    tok = ours_v1
    for a, b in PAIRS:
        ids_a = hf_v1(a, add_special_tokens=False)["input_ids"]
        ids_b = hf_v1(b, add_special_tokens=False)["input_ids"]
        ids, segments, cut = tokenizers.pair_inputs(tok, tok.encode(a), tok.encode(b), 512)
        assert ids == [1, *ids_a, 2, *ids_b, 2] and not cut
        assert segments == [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)


def test_bpe_word_start_mask_is_original_part_of_whole_word(ours_v1):
    """gpt2_tokenizer.py `part_of_whole_word` on each token's decoded text (errors="replace")."""
    tok = ours_v1
    byte_of = {c: b for b, c in _bytes_to_unicode().items()}
    starts = tok.word_start_mask()
    assert starts.dtype == bool and starts.shape == (tok.vocab_size,)
    for i in range(tok.vocab_size):
        token = tok.id_to_token(i)
        if token in _SPECIAL_TOKENS:
            assert starts[i], token
            continue
        text = bytes(byte_of[c] for c in token).decode("utf-8", errors="replace")
        assert starts[i] == (not _part_of_whole_word(text, word_start=" ")), token
    # "," starts a word here (RoBERTa's rule, "Ġ" only, says it continues one).
    pieces = [tok.id_to_token(i) for i in tok.encode("the functions, returned")]
    assert "," in pieces and starts[tok.token_to_id(",")]
    assert [p for p in pieces if starts[tok.token_to_id(p)]] == [p for p in pieces if p[0] in ",\u0120"]


def test_bpe_save_load_export(ours_v1, bpe_dir, tmp_path):
    import transformers

    tok = ours_v1
    tok.save(str(tmp_path / "saved"))
    assert sorted(os.listdir(tmp_path / "saved")) == ["merges.txt", "tokenizer_config.json", "vocab.json"]
    loaded = tokenizers.load_tokenizer(str(tmp_path / "saved"))
    assert isinstance(loaded, DebertaBPETokenizer) and loaded.identity() == tok.identity()
    assert tokenizers.load_tokenizer(str(bpe_dir / "vocab.json")).identity() == tok.identity()
    out = str(tmp_path / "export")
    convert.write_hf_tokenizer(tok, EncoderConfig(vocab_size=tok.vocab_size), out)
    settings = json.loads((tmp_path / "export" / "tokenizer_config.json").read_text())
    assert settings["tokenizer_class"] == "DebertaTokenizer" and settings["add_prefix_space"] is False
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert type(theirs).__name__ == "DebertaTokenizer"
    assert (theirs.cls_token_id, theirs.sep_token_id, theirs.pad_token_id, theirs.mask_token_id) == (
        1,
        2,
        0,
        600,
    )
    for text in TEXTS:
        assert theirs(text)["input_ids"] == tokenizers.pair_inputs(tok, tok.encode(text), None, 512)[0]
    back = convert.read_tokenizer(_fmt("deberta"), out, out)
    assert isinstance(back, DebertaBPETokenizer) and back.identity() == tok.identity()


def test_bpe_errors(bpe_dir, tmp_path):
    vocab = json.loads((bpe_dir / "vocab.json").read_text(encoding="utf-8"))
    del vocab["[MASK]"]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (tmp_path / "merges.txt").write_text(
        (bpe_dir / "merges.txt").read_text(encoding="utf-8"), encoding="utf-8"
    )
    with pytest.raises(
        TokenizerError, match=r"the vocab has no \[MASK\] token: DeBERTa needs \[PAD\], \[CLS\]"
    ) as e:
        tokenizers.load_tokenizer(str(tmp_path))
    _one_line(e)
    # A RoBERTa vocab in a DeBERTa folder: the import names what is missing.
    roberta = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4}
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "vocab.json").write_text(json.dumps(roberta))
    (tmp_path / "r" / "merges.txt").write_text("#version: 0.2\n")
    fmt = _fmt("deberta")
    with pytest.raises(TokenizerError, match=r"the vocab has no \[PAD\] token: DeBERTa needs") as e:
        convert.read_tokenizer(fmt, str(tmp_path / "r"), "r")
    _one_line(e)
    (tmp_path / "none").mkdir()
    with pytest.raises(
        convert.ConversionError, match=r"no vocab\.json \+ merges\.txt: a DeBERTa folder"
    ) as e:
        convert.read_tokenizer(fmt, str(tmp_path / "none"), "none")
    _one_line(e)
    (tmp_path / "r" / "tokenizer_config.json").write_text('{"add_prefix_space": true}')
    with pytest.raises(convert.ConversionError, match=r"add_prefix_space=True: only add_prefix_space=False"):
        convert.read_tokenizer(fmt, str(tmp_path / "r"), "r")


def test_word_start_rule_examples():
    """The shared rule on hand-picked texts: a leading space, or a lone boundary character."""
    rule = tokenizers.deberta._is_deberta_word_start
    assert (
        rule("\u2581the", "\u2581")
        and rule(",", "\u2581")
        and rule("'", "\u2581")
        and rule("\u3002", "\u2581")
    )
    assert not rule("s", "\u2581") and not rule("1,", "\u2581") and not rule("\u00e9", "\u2581")
    assert rule(" the", " ") and rule("\t", " ") and not rule("\ufffd", " ") and not rule("the", " ")
    assert np.array_equal([rule(c, " ") for c in "a1.-"], [False, False, True, True])


# ---------------------------------------------------------------- both: model sizes, transformers' settings


def test_fits_vocab_allows_spare_rows(ours_v1, ours_v2):
    """DeBERTa's published tables have rows no id reaches (v2/v3: 128100 for 128001 tokens)."""
    for tok in (ours_v1, ours_v2):
        n = tok.vocab_size
        assert tok.fits_vocab(n) and tok.fits_vocab(n + 99) and not tok.fits_vocab(n - 1)


def test_hf_special_tokens_and_settings(ours_v1, ours_v2, tmp_path):
    """What interop.convert.write_hf_tokenizer writes for transformers: [CLS] / [SEP] are also
    bos / eos, and the settings the published models fix (HF_FIXED_SETTINGS, which
    interop.convert.read_tokenizer requires of a published folder)."""
    from models.encoder import EncoderConfig

    specials = {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
        "bos_token": "[CLS]",
        "eos_token": "[SEP]",
    }
    assert ours_v1.hf_special_tokens() == specials and ours_v2.hf_special_tokens() == specials
    assert DebertaBPETokenizer.HF_FIXED_SETTINGS == {"add_prefix_space": False}
    assert DebertaSentencePieceTokenizer.HF_FIXED_SETTINGS == {
        "do_lower_case": False,
        "split_by_punct": False,
    }
    assert ours_v1.hf_settings() == {"tokenizer_class": "DebertaTokenizer", "add_prefix_space": False}
    assert ours_v2.hf_settings() == {
        "tokenizer_class": "DebertaV2Tokenizer",
        "do_lower_case": False,
        "split_by_punct": False,
    }
    for tok in (ours_v1, ours_v2):
        out = tmp_path / tok.identity()["kind"]
        convert.write_hf_tokenizer(tok, EncoderConfig(vocab_size=tok.vocab_size), str(out))
        written = json.loads((out / "tokenizer_config.json").read_text())
        expected = {"kind": tok.identity()["kind"], "model_max_length": 512}
        assert written == {**expected, **tok.hf_special_tokens(), **tok.hf_settings()}
        assert json.loads((out / "special_tokens_map.json").read_text()) == tok.hf_special_tokens()
        # Our tokenizer_config.json names the kind: the folder loads through the registry.
        assert tokenizers.load_tokenizer(str(out)).identity() == tok.identity()
