"""Pretraining heads: the masked-LM head (tied decoder), the NSP/SOP head and SpanBERT's
span boundary (SBO) head; and the fine-tuning heads' form (`ClassifierHead`) with BERT's and
RoBERTa's (ELECTRA's and DeBERTa's are in their own modules; models/classifier.py names them).

Parameter trees (names map onto BERT's cls/predictions and cls/seq_relationship):

    MaskedLMHead: transform/{kernel, bias} [H, E], [E]; transform_layer_norm/{scale, bias} [E];
                  output_bias [padded V]   (E = H except for ALBERT's factorized embedding;
                  padded V = EncoderConfig.padded_vocab_size)
    SentenceHead: classifier/{kernel, bias}   (NSP for BERT, SOP for ALBERT: same head)
    SpanBoundaryHead: position_embeddings/embedding [15, 200]; dense_1/{kernel, bias}
                  [2H + 200, H]; layer_norm_1; dense_2 [H, E]; layer_norm_2; output_bias
                  [padded V]   (SpanBERT's cls.pair_target_predictions; not in transformers)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from core import axes
from core.errors import UserError
from models import matmul
from models.dropout import Dropout
from models.encoder import EncoderConfig, EncoderOutput, bias_init, dense, kernel_init, layer_norm


class NoMaskedLMError(UserError):
    """A pretrained tree without a masked-LM head where one is needed (fill-mask): one line."""


class MaskedLMHead(nn.Module):
    """BERT's MLM head, evaluated only at the P masked positions.

    The positions are gathered first, so the transform and the vocabulary
    projection cost O(B * P * V), never O(B * L * V). With ALBERT's factorized
    embedding the transform maps H -> E and its LayerNorm is over E, so the decoder
    is the [V, E] table (google-research/albert modeling.py get_masked_lm_output).
    """

    config: EncoderConfig

    @nn.compact
    def __call__(
        self, sequence_output: jax.Array, masked_lm_positions: jax.Array | None, word_embeddings: jax.Array
    ) -> jax.Array:
        """Logits over the vocabulary at the masked positions.

        Args:
          sequence_output: [B, L, H] compute dtype, the encoder's last hidden states; or
            [B, P, H], the states at the masked positions already (DeBERTa's enhanced
            mask decoder), when masked_lm_positions is None.
          masked_lm_positions: [B, P] int32 indices into L, or None.
          word_embeddings: [padded V, E] the token embedding table (decoder tied to it).
        Returns:
          [B, P, V] float32 logits (the padding rows' logits are computed, then dropped).
        """
        cfg = self.config
        x = sequence_output
        if masked_lm_positions is not None:
            x = jnp.take_along_axis(sequence_output, masked_lm_positions[:, :, None], axis=1)
        x = nn.with_logical_constraint(x, (axes.BATCH, axes.PREDICTIONS, axes.EMBED))
        # E = H: the square transform's output is labelled `mlp` like any H -> H projection.
        out_axis = axes.FACTORIZED if cfg.factorized_embedding else axes.MLP
        x = cfg.activation(dense(cfg, cfg.embedding_width, (axes.EMBED, out_axis), name="transform")(x))
        x = layer_norm(cfg, cfg.embedding_axis, name="transform_layer_norm")(x).astype(cfg.compute_dtype)
        # Back to the table's layout before the tied decoder: the square transform leaves
        # H labelled `mlp` (split over `tensor`), which the decoder's V also uses. Left to
        # the partitioner, that einsum's backward came out wrong on data x fsdp x tensor
        # meshes (tests/test_sharding.py::test_every_mesh_equals_single_device).
        return tied_logits(self, cfg, x, word_embeddings)


def tied_logits(module: nn.Module, cfg: EncoderConfig, x: jax.Array, word_embeddings: jax.Array) -> jax.Array:
    """The tied decoder of the MLM and SBO heads: x [B, P, E] compute dtype times the word
    table [padded V, E], plus the head's own `output_bias` [padded V] (a parameter of
    `module`) -> [B, P, V] float32, the padding rows' logits dropped."""
    x = nn.with_logical_constraint(x, (axes.BATCH, axes.PREDICTIONS, cfg.embedding_axis))
    # Inputs in compute dtype, accumulation and result in float32: the logits
    # feed a softmax over V entries.
    logits = matmul.einsum("bpe,ve->bpv", x, word_embeddings, cfg.compute_dtype)
    output_bias = module.param(
        "output_bias", bias_init((axes.VOCAB,)), (cfg.padded_vocab_size,), cfg.storage_dtype
    )
    logits = logits + output_bias.astype(jnp.float32)
    logits = nn.with_logical_constraint(logits, (axes.BATCH, axes.PREDICTIONS, axes.VOCAB))
    return logits[..., : cfg.vocab_size]


