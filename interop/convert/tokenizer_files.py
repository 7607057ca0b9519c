"""A model folder's tokenizer files: reading them with the folder's settings (which files is
each family's business: `ModelFormat.read_tokenizer`), the vocabulary check on import, and
transformers' tokenizer_config.json keys on export."""

from __future__ import annotations

import json
import os

from data import tokenizers
from interop.convert.format import ModelFormat, read_json
from interop.convert.layout import ConversionError
from models.encoder import EncoderConfig


def read_tokenizer(fmt: ModelFormat, directory: str, where: str) -> tokenizers.Tokenizer:
    """The tokenizer files of a model folder of `fmt`'s family, with the settings of its HF
    tokenizer_config.json when it has one."""
    settings_path = os.path.join(directory, "tokenizer_config.json")
    settings = read_json(settings_path, where) if os.path.exists(settings_path) else {}
    return fmt.read_tokenizer(directory, settings, where)


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
