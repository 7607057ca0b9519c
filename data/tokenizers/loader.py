"""`load_tokenizer`: a tokenizer from a directory or a file, of any kind.

A directory whose tokenizer_config.json names a "kind" loads through that kind's registered
loader (data/tokenizers/base.py `register_kind`); any other directory or file is told by its
file names, so published vocabs load directly: BERT's vocab.txt, RoBERTa's and DeBERTa v1's
vocab.json + merges.txt (told apart by their special tokens), ALBERT's spiece.model /
30k-clean.model, XLNet's spiece.model and DeBERTa-v2/v3's spm.model; and a transformers
folder with none of those but a tokenizer.json (transformers 5 saves only that and tokenizer_config.json) as a
tokenizer_json tokenizer following the kind of its tokenizer_class.
"""

from __future__ import annotations

import json
import os

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import tensorflow as tf

from data.tokenizers import base
from data.tokenizers.base import CLS, CONFIG_FILE, Tokenizer, TokenizerError
from data.tokenizers.bpe import BPE_MERGES_FILE, BPE_VOCAB_FILE, ByteLevelBPETokenizer, read_bpe_files
from data.tokenizers.deberta import DEBERTA_SPM_FILE, DebertaBPETokenizer, DebertaSentencePieceTokenizer
from data.tokenizers.sentencepiece import SP_MODEL_FILE, SentencePieceTokenizer
from data.tokenizers.tokenizer_json import TOKENIZER_JSON_FILE, TokenizerJsonTokenizer, kind_of_hf_class
from data.tokenizers.wordpiece import VOCAB_FILE, WordPieceTokenizer
from data.tokenizers.xlnet import XLNET_EOD, XLNetTokenizer

ALL_KINDS = base.registered_kinds()  # the kinds `load_tokenizer` reads


def load_bpe_files(vocab_path: str, merges_path: str) -> ByteLevelBPETokenizer:
    """RoBERTa's or DeBERTa v1's vocab.json + merges.txt, told apart by the special tokens:
    a vocab with [CLS] and no <s> is DeBERTa's (`DebertaBPETokenizer`)."""
    vocab, merges = read_bpe_files(vocab_path, merges_path)
    deberta = CLS in vocab and "<s>" not in vocab
    return (DebertaBPETokenizer if deberta else ByteLevelBPETokenizer)(vocab, merges, source=vocab_path)


def load_spiece_model(path: str) -> SentencePieceTokenizer:
    """ALBERT's or XLNet's spiece.model, told apart by XLNet's <eod> piece (`XLNetTokenizer`,
    cased as the published XLNets; else ALBERT's, uncased)."""
    if not tf.io.gfile.exists(path):
        raise TokenizerError(f"SentencePiece model '{path}' not found")
    with tf.io.gfile.GFile(path, "rb") as f:
        proto = f.read()
    processor = SentencePieceTokenizer._load(proto, path, "ALBERT's or XLNet's spiece.model")
    xlnet = processor.piece_to_id(XLNET_EOD) != processor.unk_id()
    return (XLNetTokenizer if xlnet else SentencePieceTokenizer)(proto, source=path)


