"""A model folder's tokenizer files: reading them with the folder's settings (which files is
each family's business: `ModelFormat.read_tokenizer`; a transformers 5 folder's tokenizer.json
otherwise), the vocabulary check on import, and transformers' tokenizer_config.json keys on
export."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from data import tokenizers
from interop.convert.format import ModelFormat, read_json
from interop.convert.layout import ConversionError
from models.encoder import EncoderConfig

log = logging.getLogger("convert")


def read_tokenizer(fmt: ModelFormat, directory: str, where: str) -> tokenizers.Tokenizer:
    """The tokenizer of a model folder of `fmt`'s family, with the settings of its HF
    tokenizer_config.json when it has one.

    The family's own files (`ModelFormat.read_tokenizer`: vocab.txt, vocab.json + merges.txt,
    a SentencePiece *.model) when the folder has them, they load with its settings, and their
    special tokens are those the folder names (tokenizer_config.json, special_tokens_map.json).
    Otherwise the folder's tokenizer.json, which is all of a tokenizer transformers 5 saves
    (with tokenizer_config.json): read exactly as transformers runs it, with the conventions of
    the family's backend (`ModelFormat.tokenizer_class`; data/tokenizers/tokenizer_json.py).
    A folder with neither is the family's one-line error.
    """
    settings_path = os.path.join(directory, "tokenizer_config.json")
    settings = read_json(settings_path, where) if os.path.exists(settings_path) else {}
    has_json = os.path.exists(os.path.join(directory, tokenizers.TOKENIZER_JSON_FILE))
    own_files = fmt.has_tokenizer_files(directory)
    if own_files or not has_json:
        try:
            tokenizer = fmt.read_tokenizer(directory, settings, where)
            _check_named_specials(tokenizer, directory, settings, where)
            return tokenizer
        except (ConversionError, tokenizers.TokenizerError) as e:
            if has_json:
                log.info("%s: %s: reading its %s instead", where, e, tokenizers.TOKENIZER_JSON_FILE)
            elif own_files:
                raise
            else:  # no tokenizer at all: the family's error, which names its files
                raise type(e)(f"{e} (or the {tokenizers.TOKENIZER_JSON_FILE} transformers 5 saves)") from None
    try:
        return tokenizers.TokenizerJsonTokenizer.from_hf_folder(directory, fmt.tokenizer_class, settings)
    except tokenizers.TokenizerError as e:
        raise ConversionError(f"{where}: {e}") from None


def _check_named_specials(
    tokenizer: tokenizers.Tokenizer, directory: str, settings: Mapping[str, Any], where: str
) -> None:
    """The family's files' special tokens are the ones the folder names (else transformers,
    which uses the named ones, would give other ids)."""
    try:
        named = tokenizers.declared_special_tokens(directory, settings)
    except tokenizers.TokenizerError as e:
        raise ConversionError(f"{where}: {e}") from None
    ours = tokenizer.hf_special_tokens()
    differ = {key: token for key, token in named.items() if key in ours and ours[key] != token}
    if differ:
        theirs = ", ".join(f"{key}={token!r}" for key, token in differ.items())
        raise ConversionError(
            f"{where}: names {theirs}, but its tokenizer files make that "
            f"{', '.join(repr(ours[key]) for key in differ)}: these files are not the folder's tokenizer"
        )


def check_vocab(config: EncoderConfig, tokenizer: tokenizers.Tokenizer, where: str, name: str) -> None:
    """The tokenizer belongs to the model (DeBERTa-v2/v3's tables have spare rows: 128100 for
    128001 tokens; `Tokenizer.fits_vocab`)."""
    if not tokenizer.fits_vocab(config.vocab_size):
        raise ConversionError(
            f"{where}: {name} has vocab_size={config.vocab_size} but the tokenizer has "
            f"{tokenizer.vocab_size} tokens: the vocab file does not belong to this model"
        )


def write_hf_tokenizer(tokenizer: tokenizers.Tokenizer, config: EncoderConfig, output: str) -> None:
    """Our tokenizer's files plus the tokenizer_config.json / special_tokens_map.json keys that
    transformers' AutoTokenizer reads (our load_tokenizer reads the same folder)."""
    tokenizer.save(output)
    specials = tokenizer.hf_special_tokens()
    settings = tokenizer.hf_settings()
    settings = {
        "tokenizer_class": settings["tokenizer_class"],
        "model_max_length": config.max_length,
        **specials,
        **settings,
    }
    path = os.path.join(output, "tokenizer_config.json")
    ours = read_json(path, output) if os.path.exists(path) else {}
    with open(path, "w") as f:
        json.dump({**ours, **settings}, f, indent=2)
    with open(os.path.join(output, "special_tokens_map.json"), "w") as f:
        json.dump(specials, f, indent=2)
