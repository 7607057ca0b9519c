"""DeBERTa's encoder: disentangled attention over relative positions, the optional v2
convolution, and the enhanced mask decoder (He et al. 2020, arXiv 2006.03654; DeBERTa-v3,
arXiv 2111.09543; microsoft/DeBERTa DeBERTa/deberta/{bert,disentangled_attention}.py and
apps/models/masked_language_model.py; HF modeling_deberta{,_v2}.py).

Built from an `EncoderConfig` whose `disentangled` is set (models/disentangled.py);
`models.backbone.encoder_module` picks this encoder or BERT's. Shapes: B batch, L length,
Q query rows, K key rows, H hidden, N heads, D = H / N, E embedding width, P masked
positions, S attention span (the relative table has 2S rows).

Parameter tree of `DebertaEncoder` (HF names in interop/convert/deberta.py):

    embeddings/word_embeddings/embedding                  [padded V, E]
    embeddings/position_embeddings/embedding              [max positions, E]: only when the
                                   input is position-biased or the EMD runs (pretraining)
    embeddings/token_type_embeddings/embedding            [T, E]: only when T > 0
    embeddings/embedding_projection/kernel                [E, H]: only when E != H (no bias)
    embeddings/layer_norm/{scale, bias}                   [H]
    embeddings/word_embeddings_delta/embedding            GDES (DeBERTa-v3's discriminator):
                                   instead of a word table of its own (`DebertaEmbeddings`)
    rel_embeddings/embedding                              [2S, H]
    rel_layer_norm/{scale, bias}                          [H]: v2/v3 (norm_rel_ebd)
    conv/{kernel [K, H, H], bias [H]}, conv/layer_norm     v2 xlarge/xxlarge (conv_kernel_size)
    layer_i/attention/{query, key, value}/{kernel [H, N, D], bias [N, D]}
                                   (v1: key without bias)
    layer_i/attention/{pos_key, pos_query}/...            without share_att_key (v1: pos_key
                                   without bias)
    layer_i/attention/output, attention_layer_norm, intermediate, output,
    output_layer_norm                                      as BERT's TransformerLayer
    pooler/{kernel, bias}                                  only if config.pooler

Numerics: the three score terms are float32 (operands in the compute dtype, float32
accumulation), divided by sqrt(D * (1 + #relative terms)), softmaxed in float32 with
masked pairs set to exactly zero afterwards (the original's XSoftmax; HF leaves fully
masked rows uniform, which only padding queries see). LayerNorms are float32.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from core import axes
from core.errors import ConfigError
from models import matmul
from models.attention import MASKED_LOGIT, drop_probabilities
from models.disentangled import relative_index
from models.dropout import Dropout
from models.encoder import (
    REMAT_POLICIES,
    EncoderConfig,
    EncoderOutput,
    TransformerLayer,
    add_and_normalize,
    bias_init,
    constrain_hidden,
    default_positions,
    dense,
    heads_in,
    heads_out,
    hidden_dropout,
    kernel_init,
    layer_norm,
    pool,
    real_rows_init,
)
from models.heads import ClassifierHead

log = logging.getLogger(__name__)

_CONV_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "tanh": jnp.tanh,
}


def pair_mask(
    query_mask: jax.Array,
    key_mask: jax.Array,
    query_examples: jax.Array | None = None,
    key_examples: jax.Array | None = None,
) -> jax.Array:
    """Which (query, key) pairs attend: both real and, in packed rows, of one example.

    Args:
      query_mask: [B, Q] int, 1 = real token; key_mask: [B, K] likewise.
      query_examples, key_examples: [B, Q], [B, K] packed-example ids, or None.
    Returns:
      [B, 1, Q, K] bool (broadcast over heads). A padding query's row is all False: its
      probabilities are then zero (the original's XSoftmax).
    """
    mask = query_mask.astype(bool)[:, None, :, None] & key_mask.astype(bool)[:, None, None, :]
    if query_examples is not None:
        mask = mask & (query_examples[:, None, :, None] == key_examples[:, None, None, :])
    return mask


def disentangled_scores(
    cfg: EncoderConfig,
    query: jax.Array,
    key: jax.Array,
    relative_query: jax.Array | None,
    relative_key: jax.Array | None,
    rel_index: jax.Array,
) -> jax.Array:
    """The attention scores c2c + c2p + p2c, scaled, float32.

    c2p[i, j] = Q_i . Kr[idx[i, j]] and p2c[i, j] = K_j . Qr[idx[i, j]], both with
    idx = row of rel = pos_i - pos_j (the original's and HF's code; the paper's Eq. 4 writes
    p2c with the opposite relative distance, which the code does not use).

    Args:
      query: [B, Q, N, D], key: [B, K, N, D] compute dtype.
      relative_query: Qr [2S, N, D] (p2c) or None; relative_key: Kr [2S, N, D] (c2p) or None.
      rel_index: [B, Q, K] int32 rows of the relative table.
    Returns:
      [B, N, Q, K] float32.
    """
    dot = functools.partial(matmul.einsum, dtype=cfg.compute_dtype, accumulate_f32=cfg.accumulate_f32)
    scores = dot("bqnd,bknd->bnqk", query, key).astype(jnp.float32)
    if relative_key is not None:
        c2p = dot("bqnd,rnd->bnqr", query, relative_key).astype(jnp.float32)  # [B, N, Q, 2S]
        scores = scores + jnp.take_along_axis(c2p, rel_index[:, None], axis=-1)
    if relative_query is not None:
        p2c = dot("bknd,rnd->bnkr", key, relative_query).astype(jnp.float32)  # [B, N, K, 2S]
        gathered = jnp.take_along_axis(p2c, jnp.swapaxes(rel_index, 1, 2)[:, None], axis=-1)  # [B, N, K, Q]
        scores = scores + jnp.swapaxes(gathered, -1, -2)
    factor = cfg.disentangled.score_divisor_factor
    return scores * jnp.float32(1.0 / np.sqrt(cfg.head_dim * factor))


class DisentangledSelfAttention(nn.Module):
    """DeBERTa's attention: content projections, the relative table projected by the same
    (share_att_key) or its own projections, scores c2c + c2p + p2c, masked softmax."""

    config: EncoderConfig

    @nn.compact
    def __call__(
        self,
        hidden: jax.Array,
        query_states: jax.Array,
        mask: jax.Array,
        rel_index: jax.Array,
        rel_embeddings: jax.Array,
        *,
        deterministic: bool,
        rows: jax.Array | None = None,
    ) -> jax.Array:
        """Attention of `query_states` over `hidden`.

        Args:
          hidden: [B, K, H] compute dtype, the keys' and values' states.
          query_states: [B, Q, H] compute dtype (`hidden` itself except in the EMD).
          mask: [B, 1, Q, K] bool from `pair_mask`.
          rel_index: [B, Q, K] int32 from `relative_index`.
          rel_embeddings: [2S, H] compute dtype, the (normalised) relative table.
          deterministic: False in training: dropout.
        Returns:
          [B, Q, H] compute dtype.
        """
        cfg, opts = self.config, self.config.disentangled
        heads_axes = (axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV)
        query_proj = heads_in(cfg, "query")
        key_proj = heads_in(cfg, "key", use_bias=opts.version > 1)
        query = nn.with_logical_constraint(query_proj(query_states), heads_axes)
        key = nn.with_logical_constraint(key_proj(hidden), heads_axes)
        value = nn.with_logical_constraint(heads_in(cfg, "value")(hidden), heads_axes)

        # The relative table gets the layer's hidden dropout before its projections (the
        # original's pos_dropout); it has no batch dimension, so it is projected once.
        rel = hidden_dropout(cfg)(rel_embeddings, deterministic=deterministic)[None]
        relative_key = relative_query = None
        if opts.c2p:
            proj = key_proj if opts.share_att_key else heads_in(cfg, "pos_key", use_bias=opts.version > 1)
            relative_key = proj(rel)[0]
        if opts.p2c:
            proj = query_proj if opts.share_att_key else heads_in(cfg, "pos_query")
            relative_query = proj(rel)[0]
        scores = disentangled_scores(cfg, query, key, relative_query, relative_key, rel_index)
        probs = jax.nn.softmax(jnp.where(mask, scores, MASKED_LOGIT), axis=-1)
        probs = jnp.where(mask, probs, 0.0)
        probs = drop_probabilities(
            self, probs, cfg.attention_dropout_rate, cfg.dropout_bits, deterministic, rows
        )
        context = matmul.einsum(
            "bnqk,bknd->bqnd", probs, value, cfg.compute_dtype, accumulate_f32=cfg.accumulate_f32
        ).astype(cfg.compute_dtype)
        context = nn.with_logical_constraint(context, heads_axes)
        return heads_out(cfg)(context)


class DebertaLayer(TransformerLayer):
    """Post-LN layer with disentangled attention: BERT's TransformerLayer (the same parameter
    names, its FFN block) with `DisentangledSelfAttention`, whose attention residual is the
    query states (the EMD's queries differ from the keys)."""

    def make_attention(self) -> nn.Module:
        return DisentangledSelfAttention(self.config)

    def __call__(
        self,
        hidden: jax.Array,
        mask: jax.Array,
        rel_index: jax.Array,
        rel_embeddings: jax.Array,
        deterministic: bool,
        rows: jax.Array | None = None,
        query_states: jax.Array | None = None,
    ) -> jax.Array:
        """hidden: [B, K, H]; query_states: [B, Q, H] or None (= hidden); the rest as
        `DisentangledSelfAttention`. Returns [B, Q, H] compute dtype. `deterministic` is
        positional so that nn.remat can mark it static."""
        queries = hidden if query_states is None else query_states
        attended = self.attention(
            hidden, queries, mask, rel_index, rel_embeddings, deterministic=deterministic, rows=rows
        )
        attended = self.dropout(attended, deterministic=deterministic)
        x = constrain_hidden(add_and_normalize(self.config, self.attention_layer_norm, queries, attended))
        return self.feed_forward(x, deterministic)


def _layer_call(
    layer: DebertaLayer,
    hidden: jax.Array,
    mask: jax.Array,
    rel_index: jax.Array,
    rel_embeddings: jax.Array,
    deterministic: bool,
    rows: jax.Array | None,
) -> jax.Array:
    # A function of the layer, so that nn.remat can lift it (deterministic: static).
    return layer(hidden, mask, rel_index, rel_embeddings, deterministic, rows)


class DebertaEmbeddings(nn.Module):
    """Word (+ token type) (+ absolute position) embeddings of width E, the bias-free
    E -> H projection when E != H, LayerNorm over H, padding zeroed, dropout (the
    original's bert.py BertEmbeddings: project first, then normalise)."""

    config: EncoderConfig

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,
        input_mask: jax.Array,
        segment_ids: jax.Array,
        positions: jax.Array,
        *,
        deterministic: bool,
        with_positions: bool,
        shared_word_table: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """Args:
          input_ids, input_mask, segment_ids, positions: [B, L] int32.
          with_positions: build (and return the lookup of) the absolute position table
            even when the input is not position-biased: the EMD reads it.
          shared_word_table: GDES (DeBERTa-v3): another tower's word table [padded V, E];
            this block then uses stop_gradient(it) + a zero-initialised delta of its own
            (`word_embeddings_delta`) instead of a table of its own.
        Returns:
          embeddings [B, L, H] compute dtype (padding rows exactly 0); the word table
          [padded V, E] (the tied MLM decoder); the raw lookup of the absolute position
          table [B, L, E] float32 (None unless the table exists).
        """
        cfg, opts = self.config, self.config.disentangled
        width_axis = cfg.embedding_axis

        def table(
            rows: int, first_axis: str | None, init: nn.initializers.Initializer, name: str
        ) -> jax.Array:
            return nn.Embed(
                rows,
                cfg.embedding_width,
                param_dtype=cfg.storage_dtype,
                embedding_init=nn.with_logical_partitioning(init, (first_axis, width_axis)),
                name=name,
            ).embedding

        if shared_word_table is None:
            word_table = table(cfg.padded_vocab_size, axes.VOCAB, real_rows_init(cfg), "word_embeddings")
        else:
            delta = table(
                cfg.padded_vocab_size, axes.VOCAB, nn.initializers.zeros_init(), "word_embeddings_delta"
            )
            word_table = jax.lax.stop_gradient(shared_word_table) + delta
        x = jnp.take(word_table, input_ids, axis=0).astype(jnp.float32)
        position_lookup = None
        normal = nn.initializers.truncated_normal(cfg.initializer_range)
        if with_positions or opts.position_biased_input:
            position_table = table(cfg.max_position_embeddings, None, normal, "position_embeddings")
            position_lookup = jnp.take(position_table, positions, axis=0).astype(jnp.float32)
            if opts.position_biased_input:
                x = x + position_lookup
        if cfg.type_vocab_size:
            types = table(cfg.type_vocab_size, None, normal, "token_type_embeddings")
            x = x + jnp.take(types, segment_ids, axis=0).astype(jnp.float32)
        if cfg.factorized_embedding:
            x = matmul.Dense(
                cfg.hidden_size,
                dtype=jnp.float32,
                param_dtype=cfg.storage_dtype,
                kernel_init=kernel_init(cfg, (axes.FACTORIZED, axes.EMBED)),
                use_bias=False,
                name="embedding_projection",
            )(x)
        x = layer_norm(cfg, name="layer_norm")(x) * input_mask[..., None]
        x = hidden_dropout(cfg)(x.astype(cfg.compute_dtype), deterministic=deterministic)
        return constrain_hidden(x), word_table, position_lookup


class ConvLayer(nn.Module):
    """DeBERTa-v2's convolution beside the first layer (the original's bert.py ConvLayer):
    LayerNorm(layer_0_output + act(dropout(conv(embeddings)))), padding zeroed.

    The convolution is "same"-padded along L and written as K shifted taps, each reading
    only tokens of the same example (packed rows equal the examples run alone; without
    packing this is the original's zero padding, as padding embeddings are zero).
    Kernel [K, H_in, H_out] (torch's Conv1d weight [H_out, H_in, K] transposed).
    """

    config: EncoderConfig

    @nn.compact
    def __call__(
        self,
        embeddings: jax.Array,
        residual: jax.Array,
        input_mask: jax.Array,
        example_ids: jax.Array | None,
        *,
        deterministic: bool,
    ) -> jax.Array:
        """embeddings, residual: [B, L, H] compute dtype; input_mask, example_ids: [B, L].
        Returns [B, L, H] compute dtype."""
        cfg = self.config
        width = cfg.disentangled.conv_kernel_size
        kernel = self.param(
            "kernel",
            kernel_init(cfg, (None, axes.EMBED, axes.MLP)),
            (width, cfg.hidden_size, cfg.hidden_size),
            cfg.storage_dtype,
        )
        bias = self.param("bias", bias_init((axes.EMBED,)), (cfg.hidden_size,), cfg.storage_dtype)
        examples = input_mask if example_ids is None else example_ids
        centre, length = (width - 1) // 2, embeddings.shape[1]

        def shifted(x: jax.Array, offset: int) -> jax.Array:
            # y[:, t] = x[:, t + offset], zero outside the row.
            pad = [(0, 0)] * x.ndim
            pad[1] = (max(-offset, 0), max(offset, 0))
            return jnp.pad(x, pad)[:, max(offset, 0) : max(offset, 0) + length]

        out = bias.astype(jnp.float32)
        for tap in range(width):
            offset = tap - centre
            same = (shifted(examples, offset) == examples) & (examples > 0)
            taps = jnp.where(same[..., None], shifted(embeddings, offset), 0)
            out = out + matmul.einsum(
                "blh,ho->blo", taps, kernel[tap], cfg.compute_dtype, accumulate_f32=cfg.accumulate_f32
            ).astype(jnp.float32)
        out = jnp.where(input_mask[..., None].astype(bool), out, 0.0)
        out = hidden_dropout(cfg)(out, deterministic=deterministic)
        out = _CONV_ACTIVATIONS[cfg.disentangled.conv_act](out)
        y = add_and_normalize(cfg, layer_norm(cfg, name="layer_norm"), residual, out)
        return constrain_hidden(y * input_mask[..., None].astype(y.dtype))


class DebertaEncoder(nn.Module):
    """Embeddings, the shared relative table, `num_layers` DeBERTa layers (the v2
    convolution after the first), optionally the pooler, and on request the enhanced
    mask decoder. Same call as models/encoder.py's Encoder, plus `emd_positions` and
    `shared_word_table`."""

    config: EncoderConfig

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,
        input_mask: jax.Array,
        segment_ids: jax.Array,
        positions: jax.Array | None = None,
        example_ids: jax.Array | None = None,
        *,
        deterministic: bool,
        row_index: jax.Array | None = None,
        emd_positions: jax.Array | None = None,
        shared_word_table: jax.Array | None = None,
    ) -> EncoderOutput:
        """Encodes a batch.

        Args:
          input_ids, input_mask, segment_ids: [B, L] int32 (segment_ids unused when the
            config has no token types).
          positions: [B, L] int32 position ids (default 0..L-1); relative positions are
            differences of these, so packed rows (positions restarting per example) see
            each example as if alone.
          example_ids: [B, L] int32 packed-example ids (0 = pad), or None.
          deterministic: False in training (dropout).
          row_index: [B] int32, the rows' places in the global batch (the attention
            dropout's row counter, as in models/encoder.py's Encoder), or None.
          emd_positions: [B, P] int32: also run the enhanced mask decoder at these
            positions (`EncoderOutput.masked_states`); needs E = H and no position-biased
            input (the original runs it only then). Its keys and values are the last
            layer's input: the second-to-last layer's output, or with one layer the
            embeddings (the original needs two layers; one-layer generators are ours).
          shared_word_table: GDES, see `DebertaEmbeddings`.
        """
        cfg, opts = self.config, self.config.disentangled
        if positions is None:
            positions = default_positions(input_ids)
        emd = emd_positions is not None
        if emd:
            check_enhanced_mask_decoder(cfg)
        x, word_table, position_lookup = DebertaEmbeddings(cfg, name="embeddings")(
            input_ids,
            input_mask,
            segment_ids,
            positions,
            deterministic=deterministic,
            with_positions=emd,
            shared_word_table=shared_word_table,
        )
        span = opts.span(cfg.max_position_embeddings)
        rel = nn.Embed(
            2 * span,
            cfg.hidden_size,
            dtype=jnp.float32,
            param_dtype=cfg.storage_dtype,
            embedding_init=kernel_init(cfg, (None, axes.EMBED)),
            name="rel_embeddings",
        ).embedding.astype(jnp.float32)
        if opts.norm_rel_ebd:
            rel = layer_norm(cfg, name="rel_layer_norm")(rel)
        rel = rel.astype(cfg.compute_dtype)
        mask = pair_mask(input_mask, input_mask, example_ids, example_ids)
        rel_index = relative_index(opts, cfg.max_position_embeddings, positions, positions)

        layer_fn = _layer_call
        if cfg.remat_policy != "none":
            layer_fn = nn.remat(_layer_call, policy=REMAT_POLICIES[cfg.remat_policy], static_argnums=(5,))
        layers = [DebertaLayer(cfg, name=f"layer_{i}") for i in range(cfg.num_layers)]
        embedded, penultimate = x, x
        for i, layer in enumerate(layers):
            penultimate = x
            x = layer_fn(layer, x, mask, rel_index, rel, deterministic, row_index)
            if i == 0 and opts.conv_kernel_size:
                x = ConvLayer(cfg, name="conv")(
                    embedded, x, input_mask, example_ids, deterministic=deterministic
                )
        masked_states = None
        if emd:
            masked_states = _enhanced_mask_decoder(
                cfg,
                layers[-1],
                penultimate,
                position_lookup,
                emd_positions,
                input_mask,
                example_ids,
                positions,
                rel,
                deterministic,
                row_index,
            )
        return EncoderOutput(
            sequence_output=x,
            pooled_output=pool(cfg, x),
            word_embeddings=word_table,
            masked_states=masked_states,
        )


