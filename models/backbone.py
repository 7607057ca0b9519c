"""The encoder a config describes: BERT's (models/encoder.py) or DeBERTa's
(models/deberta.py, when `EncoderConfig.disentangled` is set). The models that take either
(BERT's pretraining model, fine-tuning, feature extraction) build it here. ELECTRA's model
builds BERT's encoder itself (its generator reads the discriminator's embedding block, which
DeBERTa's encoder does not offer); its objective refuses a DeBERTa config, whose RTD is
DeBERTa-v3's (models/deberta_rtd.py)."""

from __future__ import annotations

import flax.linen as nn

from core.errors import ConfigError
from models.deberta import DebertaEncoder
from models.encoder import Encoder, EncoderConfig


def encoder_module(config: EncoderConfig, name: str | None = None) -> nn.Module:
    """The encoder module for `config` (same call signature and `EncoderOutput` for both)."""
    if config.xlnet is not None:
        raise ConfigError(
            "XLNet's encoder (EncoderConfig.xlnet) takes its own inputs (models/xlnet.py): only its "
            "pretraining objective PermutationLM builds it; fine-tuning, export and feature "
            "extraction of XLNet are not implemented yet"
        )
    if config.disentangled is not None:
        return DebertaEncoder(config, name=name)
    return Encoder(config, name=name)
