"""BERT's pretraining model (encoder + MLM head + optional NSP/SOP head): the module of the
masked-LM objective (pretrain/objectives/masked_lm.py) for BERT, RoBERTa and ALBERT.

Parameter tree top level: `encoder` (models/encoder.py), `mlm_head`, `sentence_head`
when the recipe has a sentence objective, and `sbo_head` for SpanBERT's span boundary
objective (models/heads.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from core.errors import ConfigError
from models.backbone import encoder_module
from models.encoder import EncoderConfig
from models.heads import MaskedLMHead, SentenceHead, SpanBoundaryHead


class BertPretrainingModel(nn.Module):
    """Encoder with the MLM head; if `sentence_head`, the NSP/SOP head (on the pooler,
    which the encoder then has whatever `config.pooler` says); if `sbo_max_targets`,
    SpanBERT's span boundary head."""

    config: EncoderConfig
    sentence_head: bool = True
    #: SpanBERT's span boundary head: 0 = none, else its targets per span (15); the batch
    #: then has sbo_left, sbo_right, sbo_offset [B, P].
    sbo_max_targets: int = 0
    #: DeBERTa (EncoderConfig.disentangled): the MLM head reads the enhanced mask decoder's
    #: states at the masked positions (models/deberta.py) instead of the last layer's.
    enhanced_mask_decoder: bool = False

    @nn.compact
    def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool) -> dict[str, jax.Array]:
        """Logits of a pretraining batch.

        Args:
          batch: int32 arrays `input_ids`, `input_mask`, `segment_ids` [B, L];
            `masked_lm_positions` [B, P]; optional `positions` [B, L] (default
            0..L-1), `example_ids` [B, L] (packed rows: attention stays
            within each example) and `row_index` [B] (the rows' places in the global
            batch: the attention dropout's row counter). Other keys (labels, weights)
            are ignored.
          deterministic: False in training: enables dropout (rng collection "dropout").
        Returns:
          {"mlm_logits": [B, P, V] float32, "sentence_logits": [B, 2] float32
          (only with the sentence head), "sbo_logits": [B, P, V] float32 (only with
          the span boundary head)}.
        """
        # The sentence head reads the pooler: built whenever there is one, also for a model
        # without a pooler of its own (RoBERTa's model files, in the NSP arms of its grid).
        config = dataclasses.replace(self.config, pooler=True) if self.sentence_head else self.config
        extra = {}
        if self.enhanced_mask_decoder:
            if config.disentangled is None:
                raise ConfigError("the enhanced mask decoder is DeBERTa's: set EncoderConfig.disentangled")
            extra["emd_positions"] = batch["masked_lm_positions"]
        encoded = encoder_module(config, name="encoder")(
            batch["input_ids"],
            batch["input_mask"],
            batch["segment_ids"],
            positions=batch.get("positions"),
            example_ids=batch.get("example_ids"),
            deterministic=deterministic,
            row_index=batch.get("row_index"),
            **extra,
        )
        mlm_head = MaskedLMHead(self.config, name="mlm_head")
        if self.enhanced_mask_decoder:
            mlm_logits = mlm_head(encoded.masked_states, None, encoded.word_embeddings)
        else:
            mlm_logits = mlm_head(
                encoded.sequence_output, batch["masked_lm_positions"], encoded.word_embeddings
            )
        logits = {"mlm_logits": mlm_logits}
        if self.sentence_head:
            logits["sentence_logits"] = SentenceHead(self.config, name="sentence_head")(encoded.pooled_output)
        if self.sbo_max_targets:
            logits["sbo_logits"] = SpanBoundaryHead(self.config, self.sbo_max_targets, name="sbo_head")(
                encoded.sequence_output,
                batch["sbo_left"],
                batch["sbo_right"],
                batch["sbo_offset"],
                encoded.word_embeddings,
            )
        return logits


def example_batch(batch_size: int, seq_len: int, num_predictions: int) -> dict[str, np.ndarray]:
    """A batch of the right shapes and dtypes (all real tokens, id 0), for init and eval_shape."""
    tokens = np.zeros((batch_size, seq_len), np.int32)
    return {
        "input_ids": tokens,
        "input_mask": np.ones_like(tokens),
        "segment_ids": tokens,
        "masked_lm_positions": np.zeros((batch_size, num_predictions), np.int32),
    }


def abstract_params(
    config: EncoderConfig, sentence_head: bool = True, enhanced_mask_decoder: bool = False
) -> Any:
    """The parameter tree as ShapeDtypeStructs in nn.Partitioned boxes; allocates nothing."""
    model = BertPretrainingModel(
        config, sentence_head=sentence_head, enhanced_mask_decoder=enhanced_mask_decoder
    )
    variables = jax.eval_shape(
        lambda rng: model.init(rng, example_batch(1, 1, 1), deterministic=True), jax.random.key(0)
    )
    return variables["params"]


# The arrays with one row per vocabulary entry (EncoderConfig.padded_vocab_size rows).
# ELECTRA's generator head (models/electra.py) decodes with the same table.
VOCAB_ROWS = (
    ("encoder", "embeddings", "word_embeddings", "embedding"),
    ("mlm_head", "output_bias"),
    ("generator_head", "output_bias"),
    ("sbo_head", "output_bias"),
    ("encoder", "word_embeddings"),  # XLNet's encoder holds its table as an array
    ("plm_head", "output_bias"),
)


def resize_vocab_rows(params: Mapping[str, Any], rows: int) -> dict[str, Any]:
    """`params` (nested NumPy arrays) with the VOCAB_ROWS arrays cut or zero-padded to `rows`.

    Moves parameters between vocab_pad_multiple settings: the rows past vocab_size are
    never looked up and their logits are dropped, so cutting them, or adding zero rows,
    leaves the model's outputs unchanged.
    """
    flat = traverse_util.flatten_dict(params)
    for path in VOCAB_ROWS:
        if path in flat:
            array = np.asarray(flat[path])
            if array.shape[0] >= rows:
                flat[path] = array[:rows]
            else:
                padding = np.zeros((rows - array.shape[0], *array.shape[1:]), array.dtype)
                flat[path] = np.concatenate([array, padding])
    return traverse_util.unflatten_dict(flat)