def check_enhanced_mask_decoder(cfg: EncoderConfig) -> None:
    """One-line errors for a config the enhanced mask decoder cannot run (objectives call it
    before building anything)."""
    if cfg.factorized_embedding:
        raise ConfigError(
            "DeBERTa's enhanced mask decoder adds the [*, E] position embeddings to [*, H] states: "
            "it needs embedding_size = hidden_size"
        )
    if cfg.disentangled.position_biased_input:
        raise ConfigError(
            "DeBERTa's enhanced mask decoder runs only without position_biased_input (as the original); "
            "set DisentangledConfig.position_biased_input = False, or use the plain MLM head"
        )


def _gather_rows(x: jax.Array, rows: jax.Array) -> jax.Array:
    """x [B, L, ...] at rows [B, P] -> [B, P, ...]."""
    return jnp.take_along_axis(x, rows.reshape(*rows.shape, *([1] * (x.ndim - 2))), axis=1)


def _enhanced_mask_decoder(
    cfg: EncoderConfig,
    last_layer: DebertaLayer,
    penultimate: jax.Array,
    position_lookup: jax.Array,
    emd_positions: jax.Array,
    input_mask: jax.Array,
    example_ids: jax.Array | None,
    positions: jax.Array,
    rel: jax.Array,
    deterministic: bool,
    rows: jax.Array | None,
) -> jax.Array:
    """DeBERTa's enhanced mask decoder at the P masked rows (the original's
    apps/models/masked_language_model.py EnhancedMaskDecoder, two steps): the last layer
    (its weights) applied twice to keys/values = the last layer's input, the queries first
    that input plus the absolute position embeddings, then the first pass's output.

    Every part of a layer after the keys and values works row by row, so running it on the
    P masked rows alone gives what the original computes on all rows and then gathers.

    Returns [B, P, H] compute dtype.
    """
    query = _gather_rows(penultimate.astype(jnp.float32) + position_lookup, emd_positions)
    query = query.astype(cfg.compute_dtype)
    query_mask = jnp.take_along_axis(input_mask, emd_positions, axis=1)
    query_examples = None if example_ids is None else jnp.take_along_axis(example_ids, emd_positions, axis=1)
    mask = pair_mask(query_mask, input_mask, query_examples, example_ids)
    rel_index = relative_index(
        cfg.disentangled,
        cfg.max_position_embeddings,
        jnp.take_along_axis(positions, emd_positions, axis=1),
        positions,
    )
    for _ in range(2):
        query = last_layer(penultimate, mask, rel_index, rel, deterministic, rows, query_states=query)
    return query


