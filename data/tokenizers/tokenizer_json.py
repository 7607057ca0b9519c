"""A transformers tokenizer.json as a tokenizer (kind "tokenizer_json"): what a transformers
folder's tokenizer is when it has none of our backends' files. transformers 5 saves a
tokenizer as tokenizer.json + tokenizer_config.json only (no vocab.txt, vocab.json +
merges.txt or spm model), and its special tokens may be named otherwise than a backend's
(a DeBERTa-v2 model whose pad is <pad>, not [PAD]).

Why the tokenizer.json itself, run by the `tokenizers` library, rather than our backends'
files rebuilt from it: the file *is* the pipeline transformers runs (normalizer,
pre-tokenizer, model, added tokens), and `tokenizers.Tokenizer` loads it exactly, so the ids
equal transformers' by construction, for every family. A rebuilt file would be a second
implementation that agrees only where someone checked: transformers 5's WordPiece makes a
word of more than 100 characters [UNK] (BERT's vocab.txt backend: 200), its ALBERT
pipeline has no digit-comma re-split, its DeBERTa-v2 pipeline normalises with NFC where the
spm model says NFKC, added tokens written in the text are matched, and a Unigram model would
need an spm ModelProto (normaliser rules, precompiled charsmap) synthesised from the JSON.

What the pipeline does not say, the kind this tokenizer `follows` does (a registered
backend, base.py `register_backend`; the model family decides which: interop.convert's
`ModelFormat.tokenizer_class`): the pair format, the word-start rule for whole-word masking
(`word_starts`, on this vocabulary's tokens), how a document's sentences are encoded
(`sentence_texts`), whether the models have spare embedding rows, the transformers class,
and the special token names where the folder gives none.

Files: tokenizer.json (byte for byte the folder's) and tokenizer_config.json: the folder's
transformers settings (tokenizer_class, casing options, the special tokens as
pad_token / unk_token / cls_token / sep_token / mask_token, ...) plus {"kind":
"tokenizer_json", "follows": KIND}, so the directory is also a folder transformers loads.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

import numpy as np
import tensorflow as tf
import tokenizers as hf_tokenizers

from data.tokenizers import base
from data.tokenizers.base import CONFIG_FILE, TokenizerError

TOKENIZER_JSON_FILE = "tokenizer.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"  # older transformers folders' special tokens
# The protocol's special tokens as transformers names them, in `_SPECIAL_TOKENS` order.
HF_SPECIAL_KEYS = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
# tokenizer_config.json entries about where a folder was loaded from or the model's length
# (write_hf_tokenizer writes the model's), not about the tokenizer; and ours.
_NOT_SETTINGS = frozenset(
    {
        "model_max_length",
        "name_or_path",
        "is_local",
        "local_files_only",
        "_commit_hash",
        "tokenizer_file",
        "vocab_file",
        "merges_file",
        "kind",
        "follows",
    }
)


def _token_name(value: Any) -> str | None:
    """A special token as a tokenizer_config.json writes it: a string, or transformers'
    AddedToken object ({"content": ..., "lstrip": ...}); None when it names none."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_json(path: str) -> dict:
    with tf.io.gfile.GFile(path, "rb") as f:
        try:
            value = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TokenizerError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{path}: not a JSON object")
    return value


def declared_special_tokens(directory: str, settings: Mapping[str, Any]) -> dict[str, str]:
    """The special tokens a transformers folder names ({"pad_token": "<pad>", ...}, only those
    it names, of HF_SPECIAL_KEYS): its tokenizer_config.json (`settings`), else its
    special_tokens_map.json (older folders)."""
    path = os.path.join(directory, SPECIAL_TOKENS_MAP_FILE)
    mapped = _read_json(path) if tf.io.gfile.exists(path) else {}
    named = {}
    for key in HF_SPECIAL_KEYS:
        token = _token_name(settings.get(key)) or _token_name(mapped.get(key))
        if token is not None:
            named[key] = token
    return named


