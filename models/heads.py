"""Pretraining heads: the masked-LM head (tied decoder) and the NSP/SOP head.

Parameter trees (names map onto BERT's cls/predictions and cls/seq_relationship):

    MaskedLMHead: transform/{kernel, bias} [H, E], [E]; transform_layer_norm/{scale, bias} [E];
                  output_bias [padded V]   (E = H except for ALBERT's factorized embedding;
                  padded V = EncoderConfig.padded_vocab_size)
    SentenceHead: classifier/{kernel, bias}   (NSP for BERT, SOP for ALBERT: same head)
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from core import axes
from models.encoder import EncoderConfig, bias_init, dense, kernel_init, layer_norm


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
        self, sequence_output: jax.Array, masked_lm_positions: jax.Array, word_embeddings: jax.Array
    ) -> jax.Array:
        """Logits over the vocabulary at the masked positions.

        Args:
          sequence_output: [B, L, H] compute dtype, the encoder's last hidden states.
          masked_lm_positions: [B, P] int32 indices into L.
          word_embeddings: [padded V, E] the token embedding table (decoder tied to it).
        Returns:
          [B, P, V] float32 logits (the padding rows' logits are computed, then dropped).
        """
        cfg = self.config
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
        x = nn.with_logical_constraint(x, (axes.BATCH, axes.PREDICTIONS, cfg.embedding_axis))
        # Inputs in compute dtype, accumulation and result in float32: the logits
        # feed a softmax over V entries.
        logits = jnp.einsum(
            "bpe,ve->bpv", x, word_embeddings.astype(cfg.compute_dtype), preferred_element_type=jnp.float32
        )
        output_bias = self.param(
            "output_bias", bias_init((axes.VOCAB,)), (cfg.padded_vocab_size,), cfg.storage_dtype
        )
        logits = logits + output_bias.astype(jnp.float32)
        logits = nn.with_logical_constraint(logits, (axes.BATCH, axes.PREDICTIONS, axes.VOCAB))
        return logits[..., : cfg.vocab_size]


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