# The absolute position table in a DeBERTa encoder tree: read by the enhanced mask decoder
# (pretraining, fill-mask), and by the input only with position_biased_input.
POSITION_TABLE = ("embeddings", "position_embeddings", "embedding")


def has_mask_decoder_table(config: EncoderConfig, encoder: Mapping[str, Any]) -> bool:
    """Whether a masked LM of this encoder tree reads the enhanced mask decoder: a DeBERTa
    tree with the absolute position table (our pretraining keeps it; a transformers
    checkpoint usually has none, and its MLM head then reads the last layer, as
    transformers' does)."""
    return config.disentangled is not None and "position_embeddings" in encoder.get("embeddings", {})


def encoder_for_finetuning(config: EncoderConfig, encoder: Mapping[str, Any]) -> dict[str, Any]:
    """A pretrained encoder tree without what only DeBERTa's pretraining reads: the position
    table of the enhanced mask decoder, which a fine-tuning encoder without a position-biased
    input does not build. Other trees come back unchanged."""
    if config.disentangled is None or config.disentangled.position_biased_input:
        return dict(encoder)
    if POSITION_TABLE[1] not in encoder.get(POSITION_TABLE[0], {}):
        return dict(encoder)
    log.info("DeBERTa's absolute position table (read only by its pretraining mask decoder): left out")
    embeddings = {k: v for k, v in encoder[POSITION_TABLE[0]].items() if k != POSITION_TABLE[1]}
    return {**encoder, POSITION_TABLE[0]: embeddings}


def _context_pooler(cfg: EncoderConfig, encoded: EncoderOutput, dropout: Dropout, deterministic: bool):
    # pooler_dropout is 0 in every published config; the head's dropout after it is the
    # original's cls_dropout (the hidden dropout unless a task sets it).
    first = encoded.sequence_output[:, 0]
    return cfg.activation(dense(cfg, cfg.hidden_size, (axes.EMBED, axes.MLP), name="classifier_dense")(first))


#: The fine-tuning head (`classifier_head = "deberta"`): the original's ContextPooler
#: (DeBERTa/deberta/pooling.py; HF ContextPooler), dense -> GELU on the first token, then
#: dropout -> classifier.
CLASSIFIER_HEAD = ClassifierHead(_context_pooler)
