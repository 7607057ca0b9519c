"""The fine-tuning model: a pretrained encoder and its family's classification head.

`EncoderConfig.classifier_head` (set by the family's model files, saved in the workdir)
names the head; each family's head lives in its own module and `HEADS` names them:

  "pooler" (BERT, ALBERT), "roberta": models/heads.py
  "electra": models/electra.py
  "deberta": models/deberta.py
  "xlnet": models/xlnet.py

Parameter tree: `encoder` (models/encoder.py or models/deberta.py, loaded from the
pretrained workdir; with a pooler only when the head reads it), `classifier_dense/{kernel,
bias}` (the heads with a dense layer of their own: "roberta", "deberta", "xlnet") and
`classifier/{kernel, bias}` (new; zero bias; kernel truncated normal with the model's
initializer_range, or the head's own initialiser: ELECTRA's Glorot uniform).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from core import axes
from models import deberta, electra, heads, xlnet
from models.backbone import encoder_module
from models.dropout import Dropout
from models.encoder import EncoderConfig, bias_init, kernel_init

HEADS: Mapping[str, heads.ClassifierHead] = {
    "pooler": heads.POOLER_HEAD,
    "roberta": heads.ROBERTA_HEAD,
    "electra": electra.CLASSIFIER_HEAD,
    "deberta": deberta.CLASSIFIER_HEAD,
    "xlnet": xlnet.CLASSIFIER_HEAD,
}


class ClassifierModel(nn.Module):
    """Encoder + the family's head (`config.classifier_head`); `num_outputs` = classes, or 1
    for regression."""

    config: EncoderConfig
    num_outputs: int
    classifier_dropout_rate: float = 0.1

    @nn.compact
    def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool) -> jax.Array:
        """batch: int32 `input_ids`, `input_mask`, `segment_ids` [B, L].

        Returns [B, num_outputs] float32 logits (or [B, 1] scores).
        """
        cfg = self.config
        head = HEADS[cfg.classifier_head]
        encoded = encoder_module(dataclasses.replace(cfg, pooler=head.reads_pooler), name="encoder")(
            batch["input_ids"], batch["input_mask"], batch["segment_ids"], deterministic=deterministic
        )
        dropout = Dropout(self.classifier_dropout_rate, bits=cfg.dropout_bits)
        features = head.features(cfg, encoded, dropout, deterministic)
        features = dropout(features, deterministic=deterministic)
        init = head.classifier_init(cfg) if head.classifier_init else kernel_init(cfg, (axes.EMBED, None))
        # A few thousand FLOPs per example: run in float32, like the loss it feeds.
        return nn.Dense(
            self.num_outputs,
            dtype=jnp.float32,
            param_dtype=cfg.storage_dtype,
            kernel_init=init,
            bias_init=bias_init((None,)),
            name="classifier",
        )(features)