def _backend(follows: str | type[base.VocabTable], source: str) -> type[base.VocabTable]:
    kind = follows if isinstance(follows, str) else follows._KIND
    backend = base.backend_of(kind)
    if backend is None:
        raise TokenizerError(
            f"{source}: follows the conventions of tokenizer kind {kind!r}, which this version does "
            f"not have: one of {', '.join(b._KIND for b in base.registered_backends())}"
        )
    return backend


class TokenizerJsonTokenizer(base.PipelineTable):
    """A transformers tokenizer.json run by the `tokenizers` library, with the conventions of
    the backend it follows (see the module docstring). Implements `Tokenizer` with that
    backend's `pair_format`.

    `encode` is the pipeline's encoding without its post-processor (transformers'
    `add_special_tokens=False`): added tokens written in the text (e.g. "[MASK]") are
    matched, as transformers matches them. `decode` is the pipeline's decoder, padding skipped.
    """

    _KIND = "tokenizer_json"

    def __init__(
        self,
        json_text: str,
        *,
        follows: str | type[base.VocabTable],
        special_tokens: Sequence[str],
        hf_settings: Mapping[str, Any] | None = None,
        source: str = TOKENIZER_JSON_FILE,
    ):
        """Args:
          json_text: the tokenizer.json, as text.
          follows: the kind (or backend class) whose conventions this tokenizer has.
          special_tokens: pad, unk, cls, sep and mask, as the vocabulary spells them.
          hf_settings: the folder's other tokenizer_config.json settings (for an export).
          source: names the file in error messages.

        Raises:
          TokenizerError: not a tokenizer.json, a model of another kind than `follows` has
            (WordPiece, BPE, Unigram), ids with gaps, or a special token not in the vocabulary.
        """
        backend = _backend(follows, source)
        try:
            model = json.loads(json_text).get("model", {}).get("type")
            pipeline = hf_tokenizers.Tokenizer.from_str(json_text)
        except Exception as e:  # json's or the library's parser error
            message = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise TokenizerError(f"{source}: not a transformers tokenizer.json ({message})") from None
        if model != backend._PIPELINE_MODEL:
            raise TokenizerError(
                f"{source}: holds a {model} model, but a {backend._KIND} tokenizer's is "
                f"{backend._PIPELINE_MODEL}: the tokenizer does not belong to this model"
            )
        size = pipeline.get_vocab_size(with_added_tokens=True)
        tokens = [pipeline.id_to_token(i) for i in range(size)]
        if None in tokens:
            missing = tokens.index(None)
            raise TokenizerError(f"{source}: token ids are not 0..{size - 1}: id {missing} has no token")
        vocab = {token: i for i, token in enumerate(tokens)}
        special_tokens = tuple(special_tokens)
        if len(special_tokens) != len(HF_SPECIAL_KEYS):
            raise ValueError(f"special_tokens: {len(HF_SPECIAL_KEYS)} tokens (pad, unk, cls, sep, mask)")
        for key, token in zip(HF_SPECIAL_KEYS, special_tokens):
            if token not in vocab:
                raise TokenizerError(f"{source}: has no token {token!r}, the {key}")
        self._follows = backend
        self._json = json_text
        self._tokenizer = pipeline
        self._tokens = tokens
        self._vocab = vocab
        self._SPECIAL_TOKENS = special_tokens
        self._SPARE_EMBEDDING_ROWS = backend._SPARE_EMBEDDING_ROWS
        self._EOD_TOKEN = backend._EOD_TOKEN
        self.pair_format = backend.pair_format
        dropped = _NOT_SETTINGS | set(HF_SPECIAL_KEYS)
        self._hf_settings = {k: v for k, v in (hf_settings or {}).items() if k not in dropped}

    @classmethod
    def from_hf_folder(
        cls, directory: str, follows: str | type[base.VocabTable], settings: Mapping[str, Any]
    ) -> TokenizerJsonTokenizer:
        """The tokenizer.json of a transformers folder whose tokenizer_config.json is `settings`
        ({} without one). The special tokens are the folder's (`declared_special_tokens`),
        else the names `follows` gives them (transformers' defaults for that family)."""
        path = os.path.join(directory, TOKENIZER_JSON_FILE)
        backend = _backend(follows, path)
        named = declared_special_tokens(directory, settings)
        specials = [named.get(key, default) for key, default in zip(HF_SPECIAL_KEYS, backend._SPECIAL_TOKENS)]
        text = _read_text(path)
        return cls(text, follows=backend, special_tokens=specials, hf_settings=settings, source=path)

    @classmethod
    def from_directory(cls, directory: str, config: Mapping[str, Any]) -> TokenizerJsonTokenizer:
        """The tokenizer `save` wrote to `directory`, whose tokenizer_config.json is `config`."""
        path = os.path.join(directory, TOKENIZER_JSON_FILE)
        specials = [_token_name(config.get(key)) for key in HF_SPECIAL_KEYS]
        if None in specials:
            raise TokenizerError(
                f"{os.path.join(directory, CONFIG_FILE)}: names no {HF_SPECIAL_KEYS[specials.index(None)]}: "
                "a tokenizer_json tokenizer's config names all five special tokens"
            )
        return cls(
            _read_text(path),
            follows=config.get("follows", ""),
            special_tokens=specials,
            hf_settings=config,
            source=path,
        )

    @property
    def follows(self) -> str:
        """The kind whose conventions this tokenizer has."""
        return self._follows._KIND

    def decode(self, ids: Sequence[int]) -> str:
        """The pipeline's decoder on `ids`, padding skipped (other special tokens written out)."""
        pad = self.pad_id
        return self._tokenizer.decode([int(i) for i in ids if i != pad], skip_special_tokens=False)

    def sentence_texts(self, sentences: Sequence[str]) -> list[str]:
        """The followed backend's rule (byte-level BPE: a leading space after the first)."""
        return self._follows.sentence_texts(sentences)

    def word_start_mask(self) -> np.ndarray:
        """The followed backend's `word_starts` on this vocabulary and its special tokens."""
        return self._follows.word_starts(self._tokens, self._SPECIAL_TOKENS)

    def hf_settings(self) -> dict:
        """The folder's tokenizer_config.json settings (its tokenizer_class, else the followed
        backend's transformers class), without the special tokens (`hf_special_tokens`)."""
        return {"tokenizer_class": self._follows._HF_CLASS, **self._hf_settings}

    def identity(self) -> dict:
        """{"kind", "follows", "vocab_size", "pair_format", "special_tokens",
        "tokenizer_sha256"}: the hash is of tokenizer.json as `save` writes it (the folder's)."""
        return {
            "kind": self._KIND,
            "follows": self.follows,
            "vocab_size": self.vocab_size,
            "pair_format": self.pair_format,
            "special_tokens": list(self._SPECIAL_TOKENS),
            "tokenizer_sha256": hashlib.sha256(self._json.encode("utf-8")).hexdigest(),
        }

    def save(self, directory: str) -> None:
        tf.io.gfile.makedirs(directory)
        with tf.io.gfile.GFile(os.path.join(directory, TOKENIZER_JSON_FILE), "wb") as f:
            f.write(self._json.encode("utf-8"))
        config = {
            **self.hf_settings(),
            **self.hf_special_tokens(),
            "kind": self._KIND,
            "follows": self.follows,
        }
        with tf.io.gfile.GFile(os.path.join(directory, CONFIG_FILE), "w") as f:
            f.write(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _read_text(path: str) -> str:
    if not tf.io.gfile.exists(path):
        raise TokenizerError(f"'{path}' not found: a tokenizer_json tokenizer needs its tokenizer.json")
    with tf.io.gfile.GFile(path, "rb") as f:
        try:
            return f.read().decode("utf-8")
        except UnicodeDecodeError as e:
            raise TokenizerError(f"{path}: not valid UTF-8 (byte offset {e.start})") from None


def kind_of_hf_class(tokenizer_class: object) -> str | None:
    """The registered kind whose transformers class is `tokenizer_class` (a "...Fast" name of
    older folders included); None for another class."""
    if not isinstance(tokenizer_class, str):
        return None
    name = tokenizer_class.removesuffix("Fast")
    return next((b._KIND for b in base.registered_backends() if b._HF_CLASS == name), None)


base.register_kind(TokenizerJsonTokenizer._KIND, TokenizerJsonTokenizer.from_directory)