# SpanBERT's --pair-positional-embedding-size: the width of the SBO head's position table.
SBO_POSITION_WIDTH = 200


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span boundary objective head (facebookresearch/SpanBERT
    pretraining/fairseq/models/pair_bert.py `BertPairTargetPredictionHead`): predicts each
    token of a masked span from the span's two boundary tokens and its place in the span.

    concat[h_left; h_right; position_embeddings[offset]] -> dense_1 (2H + W -> H) -> act ->
    layer_norm_1 -> dense_2 (H -> E) -> act -> layer_norm_2 -> decoder tied to the word
    embeddings with the head's own output_bias. E = H for SpanBERT; with ALBERT's factorized
    embedding dense_2 maps to E so the tied decoder applies (the original has no such case).
    Evaluated per prediction slot (the batch's sbo_* keys), so it costs what the MLM head costs.
    """

    config: EncoderConfig
    max_targets: int = 15  # rows of the position table: targets per span
    position_width: int = SBO_POSITION_WIDTH

    @nn.compact
    def __call__(
        self,
        sequence_output: jax.Array,
        left: jax.Array,
        right: jax.Array,
        offset: jax.Array,
        word_embeddings: jax.Array,
    ) -> jax.Array:
        """Logits over the vocabulary for the span tokens of the prediction slots.

        Args:
          sequence_output: [B, L, H] compute dtype, the encoder's last hidden states.
          left, right: [B, P] int32 positions of each slot's span boundary tokens.
          offset: [B, P] int32 place of the slot's token in its span, 0..max_targets - 1.
          word_embeddings: [padded V, E] the token embedding table.
        Returns:
          [B, P, V] float32 logits.
        """
        cfg = self.config

        def at(positions):
            x = jnp.take_along_axis(sequence_output, positions[:, :, None], axis=1)
            return nn.with_logical_constraint(x, (axes.BATCH, axes.PREDICTIONS, axes.EMBED))

        table = nn.Embed(
            self.max_targets,
            self.position_width,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.storage_dtype,
            embedding_init=kernel_init(cfg, (None, None)),
            name="position_embeddings",
        )
        x = jnp.concatenate([at(left), at(right), table(offset)], axis=-1)
        x = cfg.activation(dense(cfg, cfg.hidden_size, (axes.EMBED, axes.MLP), name="dense_1")(x))
        x = layer_norm(cfg, axes.EMBED, name="layer_norm_1")(x).astype(cfg.compute_dtype)
        # Back to dense_2's input layout: dense_1 leaves H labelled `mlp` (split over
        # `tensor`). Left to the partitioner, the backward through layer_norm_1 came out wrong
        # on a data x fsdp x tensor mesh with microbatches (tests/test_spanbert.py's layouts).
        x = nn.with_logical_constraint(x, (axes.BATCH, axes.PREDICTIONS, axes.EMBED))
        out_axis = axes.FACTORIZED if cfg.factorized_embedding else axes.MLP
        x = cfg.activation(dense(cfg, cfg.embedding_width, (axes.EMBED, out_axis), name="dense_2")(x))
        x = layer_norm(cfg, cfg.embedding_axis, name="layer_norm_2")(x).astype(cfg.compute_dtype)
        return tied_logits(self, cfg, x, word_embeddings)


class SentenceHead(nn.Module):
    """Two-way classifier on the pooled first token: NSP (BERT) or SOP (ALBERT)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, pooled_output: jax.Array) -> jax.Array:
        """pooled_output: [B, H] compute dtype. Returns [B, 2] float32 logits."""
        cfg = self.config
        # H x 2 is negligible work, so it runs in float32 outright.
        return nn.Dense(
            2,
            dtype=jnp.float32,
            param_dtype=cfg.storage_dtype,
            kernel_init=kernel_init(cfg, (axes.EMBED, None)),
            bias_init=bias_init((None,)),
            name="classifier",
        )(pooled_output)


@dataclasses.dataclass(frozen=True)
class ClassifierHead:
    """A family's fine-tuning head up to its classifier (models/classifier.py adds the final
    dense layer to the classes).

    features(cfg, encoded, dropout, deterministic) -> [B, H] compute dtype: called inside
    ClassifierModel's own scope, so a dense layer it makes is a parameter of the fine-tuning
    tree's top level (`classifier_dense`, which core/optim.py's layer-wise decay knows);
    `dropout` is the head's (classifier_dropout_rate). reads_pooler: the encoder is built
    with BERT's pooler (and a pretrained pooler is loaded). classifier_init: the final
    classifier's kernel initialiser for a config (default: the model's truncated normal).
    """

    features: Callable[[EncoderConfig, EncoderOutput, Dropout, bool], jax.Array]
    reads_pooler: bool = False
    classifier_init: Callable[[EncoderConfig], Callable] | None = None


def _pooled_output(cfg: EncoderConfig, encoded: EncoderOutput, dropout: Dropout, deterministic: bool):
    return encoded.pooled_output


def _roberta_features(cfg: EncoderConfig, encoded: EncoderOutput, dropout: Dropout, deterministic: bool):
    first = dropout(encoded.sequence_output[:, 0], deterministic=deterministic)
    return jnp.tanh(dense(cfg, cfg.hidden_size, (axes.EMBED, axes.MLP), name="classifier_dense")(first))


#: BERT and ALBERT (google-research/bert run_classifier.py `create_model`): the pretrained
#: pooler's output (dense + tanh on the first token) -> dropout -> classifier.
POOLER_HEAD = ClassifierHead(_pooled_output, reads_pooler=True)
#: fairseq's RobertaClassificationHead (as HF's): first token -> dropout -> dense H -> tanh
#: -> dropout -> classifier. The dense layer is new: RoBERTa pretrains no pooler.
ROBERTA_HEAD = ClassifierHead(_roberta_features)
