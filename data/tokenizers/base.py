"""What every tokenizer backend shares: the `Tokenizer` protocol, `TokenizerError`, BERT's
special tokens, the pair helpers (`truncate_seq_pair`, `pair_inputs`), `VocabTable` (the
protocol members over a token list) and the registry of kinds, through which `load_tokenizer`
reads a directory whose tokenizer_config.json names its kind. A backend registered with
`register_backend` also lends its conventions (special token names, pair format, word-start
rule) to a tokenizer whose pipeline is a transformers tokenizer.json (tokenizer_json.py):
`backend_of`.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from core.errors import UserError
from data import pair_layout

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# In this order they get ids 0..4 in a trained vocab. (Published vocabs differ:
# [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103; ids are always looked up.)
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
CONFIG_FILE = "tokenizer_config.json"


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
    def eod_id(self) -> int | None:
        """The end-of-document token that XLNet's data stream puts between documents
        (`<eod>`), or None for a tokenizer without one."""

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
        """ "bert": `[CLS] A [SEP] B [SEP]`; "roberta": `<s> A </s></s> B </s>`; "xlnet":
        `A <sep> B <sep> <cls>`."""

    def word_start_mask(self) -> np.ndarray:
        """bool [vocab_size]: True where token id i begins a new word (special tokens included).
        A word is a start token and the non-start tokens that follow it; each backend's rule
        is in its docstring."""

    def fits_vocab(self, vocab_size: int) -> bool:
        """Whether this tokenizer belongs to a model with `vocab_size` embedding rows: the same
        size, or for DeBERTa's tokenizers no more (the published DeBERTa-v2/v3 tables have
        128100 rows for 128001 tokens: spare rows that no id reaches)."""

    def hf_special_tokens(self) -> dict[str, str]:
        """The special tokens as transformers' tokenizer_config.json and special_tokens_map.json
        name them: "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", and
        "bos_token" / "eos_token" (the cls / sep tokens) where the transformers class has them."""

    def hf_settings(self) -> dict:
        """The transformers class that reads this tokenizer's files ("tokenizer_class") and the
        tokenizer_config.json settings that make it tokenize as this tokenizer does."""

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


class VocabTable:
    """The `Tokenizer` members every backend shares: a token list (`_tokens`, id -> token),
    its inverse (`_vocab`), the special tokens' names in `_SPECIAL_TOKENS` (pad, unk,
    cls, sep, mask), which each backend names differently, `encode_documents` over the
    backend's `encode_batch` and `sentence_texts`, `word_start_mask` over the backend's
    `word_starts`, `fits_vocab` and `hf_special_tokens`.

    The class-level members are the backend's conventions, which a tokenizer.json tokenizer
    that follows the backend's kind takes over (tokenizer_json.py): `pair_format`,
    `_SPECIAL_TOKENS` (the names transformers uses by default), `word_starts`,
    `sentence_texts`, `_SPARE_EMBEDDING_ROWS`, `_HF_CLASS` and `_PIPELINE_MODEL`."""

    pair_format: str
    _KIND: str  # identity()["kind"], and the "kind" of the tokenizer_config.json `save` writes
    _SPECIAL_TOKENS: tuple[str, str, str, str, str]
    _EOD_TOKEN: str | None = None  # `Tokenizer.eod_id`'s token, where the family has one
    _tokens: list[str]
    _vocab: dict[str, int]
    # Whether the published models of this tokenizer have embedding rows beyond its tokens.
    _SPARE_EMBEDDING_ROWS = False
    # Whether the transformers class of this tokenizer also names the cls / sep tokens bos / eos.
    _HF_BOS_EOS = False
    # The tokenizer_config.json settings a published folder of this tokenizer must have (key ->
    # the one value supported): options of the transformers class this backend does not implement.
    HF_FIXED_SETTINGS: Mapping[str, Any] = {}
    # The transformers class that reads this backend's files ("tokenizer_class").
    _HF_CLASS: str
    # The `tokenizers` library model of transformers' pipeline for this backend's vocabs
    # (tokenizer.json's model "type"): "WordPiece", "BPE" or "Unigram".
    _PIPELINE_MODEL: str

    @classmethod
    def word_starts(cls, tokens: Sequence[str], specials: Collection[str]) -> np.ndarray:
        """bool [len(tokens)]: the backend's word-start rule (`Tokenizer.word_start_mask`) for
        a vocabulary whose token i is `tokens[i]` and whose special tokens are `specials`.
        Every backend defines its own; this base has no rule to fall back on."""
        raise NotImplementedError(
            f"{cls.__name__} defines no word_starts: a backend must give its word-start rule"
        )

    def word_start_mask(self) -> np.ndarray:
        """`Tokenizer.word_start_mask`: `word_starts` of this vocabulary (the backend's rule)."""
        return self.word_starts(self._tokens, self._SPECIAL_TOKENS)

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
    def eod_id(self) -> int | None:
        return None if self._EOD_TOKEN is None else self._vocab.get(self._EOD_TOKEN)

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
        encoded = iter(self.encode_batch([t for doc in documents for t in self.sentence_texts(doc)]))
        return [[next(encoded) for _ in doc] for doc in documents]

    @staticmethod
    def sentence_texts(sentences: Sequence[str]) -> list[str]:
        """The text each sentence of one document is encoded from. WordPiece and SentencePiece
        split at whitespace before anything else, so a sentence alone gives the same pieces as
        in the joined text (SentencePiece's dummy prefix is the "▁" the joining space becomes)."""
        return list(sentences)

    def fits_vocab(self, vocab_size: int) -> bool:
        """`Tokenizer.fits_vocab`: vocab_size == the tokenizer's, or <= where the published
        models have spare rows (`_SPARE_EMBEDDING_ROWS`: DeBERTa's)."""
        if self._SPARE_EMBEDDING_ROWS:
            return self.vocab_size <= vocab_size
        return self.vocab_size == vocab_size

    def hf_special_tokens(self) -> dict[str, str]:
        """`Tokenizer.hf_special_tokens`: {"unk_token", "sep_token", "pad_token", "cls_token",
        "mask_token"} and, with `_HF_BOS_EOS`, {"bos_token": cls, "eos_token": sep}."""
        pad, unk, cls, sep, mask = self._SPECIAL_TOKENS
        specials = {
            "unk_token": unk,
            "sep_token": sep,
            "pad_token": pad,
            "cls_token": cls,
            "mask_token": mask,
        }
        if self._HF_BOS_EOS:
            specials.update(bos_token=cls, eos_token=sep)
        return specials


class PipelineTable(VocabTable):
    """A vocab table whose encoding is a `tokenizers` library pipeline (`_tokenizer`, its
    `encode` without special tokens): WordPiece and byte-level BPE."""

    _tokenizer: Any

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # encode_batch_fast skips computing character offsets, which only a word segmenter needs.
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def encode_batch_offsets(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Each text's ids and each token's (start, end) character offsets in the text (a
        token made by normalisation, as a lowercased or accent-stripped letter, keeps the
        offsets of the characters it came from)."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [(e.ids, e.offsets) for e in encodings]


# How a tokenizer loads from a directory whose tokenizer_config.json names its kind:
# (the directory, that config as parsed) -> the tokenizer.
DirectoryLoader = Callable[[str, Mapping[str, Any]], Tokenizer]

# kind -> its DirectoryLoader; each backend module registers its kinds when it is imported.
_KIND_LOADERS: dict[str, DirectoryLoader] = {}
# kind -> the backend class of that kind (`register_backend`), whose conventions it lends.
_KIND_BACKENDS: dict[str, type[VocabTable]] = {}


def register_kind(kind: str, load_from_directory: DirectoryLoader) -> None:
    """Makes `load_tokenizer` read a directory whose tokenizer_config.json has "kind": `kind`
    with `load_from_directory` (a backend's `from_directory`)."""
    if kind in _KIND_LOADERS:
        raise ValueError(f"tokenizer kind {kind!r} is registered twice")
    _KIND_LOADERS[kind] = load_from_directory


def register_backend(backend: type[VocabTable]) -> None:
    """Registers a backend class: its kind (`backend._KIND`, read by `backend.from_directory`),
    and its conventions for tokenizer.json tokenizers that follow that kind (`backend_of`)."""
    register_kind(backend._KIND, backend.from_directory)
    _KIND_BACKENDS[backend._KIND] = backend


def backend_of(kind: object) -> type[VocabTable] | None:
    """The backend class registered (`register_backend`) for `kind`; None for any other value."""
    return _KIND_BACKENDS.get(kind) if isinstance(kind, str) else None


def registered_backends() -> tuple[type[VocabTable], ...]:
    """The backend classes `register_backend` registered, in that order."""
    return tuple(_KIND_BACKENDS.values())


def registered_kinds() -> tuple[str, ...]:
    """The kinds a tokenizer_config.json may name, in the order they were registered."""
    return tuple(_KIND_LOADERS)


def kind_loader(kind: object) -> DirectoryLoader | None:
    """The loader registered for `kind`; None for any other value (a hand-edited
    tokenizer_config.json may hold an unknown name, or not a string)."""
    return _KIND_LOADERS.get(kind) if isinstance(kind, str) else None