def load_tokenizer(path: str) -> Tokenizer:
    """Loads a tokenizer from a directory or a file, detecting its kind.

    A directory whose tokenizer_config.json names a "kind" loads that kind. Otherwise: vocab.txt ->
    WordPiece (casing inferred); vocab.json + merges.txt -> byte-level BPE (DeBERTa's when the
    vocab has [CLS] and no <s>, `load_bpe_files`); spm.model -> DeBERTa-v2/v3 SentencePiece;
    spiece.model or a single *.model -> ALBERT's SentencePiece (uncased, as every published
    ALBERT), or XLNet's when it has an <eod> piece (`load_spiece_model`); tokenizer.json ->
    that pipeline (`TokenizerJsonTokenizer`) with the conventions of the kind whose
    transformers class its tokenizer_config.json names. A file: spm.model
    -> DeBERTa SentencePiece, another *.model -> ALBERT's or XLNet's, vocab.json -> BPE (merges.txt
    beside it), else a WordPiece vocab.txt.

    Raises:
      TokenizerError: nothing loadable at `path`, an unknown kind, or bad tokenizer files.
    """
    if tf.io.gfile.isdir(path):
        config_path = os.path.join(path, CONFIG_FILE)
        config = _read_config(config_path) if tf.io.gfile.exists(config_path) else {}
        if "kind" in config:
            return _load_configured(path, config_path, config)
        names = set(tf.io.gfile.listdir(path))
        if VOCAB_FILE in names:
            return WordPieceTokenizer.from_vocab_file(os.path.join(path, VOCAB_FILE))
        if BPE_VOCAB_FILE in names:
            return load_bpe_files(os.path.join(path, BPE_VOCAB_FILE), os.path.join(path, BPE_MERGES_FILE))
        if DEBERTA_SPM_FILE in names:
            return DebertaSentencePieceTokenizer.from_model_file(os.path.join(path, DEBERTA_SPM_FILE))
        model_files = sorted(n for n in names if n.endswith(".model"))
        if SP_MODEL_FILE in names or len(model_files) == 1:
            name = SP_MODEL_FILE if SP_MODEL_FILE in names else model_files[0]
            return load_spiece_model(os.path.join(path, name))
        if TOKENIZER_JSON_FILE in names:
            return _load_hf_tokenizer_json(path, config)
        raise TokenizerError(
            f"'{path}' holds no {CONFIG_FILE}, {VOCAB_FILE}, {BPE_VOCAB_FILE} + {BPE_MERGES_FILE}, "
            f"one *.model ({SP_MODEL_FILE}, {DEBERTA_SPM_FILE}) or {TOKENIZER_JSON_FILE}: pass a "
            "directory written by `python -m data.tokenizers train` or a published tokenizer's files"
        )
    if not tf.io.gfile.exists(path):
        raise TokenizerError(f"no tokenizer at '{path}': pass a tokenizer directory or a vocab file")
    if os.path.basename(path) == DEBERTA_SPM_FILE:
        return DebertaSentencePieceTokenizer.from_model_file(path)
    if path.endswith(".model"):
        return load_spiece_model(path)
    if path.endswith(".json"):
        return load_bpe_files(path, os.path.join(os.path.dirname(path), BPE_MERGES_FILE))
    return WordPieceTokenizer.from_vocab_file(path)


def _read_config(config_path: str) -> dict:
    """A directory's tokenizer_config.json ({} when it is not a JSON object)."""
    with tf.io.gfile.GFile(config_path, "r") as f:
        try:
            config = json.loads(f.read())
        except json.JSONDecodeError as e:
            raise TokenizerError(
                f"{config_path}: not valid JSON ({e}): rewrite it or train the tokenizer again"
            ) from None
    return config if isinstance(config, dict) else {}


def _load_configured(path: str, config_path: str, config: dict) -> Tokenizer:
    """The tokenizer of the "kind" our tokenizer_config.json (`config`) names."""
    kind = config["kind"]
    load = base.kind_loader(kind)
    if load is None:
        raise TokenizerError(
            f"{config_path}: unknown tokenizer kind {kind!r}: this version reads "
            f"{', '.join(base.registered_kinds())}"
        )
    return load(path, config)


def _load_hf_tokenizer_json(path: str, config: dict) -> Tokenizer:
    """A transformers folder's tokenizer.json, following the kind of its tokenizer_class."""
    kind = kind_of_hf_class(config.get("tokenizer_class"))
    if kind is None:
        known = ", ".join(b._HF_CLASS for b in base.registered_backends())
        raise TokenizerError(
            f"'{path}': its tokenizer.json is read as the tokenizer of a known transformers class, but "
            f"{CONFIG_FILE} names tokenizer_class={config.get('tokenizer_class')!r}: one of {known}"
        )
    return TokenizerJsonTokenizer.from_hf_folder(path, kind, config)
