"""One `Tokenizer` protocol; the WordPiece backend of BERT, built on the `tokenizers` library.

`WordPieceTokenizer` reproduces google-research/bert `tokenization.FullTokenizer`
(BasicTokenizer + WordpieceTokenizer): clean control characters, space out CJK
characters, lowercase and strip accents when uncased, split on whitespace and
punctuation, then greedy longest-match-first wordpieces with "##" continuations, and
"[UNK]" for a word with no segmentation or longer than 100 characters. Special tokens
written in the text (e.g. "[MASK]") are *not* recognised, exactly as in the original.

A tokenizer lives in a directory (`save` / `load_tokenizer`):

    vocab.txt              one token per line; line i (from 0) is id i
    tokenizer_config.json  {"kind": "wordpiece", "lowercase": bool, "strip_accents": bool}

Published BERT vocabs load directly (`load_tokenizer("uncased_L-12_H-768_A-12/vocab.txt")`);
their casing is inferred from the vocab. Train a new vocab with

    python -m data.tokenizers train --corpus=SPEC --vocab_size=30522 --output=DIR [--cased]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import typing
from typing import Iterable, Iterator, Sequence

import tensorflow as tf
import tokenizers as hf_tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from data import corpora

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# In this order they get ids 0..4 in a trained vocab. (Published vocabs differ:
# [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103; ids are always looked up.)
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
VOCAB_FILE = "vocab.txt"
CONFIG_FILE = "tokenizer_config.json"
# Bracketed tokens ("[PAD]", "[unused0]") are not text; casing inference ignores them.
_RESERVED_TOKEN = re.compile(r"\[[^\]]*\]")


class TokenizerError(ValueError):
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

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`: subword pieces joined, padding skipped."""

    def id_to_token(self, i: int) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...

    def identity(self) -> dict:
        """JSON-able description that changes whenever the ids of any text would change."""

    def save(self, directory: str) -> None:
        """Writes the files `load_tokenizer(directory)` reads back."""


class WordPieceTokenizer:
    """BERT's WordPiece tokenizer (see the module docstring). Implements `Tokenizer`."""

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

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def pad_id(self) -> int:
        return self._vocab[PAD]

    @property
    def unk_id(self) -> int:
        return self._vocab[UNK]

    @property
    def cls_id(self) -> int:
        return self._vocab[CLS]

    @property
    def sep_id(self) -> int:
        return self._vocab[SEP]

    @property
    def mask_id(self) -> int:
        return self._vocab[MASK]

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset({self.pad_id, self.cls_id, self.sep_id, self.mask_id})

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

    def id_to_token(self, i: int) -> str:
        if not 0 <= i < len(self._tokens):
            raise IndexError(f"token id {i} is outside the vocab [0, {len(self._tokens)})")
        return self._tokens[i]

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

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
    tokenizer = hf_tokenizers.Tokenizer(models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=100))
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
    sentences = 0

    def batches() -> Iterator[list[str]]:
        # Batches, not single sentences: the library tokenizes a batch in parallel.
        nonlocal sentences
        batch = []
        for document in documents:
            batch.extend(document)
            if len(batch) >= 1000:
                sentences += len(batch)
                yield batch
                batch = []
        if batch:
            sentences += len(batch)
            yield batch

    tokenizer = _bert_pipeline({}, lowercase, lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tokenizer.train_from_iterator(batches(), trainer=trainer)
    if not sentences:
        raise TokenizerError("no sentences to train the vocab on: the corpus is empty")
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    # The trained pipeline registers the specials as "added tokens", matched in raw text;
    # rebuilding from the plain vocab keeps BERT's behaviour, identical to a reloaded vocab.
    return WordPieceTokenizer(tokens, lowercase=lowercase, source="the trained vocab")


def load_tokenizer(path: str) -> Tokenizer:
    """Loads a tokenizer directory (tokenizer_config.json + vocab.txt), a directory with only a
    vocab.txt, or a bare vocab file (casing inferred from the vocab).

    Raises:
      TokenizerError: nothing loadable at `path`, an unknown kind, or a bad vocab.
    """
    if tf.io.gfile.isdir(path):
        config_path = os.path.join(path, CONFIG_FILE)
        vocab_path = os.path.join(path, VOCAB_FILE)
        if not tf.io.gfile.exists(config_path):
            if tf.io.gfile.exists(vocab_path):
                return WordPieceTokenizer.from_vocab_file(vocab_path)
            raise TokenizerError(
                f"'{path}' holds no {CONFIG_FILE} or {VOCAB_FILE}: pass a directory "
                "written by `python -m data.tokenizers train`, or a vocab.txt"
            )
        with tf.io.gfile.GFile(config_path, "r") as f:
            try:
                config = json.loads(f.read())
            except json.JSONDecodeError as e:
                raise TokenizerError(
                    f"{config_path}: not valid JSON ({e}): rewrite it or train the tokenizer again"
                ) from None
        kind = config.get("kind") if isinstance(config, dict) else None
        if kind != "wordpiece":
            raise TokenizerError(
                f'{config_path}: unknown tokenizer kind {kind!r}: this version reads "wordpiece"'
            )
        return WordPieceTokenizer.from_vocab_file(
            vocab_path, lowercase=config.get("lowercase"), strip_accents=config.get("strip_accents")
        )
    if not tf.io.gfile.exists(path):
        raise TokenizerError(f"no tokenizer at '{path}': pass a tokenizer directory or a vocab.txt")
    return WordPieceTokenizer.from_vocab_file(path)


def _train_main(args: argparse.Namespace) -> None:
    documents = 0

    def training_documents() -> Iterator[tuple[str, ...]]:
        nonlocal documents
        for doc in corpora.iter_documents(
            args.corpus, max_line_chars=args.max_line_chars, tfds_data_dir=args.tfds_data_dir
        ):
            if not corpora.is_heldout(doc, args.eval_fraction):
                documents += 1
                yield doc.sentences

    tokenizer = train_wordpiece(
        training_documents(),
        args.vocab_size,
        lowercase=not args.cased,
        min_frequency=args.min_frequency,
        limit_alphabet=args.limit_alphabet,
    )
    tokenizer.save(args.output)
    casing = "cased" if args.cased else "uncased"
    print(
        f"wrote {os.path.join(args.output, VOCAB_FILE)}: {tokenizer.vocab_size} tokens "
        f"(wordpiece, {casing}) from {documents} documents"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data.tokenizers", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="learn a WordPiece vocab from a corpus")
    train.add_argument(
        "--corpus",
        required=True,
        help="'demo', 'tfds:NAME[:SPLIT]', or BERT-format text files (comma-separated globs)",
    )
    train.add_argument("--vocab_size", type=int, required=True, help="e.g. 30522 (BERT uncased)")
    train.add_argument("--output", required=True, help="directory for vocab.txt and tokenizer_config.json")
    train.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased)")
    train.add_argument("--min_frequency", type=int, default=2)
    train.add_argument("--limit_alphabet", type=int, default=1000)
    train.add_argument(
        "--eval_fraction",
        type=float,
        default=0.02,
        help="held-out documents (data.corpora.is_heldout) are left out of training",
    )
    train.add_argument("--max_line_chars", type=int, default=100_000)
    train.add_argument("--tfds_data_dir", default=None)
    args = parser.parse_args(argv)
    try:
        _train_main(args)
    except (TokenizerError, corpora.CorpusError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
