"""Importing transformers folders as transformers 5 saves them: a tokenizer is tokenizer.json +
tokenizer_config.json, with none of the files our tokenizer backends read (vocab.txt,
vocab.json + merges.txt, spiece.model / spm.model), and its special tokens may be named
otherwise than a backend names them (here DeBERTa-v2's pad and unk are <pad> and <unk>).

For each family a tiny tokenizer is built here and made into the transformers 5.18 tokenizer
of that family the way a user makes one (from a vocab dict and merges, or from an spm model
file through from_pretrained), a random model of hf_parity.SIZE takes its vocabulary size,
and both are saved with save_pretrained. The import (interop.convert.run_import) must give
transformers' outputs on ids our workdir tokenizer makes, and that tokenizer (read back by
data.tokenizers.load_tokenizer) must give transformers' ids.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable

import numpy as np
import pytest
import tokenizers as hf_tokenizers
import torch  # requirements-test.txt: the reference implementation, CPU
import transformers

from data import tokenizers
from interop import bundle, convert, encode
from interop.convert import cli as convert_cli
from tests import hf_parity, spm_files

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()
TOLERANCE = 1e-4  # max abs diff in float32, as tests/test_convert.py; measured values print with -s
SENTENCES = spm_files.sentences(300)  # the tiny vocabs' corpus
# Accents (NFC and NFD), punctuation and digits, words and characters the tiny vocabs lack,
# whitespace runs, compatibility characters, a word longer than WordPiece's 100 characters.
TEXTS = [
    "The object is created, then returned to the caller.",
    "Numbers: 3.14, 1,000 and 2024-01-05! (x+y)*z; don't stop.",
    "Caf\u00e9 na\u00efve \u00fcber Zu\u0308rich \u00c5ngstr\u00f6m",
    "emoji \U0001f600 and \u6f22\u5b57 and \u0416\u0443\u043a",
    "qwxzj zyzzyva floccinaucinihilipilification",
    "  several   spaces\tand a tab\nand a newline  ",
    "\ufb01ne \uff11\uff12",
    "object" * 20,
    "",
    # Chinese, mixed with English, full-width punctuation and digits (bert-base-chinese's use).
    "北京大学的学生在学习语言模型。",
    "我们用GPT-4和BERT做了３个实验，准确率是97.5%！“你好”（测试）",
]
# Chinese for the Chinese vocabulary (bert-base-chinese's layout: every character, and "##"
# and the character for each, beside English pieces).
CHINESE = [
    "北京大学的学生在学习语言模型。",
    "我们用三个实验测试准确率，你好！",
    "中文句子的对象被创建，然后返回。",
]
PAIRS = [("The object is created.", "It is then returned to the caller (x+y).")]
# interop.encode's lines for the parity check: a sentence and a pair.
LINES = [
    "Caf\u00e9 na\u00efve: the object is created, then returned! 北京大学的学生。",
    "The object is created.\t我们用三个实验测试。",
]
# The files save_pretrained writes for a model and a transformers 5.18 tokenizer.
HF5_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def _wordpiece_vocab(lowercase: bool) -> dict[str, int]:
    trained = tokenizers.train_wordpiece([SENTENCES], 400, lowercase=lowercase)
    return {trained.id_to_token(i): i for i in range(trained.vocab_size)}


def _bpe(special_tokens: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocab (GPT-2's alphabet, `special_tokens` first) and its merges."""
    trainer = hf_tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special_tokens,
        initial_alphabet=hf_tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE())
    bpe.pre_tokenizer = hf_tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.train_from_iterator([SENTENCES], trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    return model["vocab"], [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]


def _from_spm(cls, root, name: str, model: bytes, **kwargs):
    """A transformers 5 tokenizer from an spm model file (the way 5.x reads one: from_pretrained)."""
    source = root / f"{name}_spm"
    source.mkdir()
    (source / name).write_bytes(model)
    return cls.from_pretrained(str(source), **kwargs)


def _bert_tokenizer(root):
    return transformers.BertTokenizer(vocab=_wordpiece_vocab(True), do_lower_case=True)


def _bert_chinese_tokenizer(root):
    vocab = _wordpiece_vocab(True)
    for char in sorted({c for sentence in CHINESE for c in sentence}):
        for token in (char, "##" + char):
            vocab.setdefault(token, len(vocab))
    return transformers.BertTokenizer(vocab=vocab, do_lower_case=True)


def _electra_tokenizer(root):
    return transformers.ElectraTokenizer(vocab=_wordpiece_vocab(False), do_lower_case=False)


def _roberta_tokenizer(root):
    vocab, merges = _bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    return transformers.RobertaTokenizer(vocab=vocab, merges=merges)


def _albert_tokenizer(root):
    # ALBERT's layout: <pad>=0 <unk>=1, control pieces [CLS] [SEP] [MASK].
    layout = dict(pad_id=0, pad_piece="<pad>", unk_id=1, unk_piece="<unk>", bos_id=-1, eos_id=-1)
    model = spm_files.train_spm(300, **layout, control_symbols=["[CLS]", "[SEP]", "[MASK]"])
    return _from_spm(transformers.AlbertTokenizer, root, "spiece.model", model)


def _deberta_tokenizer(root):
    # DeBERTa v1's layout: [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, the byte symbols and merges, [MASK] last.
    vocab, merges = _bpe(["[PAD]", "[CLS]", "[SEP]", "[UNK]"])
    return transformers.DebertaTokenizer(vocab={**vocab, "[MASK]": len(vocab)}, merges=merges)


def _deberta_v2_tokenizer(root):
    # DeBERTa-v2's layout ([CLS]=1 [SEP]=2, [MASK] added after the pieces), but with spm's own
    # names for pad and unk, which the folder's tokenizer_config.json then names.
    model = spm_files.train_spm(300, pad_piece="<pad>", unk_piece="<unk>")
    return _from_spm(
        transformers.DebertaV2Tokenizer, root, "spm.model", model, pad_token="<pad>", unk_token="<unk>"
    )


# family -> the transformers 5.18 tokenizer, built in a folder `root`.
TOKENIZERS: dict[str, Callable] = {
    "bert": _bert_tokenizer,
    "bert-chinese": _bert_chinese_tokenizer,
    "roberta": _roberta_tokenizer,
    "albert": _albert_tokenizer,
    "electra": _electra_tokenizer,
    "deberta": _deberta_tokenizer,
    "deberta-v2": _deberta_v2_tokenizer,
}
_DEBERTA = dict(
    relative_attention=True,
    max_relative_positions=16,
    pos_att_type="p2c|c2p",
    position_biased_input=False,
    type_vocab_size=0,
)
# family -> (transformers config class, model class, config keys beyond hf_parity.SIZE).
MODELS = {
    "bert": (transformers.BertConfig, transformers.BertForMaskedLM, {}),
    "bert-chinese": (transformers.BertConfig, transformers.BertForMaskedLM, {}),
    "roberta": (
        transformers.RobertaConfig,
        transformers.RobertaForMaskedLM,
        dict(max_position_embeddings=42, type_vocab_size=1, layer_norm_eps=1e-5),
    ),
    "albert": (
        transformers.AlbertConfig,
        transformers.AlbertForMaskedLM,
        dict(embedding_size=16, hidden_act="gelu_new"),
    ),
    "electra": (transformers.ElectraConfig, transformers.ElectraForPreTraining, dict(embedding_size=16)),
    "deberta": (transformers.DebertaConfig, transformers.DebertaForMaskedLM, _DEBERTA),
    "deberta-v2": (
        transformers.DebertaV2Config,
        transformers.DebertaV2ForMaskedLM,
        dict(_DEBERTA, position_buckets=4, norm_rel_ebd="layer_norm", share_att_key=True),
    ),
}
# The data/tokenizers kind whose conventions each family's tokenizer.json is read with.
FOLLOWS = {
    "bert": "wordpiece",
    "bert-chinese": "wordpiece",
    "roberta": "bpe",
    "albert": "sentencepiece",
    "electra": "wordpiece",
    "deberta": "deberta_bpe",
    "deberta-v2": "deberta_spm",
}


@dataclasses.dataclass
class Folder:
    family: str
    model: torch.nn.Module
    hf_dir: str
    workdir: str  # the import
    files: list[str]  # what save_pretrained wrote


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Callable[[str], Folder]:
    """family -> its transformers 5 folder and import (built once per family)."""
    built: dict[str, Folder] = {}

    def get(family: str) -> Folder:
        if family not in built:
            root = tmp_path_factory.mktemp(family)
            tokenizer = TOKENIZERS[family](root)
            config_class, model_class, keys = MODELS[family]
            size = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
            model = hf_parity.randomize(
                model_class(config_class(**{**hf_parity.SIZE, **keys, **size})), seed=0
            )
            hf_dir = str(root / "hf")
            model.save_pretrained(hf_dir)
            tokenizer.save_pretrained(hf_dir)
            workdir = str(root / "imported")
            convert_cli.run_import(f"hf:{hf_dir}", workdir)
            built[family] = Folder(family, model, hf_dir, workdir, sorted(os.listdir(hf_dir)))
        return built[family]

    return get


def _theirs(folder: Folder, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' last hidden state and (but for ELECTRA's discriminator) MLM logits."""
    with torch.no_grad():
        out = folder.model(
            **{k: torch.from_numpy(v.astype(np.int64)) for k, v in inputs.items()}, output_hidden_states=True
        )
    theirs = {"last_hidden_state": out.hidden_states[-1].numpy()}
    if folder.family != "electra":
        theirs["mlm_logits"] = out.logits.numpy()
    return theirs


@pytest.mark.slow
@pytest.mark.parametrize("family", TOKENIZERS)
@pytest.mark.extended(keep=["bert", "electra"])
def test_import_matches_transformers(folders, family):
    """save_pretrained writes no legacy tokenizer file; the import reads tokenizer.json, and our
    model gives transformers' outputs on the ids our workdir tokenizer makes."""
    folder = folders(family)
    assert folder.files == HF5_FILES
    pretrained = bundle.load_pretrained(folder.workdir)
    tokenizer = pretrained.tokenizer
    assert isinstance(tokenizer, tokenizers.TokenizerJsonTokenizer) and tokenizer.follows == FOLLOWS[family]
    inputs = encode.build_inputs(tokenizer, LINES, 32)
    ours = hf_parity.our_outputs(pretrained, inputs)
    diffs = hf_parity.max_diffs(ours, _theirs(folder, inputs), inputs["attention_mask"])
    print(f"{family} (transformers 5 folder) import max abs diff:", diffs)
    assert max(diffs.values()) < TOLERANCE, diffs


@pytest.mark.parametrize("family", TOKENIZERS)
def test_workdir_tokenizer_encodes_as_transformers(folders, family, tmp_path):
    """Our workdir's tokenizer, read back by load_tokenizer, gives the ids of the folder's
    transformers tokenizer; so does our export of it (write_hf_tokenizer), and so does the
    folder itself read by load_tokenizer."""
    folder = folders(family)
    theirs = transformers.AutoTokenizer.from_pretrained(folder.hf_dir)
    ours = tokenizers.load_tokenizer(os.path.join(folder.workdir, "tokenizer"))
    assert ours.identity() == bundle.load_pretrained(folder.workdir).tokenizer.identity()
    assert ours.vocab_size == len(theirs)
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (
        theirs.pad_token_id,
        theirs.unk_token_id,
        theirs.cls_token_id,
        theirs.sep_token_id,
        theirs.mask_token_id,
    )
    texts = [*TEXTS, f"Paris is the {theirs.mask_token} of France."]  # a special token written in the text
    encoded = ours.encode_batch(texts)
    for text, ids in zip(texts, encoded):
        assert ids == ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
        assert tokenizers.pair_inputs(ours, ids, None, 128)[0] == theirs(text)["input_ids"], text
    if family not in ("roberta", "deberta"):  # byte-level BPE has every byte: never unk
        assert any(ours.unk_id in ids for ids in encoded)  # the tiny vocabs lack some characters
    for a, b in PAIRS:
        ids, segments, _ = tokenizers.pair_inputs(ours, ours.encode(a), ours.encode(b), 128)
        expected = theirs(a, b)
        if family == "deberta":
            # The one layout that differs, as with a vocab.json folder (data/tokenizers/deberta.py):
            # 5.18's DebertaTokenizer writes [CLS] A [SEP] [SEP] B [SEP]; ours is the original's.
            a_ids, b_ids = ours.encode(a), ours.encode(b)
            cls, sep = ours.cls_id, ours.sep_id
            assert expected["input_ids"] == [cls, *a_ids, sep, sep, *b_ids, sep]
            assert ids == [cls, *a_ids, sep, *b_ids, sep] and segments[-1] == 1
            continue
        assert ids == expected["input_ids"]
        if "token_type_ids" in expected:  # RoBERTa's and ALBERT's transformers classes give none
            assert segments == expected["token_type_ids"]
    # A document's sentences encode as their joined text (pretraining data, data/preprocess.py).
    document = SENTENCES[:4]
    assert sum(ours.encode_documents([document])[0], []) == ours.encode(" ".join(document))
    assert ours.word_start_mask().shape == (ours.vocab_size,)
    # The raw folder through load_tokenizer (its tokenizer_class names the conventions).
    assert tokenizers.load_tokenizer(folder.hf_dir).identity() == ours.identity()
    # Our export of the tokenizer loads in transformers with the same ids.
    pretrained = bundle.load_pretrained(folder.workdir)
    convert.write_hf_tokenizer(ours, pretrained.config, str(tmp_path / "export"))
    exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    assert type(exported) is type(theirs)
    for text in texts:
        assert exported(text)["input_ids"] == theirs(text)["input_ids"], text
    assert tokenizers.load_tokenizer(str(tmp_path / "export")).identity() == ours.identity()


def _backend_tokenizer(folder: Folder) -> tokenizers.Tokenizer:
    """The family's own tokenizer backend on the same vocabulary, from the folder's
    tokenizer.json (WordPiece, BPE) or the spm model its tokenizer was made from (ALBERT)."""
    with open(os.path.join(folder.hf_dir, "tokenizer.json"), encoding="utf-8") as f:
        model = json.load(f)["model"]
    if folder.family == "albert":
        spm_path = os.path.join(os.path.dirname(folder.hf_dir), "spiece.model_spm", "spiece.model")
        return tokenizers.SentencePieceTokenizer.from_model_file(spm_path)
    if model["type"] == "WordPiece":
        tokens = sorted(model["vocab"], key=model["vocab"].__getitem__)
        return tokenizers.WordPieceTokenizer(tokens, lowercase=folder.family == "bert")
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    backend = (
        tokenizers.DebertaBPETokenizer if folder.family == "deberta" else tokenizers.ByteLevelBPETokenizer
    )
    return backend(model["vocab"], merges)


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "electra", "deberta"])
def test_conventions_are_the_family_backends(folders, family):
    """What tokenizer.json does not say comes from the family's backend: on the same vocabulary
    (DeBERTa-v2's here has no backend twin: its specials are named otherwise) the tokens,
    special ids, pair format, whole-word masking rule and vocabulary check are the backend's."""
    folder = folders(family)
    ours = bundle.load_pretrained(folder.workdir).tokenizer
    backend = _backend_tokenizer(folder)
    assert [ours.id_to_token(i) for i in range(ours.vocab_size)] == [
        backend.id_to_token(i) for i in range(backend.vocab_size)
    ]
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id, ours.special_ids) == (
        backend.pad_id,
        backend.unk_id,
        backend.cls_id,
        backend.sep_id,
        backend.mask_id,
        backend.special_ids,
    )
    assert ours.pair_format == backend.pair_format
    np.testing.assert_array_equal(ours.word_start_mask(), backend.word_start_mask())
    assert ours.word_start_mask().any() and not ours.word_start_mask().all()
    size = ours.vocab_size
    assert [ours.fits_vocab(n) for n in (size - 1, size, size + 1)] == [
        backend.fits_vocab(n) for n in (size - 1, size, size + 1)
    ]
    assert ours.hf_settings()["tokenizer_class"] == backend.hf_settings()["tokenizer_class"]


