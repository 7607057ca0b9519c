"""Tokenizers of the BERT family: WordPiece, byte-level BPE, SentencePiece (ALBERT's), DeBERTa's
and XLNet's.

One `Tokenizer` protocol and six backends: BERT's WordPiece and RoBERTa's byte-level BPE (both
on the `tokenizers` library), ALBERT's SentencePiece unigram (`sentencepiece`), DeBERTa's
two: v1's byte-level BPE with BERT-style special tokens, and v2/v3's SentencePiece, and XLNet's
SentencePiece (`xlnet_spm`). A seventh kind runs a transformers tokenizer.json as it stands,
with the conventions of one of the six (`TokenizerJsonTokenizer`: the tokenizer of a
transformers 5 folder, which has no vocab file of the six's).

Every backend gives the protocol's special ids, a `pair_format` ("bert": `[CLS] A [SEP] B
[SEP]`; "roberta": `<s> A </s></s> B </s>`; "xlnet": `A <sep> B <sep> <cls>`) and
`word_start_mask()` for whole-word and n-gram masking. `identity()["kind"]` is "wordpiece",
"bpe", "sentencepiece", "deberta_bpe", "deberta_spm", "xlnet_spm" or "tokenizer_json".

A tokenizer lives in a directory (`save` / `load_tokenizer`, which detects the kind):

    tokenizer_config.json  {"kind": "wordpiece" | "bpe" | "sentencepiece" | ..., ...}
    vocab.txt              wordpiece: one token per line; line i (from 0) is id i
    vocab.json merges.txt  bpe, deberta_bpe: token -> id, and the merges in rank order (GPT-2's
                           format)
    spiece.model           sentencepiece, xlnet_spm: the serialized spm model
    spm.model              deberta_spm: the serialized spm model (HF's DeBERTa-v2 file name)
    tokenizer.json         tokenizer_json: transformers' pipeline file, byte for byte

Published vocabs load directly: BERT's vocab.txt (casing inferred), RoBERTa's directory with
vocab.json + merges.txt, ALBERT's spiece.model / 30k-clean.model, DeBERTa's vocab.json +
merges.txt (told from RoBERTa's by its [CLS] token), DeBERTa-v2/v3's spm.model, XLNet's
spiece.model (told from ALBERT's by its <eod> piece), and a transformers folder's
tokenizer.json when it has none of those. Train a new vocab (WordPiece, BPE, ALBERT's or
XLNet's SentencePiece) with

    python -m data.tokenizers train --corpus=SPEC --output=DIR
        [--kind=wordpiece|bpe|sentencepiece|xlnet_spm]
        [--vocab_size=N (default 30522 / 50265 / 30000 / 32000)] [--cased]

The modules: base.py (the protocol, the shared pieces, the registry of kinds), one per backend
(wordpiece.py, bpe.py, sentencepiece.py, deberta.py, xlnet.py: each registers the kinds it
loads),
tokenizer_json.py (transformers' tokenizer.json under a backend's conventions), loader.py
(`load_tokenizer`), training.py (the trainers) and cli.py (the command line, `python -m
data.tokenizers`).
"""

from __future__ import annotations

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from data.tokenizers.base import (
    CLS,
    CONFIG_FILE,
    MASK,
    PAD,
    SEP,
    SPECIAL_TOKENS,
    UNK,
    Tokenizer,
    TokenizerError,
    VocabTable,
    backend_of,
    pair_inputs,
    register_backend,
    register_kind,
    registered_backends,
    registered_kinds,
    truncate_seq_pair,
)

# isort: off
# Importing a backend registers the kinds it loads, in this order: the order in which an
# unknown kind's error lists the kinds this version reads (the kinds `train` makes first).
from data.tokenizers.wordpiece import VOCAB_FILE, WordPieceTokenizer
from data.tokenizers.bpe import BPE_MERGES_FILE, BPE_SPECIAL_TOKENS, BPE_VOCAB_FILE, ByteLevelBPETokenizer
from data.tokenizers.sentencepiece import (
    SP_CONTROL_SYMBOLS,
    SP_MODEL_FILE,
    SP_PAD,
    SP_UNK,
    SentencePieceTokenizer,
    albert_preprocess,
)
from data.tokenizers.deberta import (
    DEBERTA_SPECIAL_TOKENS,
    DEBERTA_SPM_FILE,
    DebertaBPETokenizer,
    DebertaSentencePieceTokenizer,
)
from data.tokenizers.xlnet import XLNET_EOD, XLNetTokenizer, is_xlnet_start_piece
from data.tokenizers.tokenizer_json import (
    HF_SPECIAL_KEYS,
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_JSON_FILE,
    TokenizerJsonTokenizer,
    declared_special_tokens,
)

# isort: on
from data.tokenizers.loader import ALL_KINDS, load_bpe_files, load_tokenizer
from data.tokenizers.threads import limit as limit_threads
from data.tokenizers.training import (
    KINDS,
    SP_USER_SYMBOLS,
    TRAINABLE_KINDS,
    train_bpe,
    train_sentencepiece,
    train_wordpiece,
    train_xlnet_sentencepiece,
)

__all__ = [
    "ALL_KINDS",
    "BPE_MERGES_FILE",
    "BPE_SPECIAL_TOKENS",
    "BPE_VOCAB_FILE",
    "CLS",
    "CONFIG_FILE",
    "DEBERTA_SPECIAL_TOKENS",
    "DEBERTA_SPM_FILE",
    "HF_SPECIAL_KEYS",
    "KINDS",
    "MASK",
    "PAD",
    "SEP",
    "SPECIAL_TOKENS",
    "SPECIAL_TOKENS_MAP_FILE",
    "SP_CONTROL_SYMBOLS",
    "SP_MODEL_FILE",
    "SP_PAD",
    "SP_UNK",
    "SP_USER_SYMBOLS",
    "TOKENIZER_JSON_FILE",
    "TRAINABLE_KINDS",
    "UNK",
    "VOCAB_FILE",
    "XLNET_EOD",
    "ByteLevelBPETokenizer",
    "DebertaBPETokenizer",
    "DebertaSentencePieceTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "TokenizerError",
    "TokenizerJsonTokenizer",
    "VocabTable",
    "WordPieceTokenizer",
    "XLNetTokenizer",
    "albert_preprocess",
    "backend_of",
    "declared_special_tokens",
    "is_xlnet_start_piece",
    "limit_threads",
    "load_bpe_files",
    "load_tokenizer",
    "pair_inputs",
    "register_backend",
    "register_kind",
    "registered_backends",
    "registered_kinds",
    "train_bpe",
    "train_sentencepiece",
    "train_wordpiece",
    "train_xlnet_sentencepiece",
    "truncate_seq_pair",
]
