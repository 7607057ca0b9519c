"""GPT-2's byte-level BPE as RoBERTa uses it (kind "bpe"), on the `tokenizers` library.

Files: vocab.json (token -> id) and merges.txt (the merges in rank order), GPT-2's published
format, and tokenizer_config.json {"kind": "bpe"}. RoBERTa's published vocab.json + merges.txt
load directly. DeBERTa v1's tokenizer (data/tokenizers/deberta.py) is this one with BERT's
special tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import numpy as np
import tensorflow as tf
import tokenizers as hf_tokenizers
from tokenizers import decoders, models, pre_tokenizers

from data.tokenizers import base
from data.tokenizers.base import CONFIG_FILE, TokenizerError

BPE_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
BPE_VOCAB_FILE = "vocab.json"
BPE_MERGES_FILE = "merges.txt"
_GPT2_WORD_START = "\u0120"  # "Ġ": the byte-level alphabet's stand-in for a leading space


class ByteLevelBPETokenizer(base.PipelineTable):
    """GPT-2 / RoBERTa byte-level BPE. Implements `Tokenizer` with `pair_format` "roberta".

    Text is split with GPT-2's regex (a word keeps its leading space, which the byte-level
    alphabet writes "Ġ"), mapped byte by byte onto 256 printable characters, and merged by
    rank as in `merges.txt`. Every byte is in the vocab, so no text is `<unk>`.
    `encode_documents` (pretraining data) encodes a document's sentences after the first with
    their joining space ("end. The" -> ... "." "ĠThe"), as fairseq encodes a whole line
    (examples/roberta/multiprocessing_bpe_encoder.py); `encode` adds no space, as fairseq and
    HF encode a GLUE text. Special tokens written in the text (e.g. "<mask>") are *not*
    recognised, as in fairseq's preprocessing (HF's RobertaTokenizer matches "<mask>" with
    lstrip; nothing here feeds it such text).
    Specials: cls=`<s>`, sep=`</s>`, pad=`<pad>`, unk=`<unk>`, mask=`<mask>`.
    """

    pair_format = "roberta"
    _SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>", "<mask>")
    # What a subclass with other special tokens (DebertaBPETokenizer) changes: the tokens the
    # vocab must hold (in the error message's order), whom they are named after, the kind, and
    # the transformers class that reads the same files.
    _REQUIRED_TOKENS: tuple[str, ...] = BPE_SPECIAL_TOKENS
    _FAMILY = "RoBERTa"
    _MISSING_HINT = " (GPT-2's own vocab.json lacks them; use RoBERTa's)"
    _KIND = "bpe"
    _HF_CLASS = "RobertaTokenizer"
    _PIPELINE_MODEL = "BPE"
    _HF_BOS_EOS = True  # <s> / </s>

    def __init__(
        self, vocab: dict[str, int], merges: Sequence[tuple[str, str]], *, source: str = "the vocab"
    ):
        """Args:
          vocab: token -> id; ids must be exactly 0..len-1. Must hold the 5 special tokens.
          merges: BPE merges in rank order (first merge applied first).
          source: names the vocab in error messages.

        Raises:
          TokenizerError: ids not 0..n-1, a special token missing, or a merge of unknown tokens.
        """
        if sorted(vocab.values()) != list(range(len(vocab))):
            raise TokenizerError(f"{source}: token ids must be exactly 0..{len(vocab) - 1}, each once")
        for token in self._REQUIRED_TOKENS:
            if token not in vocab:
                raise TokenizerError(
                    f"{source}: the vocab has no {token} token: {self._FAMILY} needs "
                    f"{', '.join(self._REQUIRED_TOKENS)}{self._MISSING_HINT}"
                )
        self._vocab = dict(vocab)
        self._tokens = tuple(sorted(vocab, key=vocab.__getitem__))
        self._merges = tuple((a, b) for a, b in merges)
        try:
            model = models.BPE(self._vocab, list(self._merges), fuse_unk=False)
        except Exception as e:  # the library reports a merge of tokens missing from the vocab
            raise TokenizerError(f"{source}: the merges do not fit the vocab ({e})") from None
        self._tokenizer = hf_tokenizers.Tokenizer(model)
        # use_regex: GPT-2's split pattern; no prefix space, as fairseq/RoBERTa encode text.
        self._tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        self._tokenizer.decoder = decoders.ByteLevel()

    @classmethod
    def from_files(cls, vocab_path: str, merges_path: str) -> ByteLevelBPETokenizer:
        """Loads a published GPT-2/RoBERTa `vocab.json` (token -> id) and `merges.txt`
        ("#version" header line, then one "A B" merge per line, in rank order).

        Raises:
          TokenizerError: a file missing, vocab.json not a JSON object of ints, a bad merges line.
        """
        return cls(*read_bpe_files(vocab_path, merges_path), source=vocab_path)

    @classmethod
    def from_directory(cls, directory: str, config: Mapping[str, Any]) -> ByteLevelBPETokenizer:
        """The tokenizer `save` wrote to `directory` (its tokenizer_config.json, `config`, holds
        nothing but the kind)."""
        return cls.from_files(
            os.path.join(directory, BPE_VOCAB_FILE), os.path.join(directory, BPE_MERGES_FILE)
        )

    def decode(self, ids: Sequence[int]) -> str:
        """The exact bytes the ids stand for (lossless), padding skipped."""
        pad = self.pad_id
        return self._tokenizer.decode([int(i) for i in ids if i != pad], skip_special_tokens=False)

    @staticmethod
    def sentence_texts(sentences: Sequence[str]) -> list[str]:
        """Sentences after the first get the space that joins them to the one before: the
        byte-level pre-tokenizer keeps a word's leading space ("ĠThe"), and GPT-2's regex never
        matches across it, so the concatenated ids are those of the joined text."""
        return [" " + s if i and s else s for i, s in enumerate(sentences)]

    @classmethod
    def word_starts(cls, tokens: Sequence[str], specials: Collection[str]) -> np.ndarray:
        """bool [len(tokens)]: True for a token starting with "Ġ" (a leading space) and for the 5
        special tokens, as fairseq's `get_whole_word_mask` (specials, then `is_beginning_of_word`).
        So the first word of a document (or of a text given to `encode`), which has no leading
        space, continues the token before it (after <s>: a new word, data/masking.py)."""
        return np.array([t.startswith(_GPT2_WORD_START) or t in specials for t in tokens], dtype=bool)

    def hf_settings(self) -> dict:
        """transformers' RobertaTokenizer (DebertaTokenizer) without a prefix space: text is
        encoded as it stands, as here."""
        return {"tokenizer_class": self._HF_CLASS, "add_prefix_space": False}

    def _files_text(self) -> tuple[str, str]:
        vocab = json.dumps({t: i for i, t in enumerate(self._tokens)}, ensure_ascii=False)
        merges = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in self._merges)
        return vocab, merges

    def identity(self) -> dict:
        """{"kind": "bpe" ("deberta_bpe"), "vocab_size", "pair_format": "roberta" ("bert"),
        "vocab_sha256"}; the hash is of vocab.json and merges.txt exactly as `save` writes them."""
        vocab, merges = self._files_text()
        return {
            "kind": self._KIND,
            "vocab_size": self.vocab_size,
            "pair_format": self.pair_format,
            "vocab_sha256": hashlib.sha256((vocab + "\0" + merges).encode("utf-8")).hexdigest(),
        }

    def save(self, directory: str) -> None:
        vocab, merges = self._files_text()
        tf.io.gfile.makedirs(directory)
        for name, text in ((BPE_VOCAB_FILE, vocab), (BPE_MERGES_FILE, merges)):
            with tf.io.gfile.GFile(os.path.join(directory, name), "w") as f:
                f.write(text)
        with tf.io.gfile.GFile(os.path.join(directory, CONFIG_FILE), "w") as f:
            f.write(json.dumps({"kind": self._KIND}, indent=2) + "\n")


def read_bpe_files(vocab_path: str, merges_path: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The token -> id map of a GPT-2-format vocab.json and the merges of its merges.txt
    (`ByteLevelBPETokenizer.from_files`, `load_bpe_files`)."""
    if not tf.io.gfile.exists(vocab_path):
        raise TokenizerError(f"vocab file '{vocab_path}' not found: a BPE tokenizer needs vocab.json")
    if not tf.io.gfile.exists(merges_path):
        raise TokenizerError(
            f"'{merges_path}' not found: a byte-level BPE vocab.json needs its merges.txt beside it"
        )
    with tf.io.gfile.GFile(vocab_path, "rb") as f:
        try:
            vocab = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TokenizerError(
                f"{vocab_path}: not valid JSON ({e}): a BPE vocab.json maps each token to its id"
            ) from None
    if not isinstance(vocab, dict) or not all(type(i) is int for i in vocab.values()):
        raise TokenizerError(f"{vocab_path}: not a JSON object of token -> integer id")
    with tf.io.gfile.GFile(merges_path, "rb") as f:
        try:
            lines = f.read().decode("utf-8").split("\n")
        except UnicodeDecodeError as e:
            raise TokenizerError(f"{merges_path}: not valid UTF-8 (byte offset {e.start})") from None
    merges = []
    for number, line in enumerate(lines, 1):
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise TokenizerError(f"{merges_path}:{number}: expected two tokens 'A B', got {line!r}")
        merges.append((parts[0], parts[1]))
    return vocab, merges


base.register_backend(ByteLevelBPETokenizer)