def _copy(folder: Folder, directory) -> str:
    shutil.copytree(folder.hf_dir, directory)
    return str(directory)


def test_which_tokenizer_files_are_read(folders, tmp_path, caplog):
    """The family's own files when they are the folder's tokenizer (older folders: unchanged),
    tokenizer.json when they are absent or name other special tokens; one-line errors when
    neither gives the folder's tokenizer."""
    bert, v2 = folders("bert"), folders("deberta-v2")
    fmt = convert.FORMATS["bert"]
    # vocab.txt beside tokenizer.json (a transformers 4 folder): our WordPiece, as before.
    both = _copy(bert, tmp_path / "both")
    backend = _backend_tokenizer(bert)
    backend.save(str(tmp_path / "wordpiece"))
    shutil.copy(tmp_path / "wordpiece" / "vocab.txt", both)
    assert convert.read_tokenizer(fmt, both, both).identity() == backend.identity()
    # DeBERTa-v2's spm.model beside it, whose pad piece is <pad> as tokenizer_config.json says:
    # our spm backend has no such model (it needs [PAD]), so tokenizer.json is read.
    spm_model = os.path.join(os.path.dirname(v2.hf_dir), "spm.model_spm", "spm.model")
    with_spm = _copy(v2, tmp_path / "with_spm")
    shutil.copy(spm_model, with_spm)
    caplog.set_level("INFO", logger="convert")
    read = convert.read_tokenizer(convert.FORMATS["deberta-v2"], with_spm, "hf:with_spm")
    assert read.identity() == bundle.load_pretrained(v2.workdir).tokenizer.identity()
    assert read.id_to_token(read.pad_id) == "<pad>" and read.id_to_token(read.unk_id) == "<unk>"
    assert "has no [PAD] piece" in caplog.text and "reading its tokenizer.json instead" in caplog.text
    # ... and without tokenizer.json that is the error.
    os.remove(os.path.join(with_spm, "tokenizer.json"))
    with pytest.raises(tokenizers.TokenizerError, match=r"spm\.model: the model has no \[PAD\] piece"):
        convert.read_tokenizer(convert.FORMATS["deberta-v2"], with_spm, "hf:with_spm")
    # A vocab.txt whose special tokens are not those tokenizer_config.json names, no tokenizer.json.
    other = tmp_path / "other_names"
    other.mkdir()
    shutil.copy(tmp_path / "wordpiece" / "vocab.txt", other)
    (other / "tokenizer_config.json").write_text(
        '{"pad_token": "<pad>", "mask_token": {"content": "[MASK]"}}'
    )
    with pytest.raises(convert.ConversionError) as e:
        convert.read_tokenizer(fmt, str(other), "hf:other_names")
    assert str(e.value) == (
        "hf:other_names: names pad_token='<pad>', but its tokenizer files make that '[PAD]': "
        "these files are not the folder's tokenizer"
    )
    # Neither vocab.txt nor tokenizer.json.
    (tmp_path / "none").mkdir()
    with pytest.raises(convert.ConversionError) as e:
        convert.read_tokenizer(fmt, str(tmp_path / "none"), "hf:none")
    assert str(e.value) == (
        "hf:none: no vocab.txt: a BERT folder needs its WordPiece vocab "
        "(or the tokenizer.json transformers 5 saves)"
    )
    # Another family's tokenizer.json (RoBERTa's BPE in a BERT folder).
    wrong = _copy(bert, tmp_path / "wrong")
    shutil.copy(os.path.join(folders("roberta").hf_dir, "tokenizer.json"), wrong)
    with pytest.raises(convert.ConversionError) as e:
        convert.read_tokenizer(fmt, wrong, "hf:wrong")
    assert str(e.value).startswith("hf:wrong: ") and str(e.value).endswith(
        "tokenizer.json: holds a BPE model, but a wordpiece tokenizer's is WordPiece: "
        "the tokenizer does not belong to this model"
    )
