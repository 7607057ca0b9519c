"""DeBERTa's objectives (He et al. 2020, arXiv 2006.03654; DeBERTa-v3, arXiv 2111.09543;
microsoft/DeBERTa DeBERTa/apps/tasks/{mlm_task,rtd_task}.py).

`DebertaMLM` (DeBERTa v1 and v2): BERT's masked LM (pretrain/objectives/masked_lm.py:
the same masking, loss and metrics) with the MLM head reading the enhanced mask decoder
(models/deberta.py) at the masked positions. The recipes mask whole-word n-grams of up to 3
words (`PipelineConfig.masking_unit = 'ngram'`, configs/recipes/deberta.gin).

`DebertaRTD` (DeBERTa-v3): ELECTRA's replaced-token detection (pretrain/objectives/electra.py:
in-step masking, Gumbel-max sampling, the same losses and metrics) with v3's choices:
100% of the masked positions show [MASK], a generator of the discriminator's width and half
its depth that predicts through the enhanced mask decoder, v3's RTD head, gradient-
disentangled embedding sharing (models/deberta_rtd.py), and the discriminator loss weighted
10 (rtd_task.py's rtd_lambda default, which the original's rtd.sh keeps).

Deviation (docs/families/deberta.md): the original trains the generator and the discriminator with
two optimizers, one step each (rtd_task.py decoupled_training), the discriminator after the
generator's update; here one optimizer steps both from one loss, so gradient clipping spans
both towers and the discriminator reads the generator's table from before the step. The
parameter sets are disjoint under GDES and Adam is per-parameter, so nothing else differs.
"""

from __future__ import annotations

import gin

from core import flops
from core.errors import ConfigError
from data.pipeline_config import PipelineConfig
from models.deberta import check_enhanced_mask_decoder
from models.deberta_rtd import DebertaRTDModel, generator_config
from models.encoder import EncoderConfig
from models.pretraining import BertPretrainingModel
from pretrain.objectives.electra import ElectraRTD
from pretrain.objectives.masked_lm import MaskedLM


def _require_deberta(config: EncoderConfig, objective: str) -> None:
    if config.disentangled is None:
        raise ConfigError(
            f"{objective} trains a DeBERTa encoder: set EncoderConfig.disentangled = @DisentangledConfig() "
            "(configs/models/deberta_*.gin)"
        )


def _relative_terms(config: EncoderConfig) -> dict[str, int | bool]:
    """core/flops.py's span and relative terms of a DeBERTa config."""
    opts = config.disentangled
    return {"span": opts.span(config.max_position_embeddings), "c2p": opts.c2p, "p2c": opts.p2c}


@gin.configurable
class DebertaMLM(MaskedLM):
    """Masked LM through DeBERTa's enhanced mask decoder (module docstring); the sentence
    head, if the pipeline makes sentence labels, as MaskedLM's."""

    def __init__(self, model_config: EncoderConfig, pipeline_config: PipelineConfig):
        _require_deberta(model_config, "DebertaMLM")
        check_enhanced_mask_decoder(model_config)
        super().__init__(model_config, pipeline_config)

    def make_module(self) -> BertPretrainingModel:
        return BertPretrainingModel(
            self.model_config, sentence_head=self.sentence_head, enhanced_mask_decoder=True
        )

    def flops_per_row(self, seq_len: int, num_predictions: int) -> float:
        """BERT's MLM count with the relative terms and the decoder's two passes, the encoder's
        own last layer left out unless the sentence head reads it (core/flops.py)."""
        c = self.model_config
        return flops.deberta_pretraining(
            hidden=c.hidden_size,
            layers=c.num_layers,
            intermediate=c.intermediate_size,
            vocab=c.vocab_size,
            seq=seq_len,
            predictions=num_predictions,
            embedding=c.embedding_width,
            last_layer_output_used=self.sentence_head,
            **_relative_terms(c),
        )

    def paper_flops_per_row(self, seq_len: int, num_predictions: int) -> None:
        """flops_computation.py has no count for disentangled attention."""
        del seq_len, num_predictions
        return None


@gin.configurable
class DebertaRTD(ElectraRTD):
    """DeBERTa-v3's replaced-token detection (module docstring).

    Args:
      model_config: the discriminator (DeBERTa, no pooler).
      pipeline_config: as ElectraRTD's (masking in the step).
      disc_weight: the RTD loss's weight (10: the original's rtd_lambda default; the paper
        restates ELECTRA's objective, whose lambda is 50).
      generator_layers: the generator's depth (None = half the discriminator's, as every
        published DeBERTa-v3).
    """

    mask_token_prob = 1.0  # the original's NGramMaskGenerator(keep_prob=0, mask_prob=1)
    family = ("DeBERTa-v3", "configs/recipes/deberta_v3.gin", "deberta")

    def __init__(
        self,
        model_config: EncoderConfig,
        pipeline_config: PipelineConfig,
        disc_weight: float = 10.0,
        generator_layers: int | None = None,
    ):
        _require_deberta(model_config, "DebertaRTD")
        self.generator_layers = generator_layers
        super().__init__(model_config, pipeline_config, disc_weight=disc_weight)

    def make_generator_config(self) -> EncoderConfig:
        config = generator_config(self.model_config, self.generator_layers)
        check_enhanced_mask_decoder(config)
        return config

    def make_module(self) -> DebertaRTDModel:
        return DebertaRTDModel(self.model_config, self.generator_config)

    def flops_per_row(self, seq_len: int, num_predictions: int) -> float:
        """Generator (DeBERTa MLM with EMD at the P masked positions) + discriminator (its
        layers with the relative terms, v3's head at every position), training."""
        del num_predictions
        d, g = self.model_config, self.generator_config
        predictions = self.num_predictions(seq_len)
        generator = flops.deberta_pretraining(
            hidden=g.hidden_size,
            layers=g.num_layers,
            intermediate=g.intermediate_size,
            vocab=g.vocab_size,
            seq=seq_len,
            predictions=predictions,
            embedding=g.embedding_width,
            **_relative_terms(g),
        )
        discriminator = flops.training(
            flops.encoder_layers(
                layers=d.num_layers, hidden=d.hidden_size, intermediate=d.intermediate_size, seq=seq_len
            )
            + flops.relative_terms(
                layers=d.num_layers,
                hidden=d.hidden_size,
                seq=seq_len,
                span=d.disentangled.span(d.max_position_embeddings),
                terms=len(d.disentangled.pos_att_type),
            )
            + flops.embedding_projection(embedding=d.embedding_width, hidden=d.hidden_size, seq=seq_len)
            + flops.discriminator_head(hidden=d.hidden_size, seq=seq_len)
        )
        return generator + discriminator

    def paper_flops_per_row(self, seq_len: int, num_predictions: int) -> None:
        """flops_computation.py has no count for disentangled attention."""
        del seq_len, num_predictions
        return None
