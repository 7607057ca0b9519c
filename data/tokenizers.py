"""One `Tokenizer` protocol and five backends: BERT's WordPiece and RoBERTa's byte-level BPE
(both on the `tokenizers` library), ALBERT's SentencePiece unigram (`sentencepiece`), and
DeBERTa's two: v1's byte-level BPE with BERT-style special tokens, and v2/v3's SentencePiece.

Every backend gives the protocol's special ids, a `pair_format` ("bert": `[CLS] A [SEP] B
[SEP]`; "roberta": `<s> A </s></s> B </s>`) and `word_start_mask()` for whole-word and n-gram
masking. `identity()["kind"]` is "wordpiece", "bpe", "sentencepiece", "deberta_bpe" or
"deberta_spm".

WordPiece
---------

`WordPieceTokenizer` reproduces google-research/bert `tokenization.FullTokenizer`
(BasicTokenizer + WordpieceTokenizer): clean control characters, space out CJK
characters, lowercase and strip accents when uncased, split on whitespace and
punctuation, then greedy longest-match-first wordpieces with "##" continuations, and
"[UNK]" for a word with no segmentation or longer than 200 characters. Special tokens
written in the text (e.g. "[MASK]") are *not* recognised, exactly as in the original.

Byte-level BPE (`ByteLevelBPETokenizer`): GPT-2's byte-level BPE as RoBERTa uses it; see
the class. SentencePiece (`SentencePieceTokenizer`): ALBERT's normalisation (`albert_preprocess`)
and piece fix-ups over an spm model; see the class. DeBERTa (`DebertaBPETokenizer`,
`DebertaSentencePieceTokenizer`): see the classes.

A tokenizer lives in a directory (`save` / `load_tokenizer`, which detects the kind):

    tokenizer_config.json  {"kind": "wordpiece" | "bpe" | "sentencepiece" | ..., ...}
    vocab.txt              wordpiece: one token per line; line i (from 0) is id i
    vocab.json merges.txt  bpe, deberta_bpe: token -> id, and the merges in rank order (GPT-2's
                           format)
    spiece.model           sentencepiece: the serialized spm model
    spm.model              deberta_spm: the serialized spm model (HF's DeBERTa-v2 file name)

Published vocabs load directly: BERT's vocab.txt (casing inferred), RoBERTa's directory with
vocab.json + merges.txt, ALBERT's spiece.model / 30k-clean.model, DeBERTa's vocab.json +
merges.txt (told from RoBERTa's by its [CLS] token) and DeBERTa-v2/v3's spm.model. Train a new
vocab (WordPiece, BPE or ALBERT SentencePiece) with

    python -m data.tokenizers train --corpus=SPEC --output=DIR [--kind=wordpiece|bpe|sentencepiece]
        [--vocab_size=N (default 30522 / 50265 / 30000)] [--cased]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import sys
import typing
import unicodedata
from typing import Iterable, Iterator, Sequence

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import numpy as np
import sentencepiece as spm
import tensorflow as tf
import tokenizers as hf_tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from core import cli
from core.errors import UserError
from data import corpora, pair_layout

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# In this order they get ids 0..4 in a trained vocab. (Published vocabs differ:
# [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103; ids are always looked up.)
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
VOCAB_FILE = "vocab.txt"
CONFIG_FILE = "tokenizer_config.json"
# Bracketed tokens ("[PAD]", "[unused0]") are not text; casing inference ignores them.
_RESERVED_TOKEN = re.compile(r"\[[^\]]*\]")


# google-research/bert tokenization.py: a longer word is one [UNK].
_BERT_MAX_INPUT_CHARS_PER_WORD = 200


class TokenizerError(UserError):
    """A user-facing problem with a tokenizer or vocab file (one line)."""


class Tokenizer(typing.Protocol):
    """What the data pipeline needs from a tokenizer. Ids are ints in [0, vocab_size)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def unk_id(self) -> int: ...

    @property
    def cls_id(self) -> int: ...

    @property
    def sep_id(self) -> int: ...

    @property
    def mask_id(self) -> int: ...

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids never chosen for masking: pad, cls, sep, mask (not unk, which is real text)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`[encode(t) for t in texts]`, faster (the library's parallel batch path)."""

    def encode_documents(self, documents: Sequence[Sequence[str]]) -> list[list[list[int]]]:
        """Token ids of every sentence of every document ([document][sentence] -> ids), as the
        sentences stand in the document's running text: concatenated, a document's sentence
        ids equal `encode(" ".join(sentences))` (for stripped, non-empty sentences).
        Pretraining data is encoded this way (data/preprocess.py)."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`: subword pieces joined, padding skipped."""

    def id_to_token(self, i: int) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...

    @property
    def pair_format(self) -> str:
        """ "bert": `[CLS] A [SEP] B [SEP]`; "roberta": `<s> A </s></s> B </s>`."""

    def word_start_mask(self) -> np.ndarray:
        """bool [vocab_size]: True where token id i begins a new word (special tokens included).
        A word is a start token and the non-start tokens that follow it; each backend's rule
        is in its docstring."""

    def identity(self) -> dict:
        """JSON-able description that changes whenever the ids of any text would change."""

    def save(self, directory: str) -> None:
        """Writes the files `load_tokenizer(directory)` reads back."""


def truncate_seq_pair(a: list[int], b: list[int], max_tokens: int) -> bool:
    """google-research/bert's `_truncate_seq_pair`, in place: drop the last token of the
    longer side (B on ties) until len(a) + len(b) <= max_tokens. Returns whether it cut."""
    cut = len(a) + len(b) > max_tokens
    while len(a) + len(b) > max_tokens:
        (a if len(a) > len(b) else b).pop()
    return cut


def pair_inputs(
    tokenizer: Tokenizer, a: Sequence[int], b: Sequence[int] | None, max_seq_length: int
) -> tuple[list[int], list[int], bool]:
    """One model input row (unpadded) for a text's ids, or a pair's, as fine-tuning and
    feature extraction feed it, in the tokenizer's `pair_format` (data/pair_layout.py:
    `[CLS] A [SEP] B [SEP]` or `<s> A </s></s> B </s>`; a single text is `[CLS] A [SEP]`).

    Returns (ids, segment_ids, truncated): the pair is cut to fit max_seq_length by
    `truncate_seq_pair`.
    """
    layout = pair_layout.get(tokenizer.pair_format)
    a, b = list(a), None if b is None else list(b)
    truncated = truncate_seq_pair(a, b or [], max_seq_length - layout.num_specials(pair=b is not None))
    ids, segments = layout.ids(a, b, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id)
    return ids, segments, truncated


class _VocabTable:
    """The `Tokenizer` members every backend shares: a token list (`_tokens`, id -> token),
    its inverse (`_vocab`), the special tokens' names in `_SPECIAL_TOKENS` (pad, unk,
    cls, sep, mask), which each backend names differently, and `encode_documents` over the
    backend's `encode_batch` and `_sentence_texts`."""

    _SPECIAL_TOKENS: tuple[str, str, str, str, str]
    _tokens: list[str]
    _vocab: dict[str, int]

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def pad_id(self) -> int:
        return self._vocab[self._SPECIAL_TOKENS[0]]

    @property
    def unk_id(self) -> int:
        return self._vocab[self._SPECIAL_TOKENS[1]]

    @property
    def cls_id(self) -> int:
        return self._vocab[self._SPECIAL_TOKENS[2]]

    @property
    def sep_id(self) -> int:
        return self._vocab[self._SPECIAL_TOKENS[3]]

    @property
    def mask_id(self) -> int:
        return self._vocab[self._SPECIAL_TOKENS[4]]

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset({self.pad_id, self.cls_id, self.sep_id, self.mask_id})

    def id_to_token(self, i: int) -> str:
        if not 0 <= i < len(self._tokens):
            raise IndexError(f"token id {i} is outside the vocab [0, {len(self._tokens)})")
        return self._tokens[i]

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def encode_documents(self, documents: Sequence[Sequence[str]]) -> list[list[list[int]]]:
        """`Tokenizer.encode_documents`: one `encode_batch` over all sentences, regrouped."""
        encoded = iter(self.encode_batch([t for doc in documents for t in self._sentence_texts(doc)]))
        return [[next(encoded) for _ in doc] for doc in documents]

    @staticmethod
    def _sentence_texts(sentences: Sequence[str]) -> list[str]:
        """The text each sentence of one document is encoded from. WordPiece and SentencePiece
        split at whitespace before anything else, so a sentence alone gives the same pieces as
        in the joined text (SentencePiece's dummy prefix is the "▁" the joining space becomes)."""
        return list(sentences)


class WordPieceTokenizer(_VocabTable):
    """BERT's WordPiece tokenizer (see the module docstring). Implements `Tokenizer` with
    `pair_format` "bert"."""

    pair_format = "bert"
    _SPECIAL_TOKENS = SPECIAL_TOKENS  # [PAD] [UNK] [CLS] [SEP] [MASK]

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
        self._tokenizer = _bert_pipeline(vocab, self._lowercase, self._strip_accents)

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

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # encode_batch_fast skips computing character offsets, which nothing here needs.
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        """Joins pieces ("un", "##aff", "##able" -> "unaffable") and words with spaces, skips
        [PAD], and removes the space before punctuation ("hello , world" -> "hello, world")."""
        pad = self.pad_id
        return self._tokenizer.decode([int(i) for i in ids if i != pad], skip_special_tokens=False)

    def word_start_mask(self) -> np.ndarray:
        """bool [vocab_size]: True for every token not starting with "##" (BERT's whole-word
        masking rule in create_pretraining_data.py), so specials and punctuation start words."""
        return np.array([not t.startswith("##") for t in self._tokens], dtype=bool)

    def _vocab_text(self) -> str:
        return "".join(token + "\n" for token in self._tokens)

    def identity(self) -> dict:
        """{"kind", "vocab_size", "lowercase", "strip_accents", "vocab_sha256"}; the hash is of
        vocab.txt exactly as `save` writes it, so a saved and reloaded tokenizer is the same."""
        return {
            "kind": "wordpiece",
            "vocab_size": self.vocab_size,
            "lowercase": self._lowercase,
            "strip_accents": self._strip_accents,
            "vocab_sha256": hashlib.sha256(self._vocab_text().encode("utf-8")).hexdigest(),
        }

    def save(self, directory: str) -> None:
        tf.io.gfile.makedirs(directory)
        with tf.io.gfile.GFile(os.path.join(directory, VOCAB_FILE), "w") as f:
            f.write(self._vocab_text())
        config = {"kind": "wordpiece", "lowercase": self._lowercase, "strip_accents": self._strip_accents}
        with tf.io.gfile.GFile(os.path.join(directory, CONFIG_FILE), "w") as f:
            f.write(json.dumps(config, indent=2) + "\n")


def _bert_pipeline(vocab: dict[str, int], lowercase: bool, strip_accents: bool) -> hf_tokenizers.Tokenizer:
    """A `tokenizers.Tokenizer` doing what BERT's FullTokenizer does (module docstring)."""
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


def train_wordpiece(
    documents: Iterable[Sequence[str]],
    vocab_size: int,
    *,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
) -> WordPieceTokenizer:
    """Learns a WordPiece vocab from documents (each a sequence of sentences), streaming.

    Args:
      documents: iterable of documents; read once.
      vocab_size: the most tokens the vocab may have, specials included (fewer when the
        corpus runs out of merges).
      lowercase: uncased (lowercase, strip accents) or cased (keep both).
      min_frequency: a merge must occur at least this often.
      limit_alphabet: the most distinct characters kept (the rarest become [UNK]).

    Returns:
      A tokenizer with [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, then the alphabet, its "##"
      continuations and the learned pieces.

    Raises:
      TokenizerError: vocab_size too small, or no sentences.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise TokenizerError(
            f"vocab_size {vocab_size} is too small: it must exceed the {len(SPECIAL_TOKENS)} special tokens"
        )
    counter = _SentenceCounter(documents)
    tokenizer = _bert_pipeline({}, lowercase, lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tokenizer.train_from_iterator(counter.batches(), trainer=trainer)
    if not counter.sentences:
        raise TokenizerError("no sentences to train the vocab on: the corpus is empty")
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    # The trained pipeline registers the specials as "added tokens", matched in raw text;
    # rebuilding from the plain vocab keeps BERT's behaviour, identical to a reloaded vocab.
    return WordPieceTokenizer(tokens, lowercase=lowercase, source="the trained vocab")


# ---------------------------------------------------------------- byte-level BPE (RoBERTa)

BPE_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
BPE_VOCAB_FILE = "vocab.json"
BPE_MERGES_FILE = "merges.txt"
_GPT2_WORD_START = "\u0120"  # "Ġ": the byte-level alphabet's stand-in for a leading space


class ByteLevelBPETokenizer(_VocabTable):
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
    # vocab must hold (in the error message's order), whom they are named after, the kind.
    _REQUIRED_TOKENS: tuple[str, ...] = BPE_SPECIAL_TOKENS
    _FAMILY = "RoBERTa"
    _MISSING_HINT = " (GPT-2's own vocab.json lacks them; use RoBERTa's)"
    _KIND = "bpe"

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
        return cls(*_read_bpe_files(vocab_path, merges_path), source=vocab_path)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        """The exact bytes the ids stand for (lossless), padding skipped."""
        pad = self.pad_id
        return self._tokenizer.decode([int(i) for i in ids if i != pad], skip_special_tokens=False)

    @staticmethod
    def _sentence_texts(sentences: Sequence[str]) -> list[str]:
        """Sentences after the first get the space that joins them to the one before: the
        byte-level pre-tokenizer keeps a word's leading space ("ĠThe"), and GPT-2's regex never
        matches across it, so the concatenated ids are those of the joined text."""
        return [" " + s if i and s else s for i, s in enumerate(sentences)]

    def word_start_mask(self) -> np.ndarray:
        """bool [vocab_size]: True for a token starting with "Ġ" (a leading space) and for the 5
        special tokens, as fairseq's `get_whole_word_mask` (specials, then `is_beginning_of_word`).
        So the first word of a document (or of a text given to `encode`), which has no leading
        space, continues the token before it (after <s>: a new word, data/masking.py)."""
        mask = np.array([t.startswith(_GPT2_WORD_START) for t in self._tokens], dtype=bool)
        mask[[self._vocab[t] for t in self._REQUIRED_TOKENS]] = True
        return mask

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


def _read_bpe_files(vocab_path: str, merges_path: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The token -> id map of a GPT-2-format vocab.json and the merges of its merges.txt
    (`ByteLevelBPETokenizer.from_files`)."""
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


def train_bpe(
    documents: Iterable[Sequence[str]], vocab_size: int, *, min_frequency: int = 2
) -> ByteLevelBPETokenizer:
    """Learns a byte-level BPE vocab (GPT-2 style) from documents, streaming.

    Returns:
      A tokenizer with <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4 (RoBERTa's published vocab puts
      <mask> last, at 50264; ids are always looked up), then the 256 byte symbols and merges.

    Raises:
      TokenizerError: vocab_size cannot hold the specials and the 256 byte symbols, or no sentences.
    """
    smallest = len(BPE_SPECIAL_TOKENS) + 256
    if vocab_size <= smallest:
        raise TokenizerError(
            f"vocab_size {vocab_size} is too small: byte-level BPE needs more than {smallest} "
            "(5 specials + 256 bytes)"
        )
    # Trained on the texts `encode_documents` encodes, so "ĠThe" is counted where it will occur.
    counter = _SentenceCounter(ByteLevelBPETokenizer._sentence_texts(doc) for doc in documents)
    tokenizer = hf_tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(BPE_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(counter.batches(), trainer=trainer)
    if not counter.sentences:
        raise TokenizerError("no sentences to train the vocab on: the corpus is empty")
    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return ByteLevelBPETokenizer(model["vocab"], merges, source="the trained vocab")


class _SentenceCounter:
    """Feeds documents to a trainer as batches of sentences, counting them."""

    def __init__(self, documents: Iterable[Sequence[str]]):
        self._documents = documents
        self.sentences = 0

    def batches(self) -> Iterator[list[str]]:
        # Batches, not single sentences: the library tokenizes a batch in parallel.
        batch: list[str] = []
        for document in self._documents:
            batch.extend(document)
            if len(batch) >= 1000:
                self.sentences += len(batch)
                yield batch
                batch = []
        if batch:
            self.sentences += len(batch)
            yield batch


# ---------------------------------------------------------------- SentencePiece (ALBERT)

SP_MODEL_FILE = "spiece.model"
SP_PAD, SP_UNK = "<pad>", "<unk>"
SP_CONTROL_SYMBOLS = ("[CLS]", "[SEP]", "[MASK]")
# ALBERT's spm_train flags for 30k-clean.model (google-research/albert README).
SP_USER_SYMBOLS = ("(", ")", '"', "-", ".", "\u2013", "\u00a3", "\u20ac")
_SPIECE_UNDERLINE = "\u2581"
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
        piece.startswith((_SPIECE_UNDERLINE, "<"))
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


class _SentencePieceFile(_VocabTable):
    """What ALBERT's and DeBERTa's SentencePiece tokenizers share: the model proto is the
    tokenizer (`_MODEL_FILE` in the folder, `_KIND` in the identity, `_settings()` the rest)."""

    _MODEL_FILE: str
    _KIND: str

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


class SentencePieceTokenizer(_SentencePieceFile):
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

    def __init__(self, model_proto: bytes, *, lowercase: bool = True, source: str = "the model"):
        """Args:
          model_proto: a serialized SentencePiece ModelProto (the bytes of a .model file).
          lowercase: ALBERT's do_lower_case (True for every published ALBERT).
          source: names the model in error messages.

        Raises:
          TokenizerError: not a SentencePiece model, or a special token missing.
        """
        processor = self._load(model_proto, source, "ALBERT's spiece.model")
        self._sp = processor
        self._proto = bytes(model_proto)
        self._lowercase = bool(lowercase)
        self._tokens = tuple(processor.id_to_piece(i) for i in range(processor.get_piece_size()))
        self._vocab = {t: i for i, t in enumerate(self._tokens)}
        for token in (SP_PAD, SP_UNK, *SP_CONTROL_SYMBOLS):
            if token not in self._vocab:
                raise TokenizerError(
                    f"{source}: the model has no {token} piece: ALBERT needs "
                    f"{', '.join((SP_PAD, SP_UNK, *SP_CONTROL_SYMBOLS))}"
                )

    @classmethod
    def from_model_file(cls, path: str, lowercase: bool = True) -> SentencePieceTokenizer:
        """Loads a .model file, e.g. ALBERT's published spiece.model / 30k-clean.model."""
        if not tf.io.gfile.exists(path):
            raise TokenizerError(f"SentencePiece model '{path}' not found")
        with tf.io.gfile.GFile(path, "rb") as f:
            return cls(f.read(), lowercase=lowercase, source=path)

    def pieces(self, text: str) -> list[str]:
        """ALBERT's `encode_pieces(sp_model, preprocess_text(text))`."""
        out: list[str] = []
        for piece in self._sp.encode(albert_preprocess(text, self._lowercase), out_type=str):
            if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
                split = self._sp.encode(piece[:-1].replace(_SPIECE_UNDERLINE, ""), out_type=str)
                if piece[0] != _SPIECE_UNDERLINE and split and split[0][0] == _SPIECE_UNDERLINE:
                    split = split[1:] if len(split[0]) == 1 else [split[0][1:], *split[1:]]
                out.extend([*split, piece[-1]])
            else:
                out.append(piece)
        return out

    def encode(self, text: str) -> list[int]:
        unk = self.unk_id
        return [self._vocab.get(p, unk) for p in self.pieces(text)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """The normalised text of `ids` ("▁" -> space), padding skipped."""
        pad = self.pad_id
        return self._sp.decode([int(i) for i in ids if i != pad])

    def word_start_mask(self) -> np.ndarray:
        """bool [vocab_size]: ALBERT's `_is_start_piece_sp` (`_is_albert_start_piece`) for every
        piece, and True for [CLS], [SEP], [MASK] (ALBERT's masking treats [CLS]/[SEP] as
        boundaries before asking the rule, which would say "[CLS]" continues a word)."""
        return np.array(
            [_is_albert_start_piece(t) or t in SP_CONTROL_SYMBOLS for t in self._tokens], dtype=bool
        )

    def _settings(self) -> dict:
        return {"lowercase": self._lowercase}


def train_sentencepiece(
    documents: Iterable[Sequence[str]],
    vocab_size: int = 30000,
    *,
    lowercase: bool = True,
    character_coverage: float = 0.99995,
) -> SentencePieceTokenizer:
    """Learns a unigram SentencePiece model with ALBERT's spm_train flags, on text normalised by
    `albert_preprocess` (so training and encoding see the same text).

    Returns:
      A tokenizer with <pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4, the user symbols
      ( ) " - . – £ € next, then the learned pieces.

    Raises:
      TokenizerError: no sentences, or vocab_size larger than the corpus supports.
    """
    sentences = 0

    def normalised() -> Iterator[str]:
        nonlocal sentences
        for document in documents:
            for sentence in document:
                sentences += 1
                yield albert_preprocess(sentence, lowercase)

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=normalised(),
            model_writer=model,
            model_type="unigram",
            vocab_size=vocab_size,
            pad_id=0,
            unk_id=1,
            bos_id=-1,
            eos_id=-1,
            control_symbols=list(SP_CONTROL_SYMBOLS),
            user_defined_symbols=list(SP_USER_SYMBOLS),
            character_coverage=character_coverage,
            shuffle_input_sentence=True,
            input_sentence_size=10_000_000,
            minloglevel=2,
        )
    except RuntimeError as e:
        if not sentences:
            raise TokenizerError("no sentences to train the vocab on: the corpus is empty") from None
        raise TokenizerError(f"SentencePiece training failed: {str(e).strip().splitlines()[-1]}") from None
    return SentencePieceTokenizer(model.getvalue(), lowercase=lowercase, source="the trained model")


# ---------------------------------------------------------------- DeBERTa (v1 BPE, v2/v3 SentencePiece)

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

    def word_start_mask(self) -> np.ndarray:
        """bool [vocab_size]: True for the 5 special tokens and where gpt2_tokenizer.py's
        `part_of_whole_word` is False, on the token's decoded text (`_is_deberta_word_start`):
        a leading space ("Ġthe"), or a lone punctuation, whitespace or control character (","
        starts a word where RoBERTa's rule says it continues one)."""
        decoder = decoders.ByteLevel()
        mask = np.array([_is_deberta_word_start(decoder.decode([t]), " ") for t in self._tokens], dtype=bool)
        mask[[self._vocab[t] for t in self._REQUIRED_TOKENS]] = True
        return mask


class DebertaSentencePieceTokenizer(_SentencePieceFile):
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
                space = " " if parts and self._tokens[run[0]].startswith(_SPIECE_UNDERLINE) else ""
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

    def word_start_mask(self) -> np.ndarray:
        """bool [vocab_size]: True for the 5 special tokens and where spm_tokenizer.py's
        `part_of_whole_word` is False (`_is_deberta_word_start`): a piece starting with "▁", or a
        lone punctuation, whitespace or control character ("," "'" "(" start words). Every other
        piece without "▁" ("s" after "▁function") continues the word before it."""
        return np.array(
            [
                t in DEBERTA_SPECIAL_TOKENS or _is_deberta_word_start(t, _SPIECE_UNDERLINE)
                for t in self._tokens
            ],
            dtype=bool,
        )


def load_bpe_files(vocab_path: str, merges_path: str) -> ByteLevelBPETokenizer:
    """RoBERTa's or DeBERTa v1's vocab.json + merges.txt, told apart by the special tokens:
    a vocab with [CLS] and no <s> is DeBERTa's (`DebertaBPETokenizer`)."""
    vocab, merges = _read_bpe_files(vocab_path, merges_path)
    deberta = CLS in vocab and "<s>" not in vocab
    return (DebertaBPETokenizer if deberta else ByteLevelBPETokenizer)(vocab, merges, source=vocab_path)


# ---------------------------------------------------------------- loading

KINDS = ("wordpiece", "bpe", "sentencepiece")  # the kinds `train` makes
# DeBERTa's tokenizers (v1 BPE, v2/v3 SentencePiece): their models may have more embedding
# rows than tokens (models.pretrained.vocab_fits).
DEBERTA_TOKENIZERS = (DebertaBPETokenizer, DebertaSentencePieceTokenizer)
ALL_KINDS = (*KINDS, "deberta_bpe", "deberta_spm")  # the kinds `load_tokenizer` reads


def load_tokenizer(path: str) -> Tokenizer:
    """Loads a tokenizer from a directory or a file, detecting its kind.

    A directory whose tokenizer_config.json names a "kind" loads that kind. Otherwise: vocab.txt ->
    WordPiece (casing inferred); vocab.json + merges.txt -> byte-level BPE (DeBERTa's when the
    vocab has [CLS] and no <s>, `load_bpe_files`); spm.model -> DeBERTa-v2/v3 SentencePiece;
    spiece.model or a single *.model -> ALBERT SentencePiece (uncased, as every published
    ALBERT). A file: spm.model -> DeBERTa SentencePiece, another *.model -> ALBERT's,
    vocab.json -> BPE (merges.txt beside it), else a WordPiece vocab.txt.

    Raises:
      TokenizerError: nothing loadable at `path`, an unknown kind, or bad tokenizer files.
    """
    if tf.io.gfile.isdir(path):
        config_path = os.path.join(path, CONFIG_FILE)
        if tf.io.gfile.exists(config_path):
            configured = _load_configured(path, config_path)
            if configured is not None:
                return configured
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
            return SentencePieceTokenizer.from_model_file(os.path.join(path, name))
        raise TokenizerError(
            f"'{path}' holds no {CONFIG_FILE}, {VOCAB_FILE}, {BPE_VOCAB_FILE} + {BPE_MERGES_FILE} "
            f"or one *.model ({SP_MODEL_FILE}, {DEBERTA_SPM_FILE}): pass a directory written by "
            "`python -m data.tokenizers train` or a published tokenizer's files"
        )
    if not tf.io.gfile.exists(path):
        raise TokenizerError(f"no tokenizer at '{path}': pass a tokenizer directory or a vocab file")
    if os.path.basename(path) == DEBERTA_SPM_FILE:
        return DebertaSentencePieceTokenizer.from_model_file(path)
    if path.endswith(".model"):
        return SentencePieceTokenizer.from_model_file(path)
    if path.endswith(".json"):
        return load_bpe_files(path, os.path.join(os.path.dirname(path), BPE_MERGES_FILE))
    return WordPieceTokenizer.from_vocab_file(path)


def _load_configured(path: str, config_path: str) -> Tokenizer | None:
    """The tokenizer our tokenizer_config.json names; None for a config without "kind" (e.g.
    HF's own tokenizer_config.json), whose directory is then read by its files."""
    with tf.io.gfile.GFile(config_path, "r") as f:
        try:
            config = json.loads(f.read())
        except json.JSONDecodeError as e:
            raise TokenizerError(
                f"{config_path}: not valid JSON ({e}): rewrite it or train the tokenizer again"
            ) from None
    if not isinstance(config, dict) or "kind" not in config:
        return None
    kind = config["kind"]
    if kind == "wordpiece":
        return WordPieceTokenizer.from_vocab_file(
            os.path.join(path, VOCAB_FILE),
            lowercase=config.get("lowercase"),
            strip_accents=config.get("strip_accents"),
        )
    if kind == "bpe":
        return ByteLevelBPETokenizer.from_files(
            os.path.join(path, BPE_VOCAB_FILE), os.path.join(path, BPE_MERGES_FILE)
        )
    if kind == "sentencepiece":
        return SentencePieceTokenizer.from_model_file(
            os.path.join(path, SP_MODEL_FILE), lowercase=config.get("lowercase", True)
        )
    if kind == "deberta_bpe":
        return DebertaBPETokenizer.from_files(
            os.path.join(path, BPE_VOCAB_FILE), os.path.join(path, BPE_MERGES_FILE)
        )
    if kind == "deberta_spm":
        return DebertaSentencePieceTokenizer.from_model_file(os.path.join(path, DEBERTA_SPM_FILE))
    raise TokenizerError(
        f"{config_path}: unknown tokenizer kind {kind!r}: this version reads {', '.join(ALL_KINDS)}"
    )


# ---------------------------------------------------------------- CLI

_DEFAULT_VOCAB_SIZE = {"wordpiece": 30522, "bpe": 50265, "sentencepiece": 30000}


def _train_main(args: argparse.Namespace) -> None:
    """`train`: the only command."""
    documents = 0

    def training_documents() -> Iterator[tuple[str, ...]]:
        nonlocal documents
        for doc in corpora.iter_documents(
            args.corpus, max_line_chars=args.max_line_chars, tfds_data_dir=args.tfds_data_dir
        ):
            if not corpora.is_heldout(doc, args.eval_fraction):
                documents += 1
                yield doc.sentences

    vocab_size = args.vocab_size or _DEFAULT_VOCAB_SIZE[args.kind]
    if args.kind == "wordpiece":
        tokenizer = train_wordpiece(
            training_documents(),
            vocab_size,
            lowercase=not args.cased,
            min_frequency=args.min_frequency,
            limit_alphabet=args.limit_alphabet,
        )
        written, casing = VOCAB_FILE, ", cased" if args.cased else ", uncased"
    elif args.kind == "bpe":
        if args.cased:
            raise TokenizerError("--cased does not apply to --kind=bpe: byte-level BPE always keeps case")
        tokenizer = train_bpe(training_documents(), vocab_size, min_frequency=args.min_frequency)
        written, casing = BPE_VOCAB_FILE, ""
    else:
        tokenizer = train_sentencepiece(training_documents(), vocab_size, lowercase=not args.cased)
        written, casing = SP_MODEL_FILE, ", cased" if args.cased else ", uncased"
    tokenizer.save(args.output)
    print(
        f"wrote {os.path.join(args.output, written)}: {tokenizer.vocab_size} tokens "
        f"({args.kind}{casing}) from {documents} documents"
    )


def build_parser():
    parser = cli.parser(__doc__, "data.tokenizers")
    commands = parser.add_subparsers(dest="command", required=True, help="the command: train (the only one)")
    train = commands.add_parser("train", help="learn a WordPiece, byte-level BPE or SentencePiece vocab")
    train.add_argument(
        "--corpus",
        required=True,
        help="'demo', 'tfds:NAME[:SPLIT]', or BERT-format text files (comma-separated globs)",
    )
    train.add_argument("--kind", choices=KINDS, default="wordpiece", help="BERT, RoBERTa or ALBERT vocab")
    train.add_argument(
        "--vocab_size", type=int, default=None, help="default 30522 / 50265 / 30000 by --kind (as published)"
    )
    train.add_argument("--output", required=True, help="directory for the vocab and tokenizer_config.json")
    train.add_argument(
        "--cased", action="store_true", help="keep case and accents (default: uncased; not for bpe)"
    )
    train.add_argument(
        "--min_frequency", type=int, default=2, help="wordpiece and bpe: drop rarer merges / pieces"
    )
    train.add_argument(
        "--limit_alphabet", type=int, default=1000, help="wordpiece: at most this many initial characters"
    )
    train.add_argument(
        "--eval_fraction",
        type=float,
        default=0.02,
        help="held-out documents (data.corpora.is_heldout) are left out of training",
    )
    train.add_argument(
        "--max_line_chars", type=int, default=100_000, help="a longer line in a text corpus is an error"
    )
    train.add_argument("--tfds_data_dir", default=None, help="TFDS data_dir for --corpus=tfds:NAME")
    return parser


main = cli.entry(build_parser, _train_main)


if __name__ == "__main__":
    sys.exit(main())
