"""XLNet's options beyond BERT's config: `EncoderConfig.xlnet` (models/xlnet.py reads them)."""

from __future__ import annotations

import dataclasses

import gin


@gin.configurable
@dataclasses.dataclass(frozen=True)
class XLNetOptions:
    """XLNet's options beyond BERT's config (the names are the original's flags).

    Attributes:
      mem_len: memory positions each layer keeps from earlier segments (0: no memory).
      reuse_len: positions of each row that the next step's memory takes (the row's first
        reuse_len tokens: the part the next row continues from).
      clamp_len: relative distances are clipped to [-clamp_len, clamp_len]; -1 (or 0) = not
        clipped, as the original.
      activation_dropout: the rate of the dropout after the FFN's activation; None = the
        hidden dropout (EncoderConfig.dropout_rate), as the original code and transformers
        have it; the paper's pretraining table ("GeLU dropout") gives 0.
    """

    mem_len: int = 384
    reuse_len: int = 256
    clamp_len: int = -1
    activation_dropout: float | None = None
