"""DeBERTa's two tokenizers: v1's byte-level BPE with BERT-style special tokens (kind
"deberta_bpe") and v2/v3's SentencePiece (kind "deberta_spm").

Files: v1 as RoBERTa's (vocab.json + merges.txt; a published DeBERTa vocab is told from
RoBERTa's by its [CLS] token, data/tokenizers/loader.py), v2/v3 spm.model (HF's DeBERTa-v2 file
name), each with tokenizer_config.json {"kind"}. Both tokenizers' published models have more
embedding rows than tokens (`fits_vocab`), and transformers' DeBERTa classes have options these
tokenizers fix to the published value (`HF_FIXED_SETTINGS`).
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import numpy as np
import tensorflow as tf
from tokenizers import decoders

from data.tokenizers import base
from data.tokenizers.base import CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK, TokenizerError
from data.tokenizers.bpe import ByteLevelBPETokenizer
from data.tokenizers.sentencepiece import SPIECE_UNDERLINE, SentencePieceFile

DEBERTA_SPM_FILE = "spm.model"  # HF's DebertaV2Tokenizer file name, as microsoft/DeBERTa's
# microsoft/DeBERTa's `special_tokens` (spm_tokenizer.py, gpt2_tokenizer.py): [PAD] [CLS] [SEP]
# [UNK] have ids 0..3 in both published vocabs; [MASK] comes after every other token.
DEBERTA_SPECIAL_TOKENS = (PAD, CLS, SEP, UNK, MASK)


def _is_bert_boundary_char(char: str) -> bool:
    """`_is_whitespace(c) or _is_control(c) or _is_punctuation(c)` of microsoft/DeBERTa's
    DeBERTa/deberta/spm_tokenizer.py and gpt2_bpe_utils.py (BERT's character classes): a
    space, a Unicode "C*" control or format character, ASCII punctuation or symbols, "P*"."""
    cp, category = ord(char), unicodedata.category(char)
    return (
        char in " \t\n\r"
        or category == "Zs"
        or category.startswith(("C", "P"))
        or 33 <= cp <= 47
        or 58 <= cp <= 64
        or 91 <= cp <= 96
        or 123 <= cp <= 126
    )


def _is_deberta_word_start(text: str, space: str) -> bool:
    """The negation of microsoft/DeBERTa's `part_of_whole_word(token)` for a non-special token
    whose text is `text` (an spm piece, or a BPE token's decoded bytes) and whose leading space
    is written `space` ("▁" or " "): a word starts at a token with a leading space, and a lone
    whitespace, control or punctuation character is a word of its own (so "▁don" "'" "t" is
    two words and "t" continues the second, and "1,000" -> "▁1" "," "000" is two)."""
    return (len(text) == 1 and _is_bert_boundary_char(text)) or text.startswith(space)


class DebertaBPETokenizer(ByteLevelBPETokenizer):
    """DeBERTa v1's tokenizer: GPT-2's byte-level BPE (as `ByteLevelBPETokenizer`, which see)
    with BERT-style special tokens. Implements `Tokenizer` with `pair_format` "bert".

    microsoft/DeBERTa DeBERTa/deberta/gpt2_tokenizer.py puts [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3
    before fairseq's GPT-2 dictionary and [MASK] after it (50264); HF's DebertaTokenizer reads
    the same ids from vocab.json + merges.txt, which hold the five special tokens as ordinary
    entries. A pair is `[CLS] A [SEP] B [SEP]`, segment ids 0/1, as the original's tasks build
    it (HF 5.18's DebertaTokenizer writes `[CLS] A [SEP] [SEP] B [SEP]`, all type 0: not
    followed). Text never becomes [UNK] (every byte is in the vocab), and special tokens written
    in the text are not recognised (HF matches them; "[MASK]" with the space before it).
    """

    pair_format = "bert"
    _SPECIAL_TOKENS = SPECIAL_TOKENS  # the protocol's order: pad, unk, cls, sep, mask
    _REQUIRED_TOKENS = DEBERTA_SPECIAL_TOKENS
    _FAMILY = "DeBERTa"
    _MISSING_HINT = " (published: [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3 [MASK]=50264)"
    _KIND = "deberta_bpe"
    _HF_CLASS = "DebertaTokenizer"
    _SPARE_EMBEDDING_ROWS = True
    # HF's DebertaTokenizer option that this tokenizer does not implement, with the value every
    # published model has (microsoft/DeBERTa and HF's defaults).
    HF_FIXED_SETTINGS = {"add_prefix_space": False}

    @classmethod
    def word_starts(cls, tokens: Sequence[str], specials: Collection[str]) -> np.ndarray:
        """bool [len(tokens)]: True for the 5 special tokens and where gpt2_tokenizer.py's
        `part_of_whole_word` is False, on the token's decoded text (`_is_deberta_word_start`):
        a leading space ("Ġthe"), or a lone punctuation, whitespace or control character (","
        starts a word where RoBERTa's rule says it continues one)."""
        decoder = decoders.ByteLevel()
        return np.array(
            [t in specials or _is_deberta_word_start(decoder.decode([t]), " ") for t in tokens], dtype=bool
        )


class DebertaSentencePieceTokenizer(SentencePieceFile):
    """DeBERTa-v2/v3's SentencePiece tokenizer (microsoft/DeBERTa DeBERTa/deberta/spm_tokenizer.py
    `SPMTokenizer` with do_lower_case=False, split_by_punct=False, as every published model).
    Implements `Tokenizer` with `pair_format` "bert".

    Text goes to the spm model as it is: the model's own normaliser (spm_train's default nmt_nfkc:
    NFKC, whitespace collapsed, a "▁" prefix) and its unigram pieces; no lowercasing, no
    punctuation split. A piece the model does not know is [UNK] (the original maps unknown
    pieces and "<unk>" to it). The published spm.model holds [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3;
    [MASK] is not in it and gets the id after the last piece (128000), as `add_special_token`
    and HF's tokenizer do, so vocab_size is the piece count + 1. A model that already has a
    [MASK] piece keeps that id, as both do, and adds nothing. Special tokens written in the text
    are recognised only where the model has them as user-defined pieces (spm's rule, as the
    original; control pieces never match text), while HF always matches them.

    `encode_documents` encodes each sentence alone, which equals the joined text's ids because
    spm splits at whitespace first (its default split_by_whitespace, which DeBERTa keeps).
    """

    pair_format = "bert"
    _SPECIAL_TOKENS = SPECIAL_TOKENS  # the protocol's order: pad, unk, cls, sep, mask
    _MODEL_FILE = DEBERTA_SPM_FILE
    _KIND = "deberta_spm"
    _HF_CLASS = "DebertaV2Tokenizer"
    _SPARE_EMBEDDING_ROWS = True
    _HF_BOS_EOS = True  # [CLS] / [SEP]
    # HF's DebertaV2Tokenizer options that this tokenizer does not implement, with the value
    # every published model has (microsoft/DeBERTa spm_tokenizer.py and HF's defaults).
    HF_FIXED_SETTINGS = {"do_lower_case": False, "split_by_punct": False}

    def __init__(self, model_proto: bytes, *, source: str = "the model"):
        """Args:
          model_proto: a serialized SentencePiece ModelProto (the bytes of DeBERTa's spm.model).
          source: names the model in error messages.

        Raises:
          TokenizerError: not a SentencePiece model, or it lacks [PAD], [CLS], [SEP] or [UNK].
        """
        processor = self._load(model_proto, source, "DeBERTa-v2/v3's spm.model")
        pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
        vocab = {piece: i for i, piece in enumerate(pieces)}
        for token in DEBERTA_SPECIAL_TOKENS[:4]:
            if token not in vocab:
                raise TokenizerError(
                    f"{source}: the model has no {token} piece: DeBERTa's spm.model holds "
                    f"{', '.join(DEBERTA_SPECIAL_TOKENS[:4])} (ids 0..3; [MASK] is added after its pieces)"
                )
        if MASK not in vocab:
            vocab[MASK] = len(pieces)
            pieces.append(MASK)
        self._sp = processor
        self._proto = bytes(model_proto)
        self._tokens = tuple(pieces)
        self._vocab = vocab
        # The id spm gives text it has no piece for, which becomes [UNK] (the same id in the
        # published model, whose unk piece is [UNK]).
        self._spm_unk = processor.unk_id()

    @classmethod
    def from_model_file(cls, path: str) -> DebertaSentencePieceTokenizer:
        """Loads a .model file, e.g. DeBERTa-v2/v3's published spm.model."""
        if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
            raise TokenizerError(f"SentencePiece model '{path}' not found: DeBERTa-v2/v3 need spm.model")
        with tf.io.gfile.GFile(path, "rb") as f:
            return cls(f.read(), source=path)

    @classmethod
    def from_directory(cls, directory: str, config: Mapping[str, Any]) -> DebertaSentencePieceTokenizer:
        """The tokenizer `save` wrote to `directory` (its tokenizer_config.json, `config`, holds
        nothing but the kind)."""
        return cls.from_model_file(os.path.join(directory, DEBERTA_SPM_FILE))

    def _unk_to_ours(self, ids: list[int]) -> list[int]:
        unk = self.unk_id
        if self._spm_unk == unk:
            return ids
        return [unk if i == self._spm_unk else i for i in ids]

    def encode(self, text: str) -> list[int]:
        return self._unk_to_ours(self._sp.encode(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self._unk_to_ours(ids) for ids in self._sp.encode(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        """The normalised text of `ids` ("▁" -> space, whitespace runs as one space), padding
        skipped; [CLS], [SEP] and [MASK] written as words of their own and [UNK] in place
        ("Caf[UNK] [MASK] [SEP]"): spm alone would drop the first two, write [UNK] " ⁇ " and has
        no [MASK]."""
        pad, unk = self.pad_id, self.unk_id
        named = {self.cls_id, self.sep_id, self.mask_id}
        parts: list[str] = []
        run: list[int] = []

        def flush() -> None:
            if run:
                # spm drops the space of the run's first "▁"; only the text's first one goes.
                space = " " if parts and self._tokens[run[0]].startswith(SPIECE_UNDERLINE) else ""
                parts.append(space + self._sp.decode(run))
                run.clear()

        for i in map(int, ids):
            token = self.id_to_token(i)  # IndexError outside the vocab
            if i == pad:
                continue
            if i in named or i == unk:
                flush()
                parts.append(f" {token} " if i in named else token)
            else:
                run.append(i)
        flush()
        return " ".join("".join(parts).split())

    @classmethod
    def word_starts(cls, tokens: Sequence[str], specials: Collection[str]) -> np.ndarray:
        """bool [len(tokens)]: True for the 5 special tokens and where spm_tokenizer.py's
        `part_of_whole_word` is False (`_is_deberta_word_start`): a piece starting with "▁", or a
        lone punctuation, whitespace or control character ("," "'" "(" start words). Every other
        piece without "▁" ("s" after "▁function") continues the word before it."""
        return np.array(
            [t in specials or _is_deberta_word_start(t, SPIECE_UNDERLINE) for t in tokens], dtype=bool
        )

    def hf_settings(self) -> dict:
        """transformers' DebertaV2Tokenizer with `HF_FIXED_SETTINGS`, what this tokenizer does."""
        return {"tokenizer_class": self._HF_CLASS, **self.HF_FIXED_SETTINGS}


base.register_backend(DebertaBPETokenizer)
base.register_backend(DebertaSentencePieceTokenizer)
