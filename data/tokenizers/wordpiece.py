"""BERT's WordPiece tokenizer (kind "wordpiece"), on the `tokenizers` library.

`WordPieceTokenizer` reproduces google-research/bert `tokenization.FullTokenizer`
(BasicTokenizer + WordpieceTokenizer): clean control characters, space out CJK
characters, lowercase and strip accents when uncased, split on whitespace and
punctuation, then greedy longest-match-first wordpieces with "##" continuations, and
"[UNK]" for a word with no segmentation or longer than 200 characters. Special tokens
written in the text (e.g. "[MASK]") are *not* recognised, exactly as in the original.

Files: vocab.txt (one token per line; line i, from 0, is id i) and tokenizer_config.json
{"kind": "wordpiece", "lowercase", "strip_accents"}. A published BERT vocab.txt loads directly
(casing inferred).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import numpy as np
import tensorflow as tf
import tokenizers as hf_tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from data.tokenizers import base
from data.tokenizers.base import CONFIG_FILE, SPECIAL_TOKENS, UNK, TokenizerError

VOCAB_FILE = "vocab.txt"
# Bracketed tokens ("[PAD]", "[unused0]") are not text; casing inference ignores them.
_RESERVED_TOKEN = re.compile(r"\[[^\]]*\]")


# google-research/bert tokenization.py: a longer word is one [UNK].
_BERT_MAX_INPUT_CHARS_PER_WORD = 200


class WordPieceTokenizer(base.PipelineTable):
    """BERT's WordPiece tokenizer (see the module docstring). Implements `Tokenizer` with
    `pair_format` "bert"."""

    pair_format = "bert"
    _SPECIAL_TOKENS = SPECIAL_TOKENS  # [PAD] [UNK] [CLS] [SEP] [MASK]
    _KIND = "wordpiece"
    _HF_CLASS = "BertTokenizer"
    _PIPELINE_MODEL = "WordPiece"

    def __init__(
        self,
        tokens: Sequence[str],
        *,
        lowercase: bool,
        strip_accents: bool | None = None,
        source: str = "the vocabulary",
    ):
        """Args:
          tokens: the vocabulary; tokens[i] has id i. Must hold the 5 special tokens.
          lowercase: lowercase text before wordpiece (uncased models).
          strip_accents: remove accents (NFD, drop combining marks); defaults to `lowercase`,
            as in the original BERT.
          source: names the vocab in error messages (e.g. its file path).

        Raises:
          TokenizerError: a special token is missing or a token appears twice.
        """
        vocab: dict[str, int] = {}
        for i, token in enumerate(tokens):
            if token in vocab:
                raise TokenizerError(
                    f"{source}: token {token!r} appears twice (ids {vocab[token]} and "
                    f"{i}): a vocab must list each token once"
                )
            vocab[token] = i
        for token in SPECIAL_TOKENS:
            if token not in vocab:
                raise TokenizerError(
                    f"{source}: the vocab has no {token} token: BERT needs {', '.join(SPECIAL_TOKENS)}"
                )
        self._tokens = tuple(tokens)
        self._vocab = vocab
        self._lowercase = bool(lowercase)
        self._strip_accents = self._lowercase if strip_accents is None else bool(strip_accents)
        self._tokenizer = bert_pipeline(vocab, self._lowercase, self._strip_accents)

    @classmethod
    def from_vocab_file(
        cls, path: str, lowercase: bool | None = None, strip_accents: bool | None = None
    ) -> WordPieceTokenizer:
        """Loads a vocab.txt (one token per line, line i = id i), e.g. a published BERT vocab.

        Args:
          path: the vocab file (local or any tf.io.gfile filesystem).
          lowercase: None infers it: uncased when no token other than bracketed reserved ones
            ("[PAD]", "[unused0]") has an uppercase letter.
          strip_accents: None means the same as `lowercase`.

        Raises:
          TokenizerError: the file is missing, empty, not UTF-8, or lacks a special token.
        """
        if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
            raise TokenizerError(f"vocab file '{path}' not found: pass a vocab.txt (one token per line)")
        with tf.io.gfile.GFile(path, "rb") as f:
            content = f.read()
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TokenizerError(
                f"{path}: not valid UTF-8 (byte offset {e.start}): a vocab file is "
                "UTF-8 text, one token per line"
            ) from None
        # Like the original `load_vocab`: one token per "\n"-terminated line, whitespace stripped.
        tokens = [line.strip() for line in text.split("\n")]
        if tokens and not tokens[-1]:
            tokens.pop()
        if not tokens:
            raise TokenizerError(f"vocab file '{path}' is empty: it needs one token per line")
        if lowercase is None:
            lowercase = not any(
                c.isupper() for token in tokens if not _RESERVED_TOKEN.fullmatch(token) for c in token
            )
        return cls(tokens, lowercase=lowercase, strip_accents=strip_accents, source=path)

    @classmethod
    def from_directory(cls, directory: str, config: Mapping[str, Any]) -> WordPieceTokenizer:
        """The tokenizer `save` wrote to `directory`, whose tokenizer_config.json is `config`
        (casing as recorded; inferred from the vocab where it is absent)."""
        return cls.from_vocab_file(
            os.path.join(directory, VOCAB_FILE),
            lowercase=config.get("lowercase"),
            strip_accents=config.get("strip_accents"),
        )

    def decode(self, ids: Sequence[int]) -> str:
        """Joins pieces ("un", "##aff", "##able" -> "unaffable") and words with spaces, skips
        [PAD], and removes the space before punctuation ("hello , world" -> "hello, world")."""
        pad = self.pad_id
        return self._tokenizer.decode([int(i) for i in ids if i != pad], skip_special_tokens=False)

    @classmethod
    def word_starts(cls, tokens: Sequence[str], specials: Collection[str]) -> np.ndarray:
        """bool [len(tokens)]: True for every token not starting with "##" (BERT's whole-word
        masking rule in create_pretraining_data.py), so specials and punctuation start words."""
        return np.array([not t.startswith("##") for t in tokens], dtype=bool)

    def hf_settings(self) -> dict:
        """transformers' BertTokenizer with this tokenizer's casing; BERT's BasicTokenizer
        always spaces out CJK characters, as `bert_pipeline` does."""
        return {
            "tokenizer_class": self._HF_CLASS,
            "do_lower_case": self._lowercase,
            "strip_accents": self._strip_accents,
            "tokenize_chinese_chars": True,
        }

    def _vocab_text(self) -> str:
        return "".join(token + "\n" for token in self._tokens)

    def identity(self) -> dict:
        """{"kind", "vocab_size", "lowercase", "strip_accents", "vocab_sha256"}; the hash is of
        vocab.txt exactly as `save` writes it, so a saved and reloaded tokenizer is the same."""
        return {
            "kind": self._KIND,
            "vocab_size": self.vocab_size,
            "lowercase": self._lowercase,
            "strip_accents": self._strip_accents,
            "vocab_sha256": hashlib.sha256(self._vocab_text().encode("utf-8")).hexdigest(),
        }

    def save(self, directory: str) -> None:
        tf.io.gfile.makedirs(directory)
        with tf.io.gfile.GFile(os.path.join(directory, VOCAB_FILE), "w") as f:
            f.write(self._vocab_text())
        config = {"kind": self._KIND, "lowercase": self._lowercase, "strip_accents": self._strip_accents}
        with tf.io.gfile.GFile(os.path.join(directory, CONFIG_FILE), "w") as f:
            f.write(json.dumps(config, indent=2) + "\n")


def bert_pipeline(vocab: dict[str, int], lowercase: bool, strip_accents: bool) -> hf_tokenizers.Tokenizer:
    """A `tokenizers.Tokenizer` doing what BERT's FullTokenizer does (module docstring); with an
    empty vocab, the pipeline `train_wordpiece` trains."""
    # 200: google-research/bert tokenization.py `WordpieceTokenizer(max_input_chars_per_word=200)`
    # (the tokenizers library's default is 100, which makes 101..200-character words [UNK]).
    model = models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=_BERT_MAX_INPUT_CHARS_PER_WORD)
    tokenizer = hf_tokenizers.Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


base.register_backend(WordPieceTokenizer)
