"""ALBERT's SentencePiece tokenizer (kind "sentencepiece"), and `SentencePieceFile`, what it
shares with DeBERTa-v2/v3's (data/tokenizers/deberta.py): the spm model is the tokenizer.

Files: spiece.model (the serialized spm model) and tokenizer_config.json {"kind":
"sentencepiece", "lowercase"}. ALBERT's published spiece.model / 30k-clean.model load directly
(uncased, as every published ALBERT).
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from data.tokenizers import base, threads
from data.tokenizers.base import CONFIG_FILE, TokenizerError

SP_MODEL_FILE = "spiece.model"
SP_PAD, SP_UNK = "<pad>", "<unk>"
SP_CONTROL_SYMBOLS = ("[CLS]", "[SEP]", "[MASK]")
SPIECE_UNDERLINE = "\u2581"  # "▁": SentencePiece's stand-in for a leading space
# google-research/albert create_pretraining_data.py `_is_start_piece_sp`: its `special_pieces`
# (ASCII punctuation without ' < = >; its "€" and "£" are added as UTF-8 bytes, which a str
# piece never equals in Python 3, so they count through the non-a-z rule below instead).
_ALBERT_SPECIAL_PIECES = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')
_ALBERT_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz") | _ALBERT_SPECIAL_PIECES


def _is_albert_start_piece(piece: str) -> bool:
    """ALBERT's `_is_start_piece_sp`, exactly: a piece starting with "▁" or "<", a lone special
    punctuation piece, or a piece with any character outside a-z (after lower()) and that
    punctuation: digits, "'", "=", accented and non-Latin letters ("For foreign characters, we
    always treat them as a whole piece"). So "▁19" "87" and "▁don" "'" "t" are 2 and 3 words."""
    return (
        piece.startswith((SPIECE_UNDERLINE, "<"))
        or piece in _ALBERT_SPECIAL_PIECES
        or not all(c.lower() in _ALBERT_WORD_CHARS for c in piece)
    )


def albert_preprocess(text: str, lowercase: bool) -> str:
    """ALBERT's `tokenization.preprocess_text`: collapse whitespace, strip accents (NFKD, drop
    combining marks; always, as the original), lowercase when uncased. Also `` and '' -> ", which
    google-research/albert's version lacks but XLNet's and HF's `AlbertTokenizer` (the way the
    published models are mostly used) do; it only changes text that has those quote pairs."""
    text = " ".join(text.strip().split())
    text = text.replace("``", '"').replace("''", '"')
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    return text.lower() if lowercase else text


class SentencePieceFile(base.VocabTable):
    """What ALBERT's and DeBERTa's SentencePiece tokenizers share: the model proto is the
    tokenizer (`_MODEL_FILE` in the folder, `_KIND` in the identity, `_settings()` the rest)."""

    _MODEL_FILE: str
    _proto: bytes
    _PIPELINE_MODEL = "Unigram"  # transformers' pipeline for an spm unigram model

    @staticmethod
    def _load(model_proto: bytes, source: str, example: str) -> spm.SentencePieceProcessor:
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model_proto)
        except Exception:  # the library raises RuntimeError/OSError with a parser message
            raise TokenizerError(
                f"{source}: not a SentencePiece model: pass a .model file written by spm_train "
                f"(e.g. {example})"
            ) from None
        return processor

    def _settings(self) -> dict:
        """The tokenizer's options besides the model, as identity() and save() write them."""
        return {}

    def identity(self) -> dict:
        """{"kind", "vocab_size", (settings), "pair_format": "bert", "model_sha256"}."""
        return {
            "kind": self._KIND,
            "vocab_size": self.vocab_size,
            **self._settings(),
            "pair_format": self.pair_format,
            "model_sha256": hashlib.sha256(self._proto).hexdigest(),
        }

    def save(self, directory: str) -> None:
        tf.io.gfile.makedirs(directory)
        with tf.io.gfile.GFile(os.path.join(directory, self._MODEL_FILE), "wb") as f:
            f.write(self._proto)
        with tf.io.gfile.GFile(os.path.join(directory, CONFIG_FILE), "w") as f:
            f.write(json.dumps({"kind": self._KIND, **self._settings()}, indent=2) + "\n")


