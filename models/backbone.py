"""The encoder a config describes: BERT's (models/encoder.py) or DeBERTa's
(models/deberta.py, when `EncoderConfig.disentangled` is set). Every model that holds an
encoder builds it here, so a new encoder family is one branch in this function."""

from __future__ import annotations

import flax.linen as nn

from models.deberta import DebertaEncoder
from models.encoder import Encoder, EncoderConfig


def encoder_module(config: EncoderConfig, name: str | None = None) -> nn.Module:
    """The encoder module for `config` (same call signature and `EncoderOutput` for both)."""
    if config.disentangled is not None:
        return DebertaEncoder(config, name=name)
    return Encoder(config, name=name)
