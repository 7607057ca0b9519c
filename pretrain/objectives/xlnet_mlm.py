"""MLM on XLNet's encoder: the XLNet paper's "DAE + Transformer-XL" ablation (arXiv
1906.08237 Table 6, row 2), BERT's masked LM trained on the same backbone as XLNet.

BERT's objective and heads (`MaskedLM`: the MLM head's transform and LayerNorm, tied to
XLNet's word table) over XLNet's content stream, without memory or permutation: rows come
from an MLM pipeline format (e.g. full_sentences), XLNet's relative positions and segment
biases stay. Only its FLOP count differs from `MaskedLM`'s: the relative-position projection
and scores (core/flops.py `xlnet_content_stream`), so that an equal-FLOPs grid
(configs/ablations/xlnet) gives it the steps it can afford.
"""

from __future__ import annotations

import gin

from core import flops
from core.errors import ConfigError
from data.pipeline_config import PipelineConfig
from models.encoder import EncoderConfig
from pretrain.objectives.masked_lm import MaskedLM


@gin.configurable
class XLNetMLM(MaskedLM):
    """MaskedLM on XLNet's encoder (see the module docstring)."""

    def __init__(self, model_config: EncoderConfig, pipeline_config: PipelineConfig):
        if model_config.xlnet is None:
            raise ConfigError(
                "the objective XLNetMLM trains XLNet's encoder: set EncoderConfig.xlnet "
                "(configs/models/xlnet_*.gin), or use MaskedLM for BERT's"
            )
        super().__init__(model_config, pipeline_config)

    def flops_per_row(self, seq_len: int, num_predictions: int) -> float:
        """XLNet's content stream without memory and BERT's MLM head at the P masked positions."""
        c = self.model_config
        content = flops.xlnet_content_stream(
            hidden=c.hidden_size, layers=c.num_layers, intermediate=c.intermediate_size, seq=seq_len, memory=0
        )
        head = flops.mlm_head(
            hidden=c.hidden_size, embedding=c.hidden_size, vocab=c.vocab_size, predictions=num_predictions
        )
        return flops.training(content + head)

    def paper_flops_per_row(self, seq_len: int, num_predictions: int) -> None:
        """flops_computation.py has no count for XLNet's relative attention."""
        del seq_len, num_predictions
        return None
