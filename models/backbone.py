"""The encoder a config describes: BERT's (models/encoder.py), DeBERTa's (models/deberta.py,
when `EncoderConfig.disentangled` is set) or XLNet's (models/xlnet.py, when
`EncoderConfig.xlnet` is set: its content stream alone, no memory). The models that take any
of them (BERT's pretraining model, fine-tuning, feature extraction) build it here. ELECTRA's
model builds BERT's encoder itself (its generator reads the discriminator's embedding block,
which the others do not offer); its objective refuses a DeBERTa config, whose RTD is
DeBERTa-v3's (models/deberta_rtd.py)."""

from __future__ import annotations

import flax.linen as nn

from models.deberta import DebertaEncoder
from models.encoder import Encoder, EncoderConfig
from models.xlnet import XLNetEncoder


def encoder_module(config: EncoderConfig, name: str | None = None) -> nn.Module:
    """The encoder module for `config` (same call signature and `EncoderOutput` for all)."""
    if config.xlnet is not None:
        return XLNetEncoder(config, name=name)
    if config.disentangled is not None:
        return DebertaEncoder(config, name=name)
    return Encoder(config, name=name)