class SentencePieceTokenizer(SentencePieceFile):
    """ALBERT's SentencePiece tokenizer (google-research/albert `tokenization.FullTokenizer`
    with an spm model). Implements `Tokenizer` with `pair_format` "bert".

    Text goes through `albert_preprocess`, then the model's pieces, then ALBERT's
    `encode_pieces` fix-up: a piece ending in digit + "," is re-split so the comma stands alone
    ("▁1990," -> "▁1990", ","). Specials: cls=[CLS], sep=[SEP], mask=[MASK], pad=<pad>,
    unk=<unk> (control symbols: never produced from text).
    """

    pair_format = "bert"
    _SPECIAL_TOKENS = (SP_PAD, SP_UNK, "[CLS]", "[SEP]", "[MASK]")
    _MODEL_FILE = SP_MODEL_FILE
    _KIND = "sentencepiece"
    _HF_CLASS = "AlbertTokenizer"
    # The pieces the model must have, the family in messages, and the published casing.
    _REQUIRED_PIECES: tuple[str, ...] = (SP_PAD, SP_UNK, *SP_CONTROL_SYMBOLS)
    _FAMILY = "ALBERT"
    _DEFAULT_LOWERCASE = True

    def __init__(self, model_proto: bytes, *, lowercase: bool | None = None, source: str = "the model"):
        """Args:
          model_proto: a serialized SentencePiece ModelProto (the bytes of a .model file).
          lowercase: the original's do_lower_case; None: the published models' (ALBERT's
            uncased, `_DEFAULT_LOWERCASE`).
          source: names the model in error messages.

        Raises:
          TokenizerError: not a SentencePiece model, or a special token missing.
        """
        processor = self._load(model_proto, source, f"{self._FAMILY}'s spiece.model")
        self._sp = processor
        self._proto = bytes(model_proto)
        self._lowercase = self._DEFAULT_LOWERCASE if lowercase is None else bool(lowercase)
        self._tokens = tuple(processor.id_to_piece(i) for i in range(processor.get_piece_size()))
        self._vocab = {t: i for i, t in enumerate(self._tokens)}
        for token in self._REQUIRED_PIECES:
            if token not in self._vocab:
                raise TokenizerError(
                    f"{source}: the model has no {token} piece: {self._FAMILY} needs "
                    f"{', '.join(self._REQUIRED_PIECES)}"
                )

    @classmethod
    def from_model_file(cls, path: str, lowercase: bool | None = None) -> SentencePieceTokenizer:
        """Loads a .model file, e.g. ALBERT's published spiece.model / 30k-clean.model."""
        if not tf.io.gfile.exists(path):
            raise TokenizerError(f"SentencePiece model '{path}' not found")
        with tf.io.gfile.GFile(path, "rb") as f:
            return cls(f.read(), lowercase=lowercase, source=path)

    @classmethod
    def from_directory(cls, directory: str, config: Mapping[str, Any]) -> SentencePieceTokenizer:
        """The tokenizer `save` wrote to `directory`, whose tokenizer_config.json is `config`
        (the published casing where it does not say)."""
        return cls.from_model_file(os.path.join(directory, SP_MODEL_FILE), lowercase=config.get("lowercase"))

    def pieces(self, text: str) -> list[str]:
        """ALBERT's `encode_pieces(sp_model, preprocess_text(text))`."""
        return self._split_digit_commas(
            self._sp.encode(albert_preprocess(text, self._lowercase), out_type=str)
        )

    def _split_digit_commas(self, pieces: Sequence[str]) -> list[str]:
        """ALBERT's `encode_pieces` after the model: a piece ending in a digit and a comma
        ("▁1990,") is encoded again without the comma, and the comma follows."""
        out: list[str] = []
        for piece in pieces:
            if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
                split = self._sp.encode(piece[:-1].replace(SPIECE_UNDERLINE, ""), out_type=str)
                if piece[0] != SPIECE_UNDERLINE and split and split[0][0] == SPIECE_UNDERLINE:
                    split = split[1:] if len(split[0]) == 1 else [split[0][1:], *split[1:]]
                out.extend([*split, piece[-1]])
            else:
                out.append(piece)
        return out

    def encode(self, text: str) -> list[int]:
        unk = self.unk_id
        return [self._vocab.get(p, unk) for p in self.pieces(text)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """The texts' ids, from one SentencePiece call over the batch (on
        `threads.sentencepiece_threads()` threads)."""
        normalised = [albert_preprocess(t, self._lowercase) for t in texts]
        encoded = self._sp.encode(normalised, out_type=str, num_threads=threads.sentencepiece_threads())
        unk = self.unk_id
        return [[self._vocab.get(p, unk) for p in self._split_digit_commas(pieces)] for pieces in encoded]

    def decode(self, ids: Sequence[int]) -> str:
        """The normalised text of `ids` ("▁" -> space), padding skipped."""
        pad = self.pad_id
        return self._sp.decode([int(i) for i in ids if i != pad])

    @classmethod
    def word_starts(cls, tokens: Sequence[str], specials: Collection[str]) -> np.ndarray:
        """bool [len(tokens)]: ALBERT's `_is_start_piece_sp` (`_is_albert_start_piece`) for every
        piece, and True for the special tokens ([CLS], [SEP], [MASK]: ALBERT's masking treats
        [CLS]/[SEP] as boundaries before asking the rule, which would say "[CLS]" continues a
        word; <pad> and <unk> start with "<")."""
        return np.array([_is_albert_start_piece(t) or t in specials for t in tokens], dtype=bool)

    def hf_settings(self) -> dict:
        """transformers' AlbertTokenizer with this tokenizer's casing."""
        return {"tokenizer_class": self._HF_CLASS, "do_lower_case": self._lowercase}

    def _settings(self) -> dict:
        return {"lowercase": self._lowercase}


base.register_backend(SentencePieceTokenizer)
