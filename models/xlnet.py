"""XLNet's encoder (arXiv 1906.08237; zihangdai/xlnet `modeling.py`): Transformer-XL
relative attention with memories, in two streams over one set of weights.

- The **content stream** h is a post-LN Transformer over the word embeddings (no absolute
  positions, no embedding LayerNorm). Its attention score, per head, is
  [(q + r_w) . k  +  rel_shift((q + r_r) . k_r)  +  (q + r_s) . seg_embed[same | diff]]
  / sqrt(d): content, relative position (k_r: the sinusoid of each relative distance
  through its own projection) and segment (whether query and key are in the same segment).
- The **query stream** g starts from a learned mask embedding at each prediction target and
  attends to the content stream's keys and values with the target's own permutation mask
  (which hides the target itself): it predicts a token from its position alone. The
  original runs it at all L rows and gathers the targets (modeling.py `two_stream_rel_attn`
  with target_mapping); we compute only the P target rows, with the relative-position term
  gathered per target (`relative_gather`), which tests/test_xlnet.py shows equal.
- **Memories**: layer i attends to [memory_i; h_i] and caches its *input* (layer 0: the
  embeddings after dropout): new memory_i = stop_gradient([memory_i; h_i[:reuse_len]])
  [-mem_len:]. Memories count as segment 0 and are always visible (the original's training
  starts them as attended zeros).
- **Directions**: relative distances klen .. -qlen + 1, negated for a row read backwards
  (bi_data), given per row (`direction` [B], +1 or -1), not as "the second half of the
  batch" as in the original, which a different core count or microbatching would swap.

`EncoderConfig.xlnet` (models/xlnet_options.py) holds mem_len, reuse_len and clamp_len.

Parameters (per layer `layer_{i}`): attention/{query,key,value,relative} [H, N, D] and
attention/output [N, D, H] (no biases), attention/{r_w, r_r, r_s} [N, D] (the original's
r_w_bias, r_r_bias, r_s_bias with untie_r; named so that weight decay, which skips names
ending in "bias", decays them as the original does), attention/seg_embed [2, N, D], and
BERT's layer norms and FFN (`TransformerLayer`). The word table is `word_embeddings`.
"""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from core import axes
from core.errors import ConfigError
from models import matmul
from models.attention import drop_probabilities
from models.dropout import Dropout
from models.encoder import (
    EncoderConfig,
    EncoderOutput,
    TransformerLayer,
    add_and_normalize,
    constrain_hidden,
    dense,
    heads_in,
    heads_out,
    hidden_dropout,
    kernel_init,
    real_rows_init,
)
from models.heads import ClassifierHead, NoMaskedLMError

# What the original subtracts from a masked score (modeling.py `rel_attn_core`): float32,
# so that a row with nothing visible becomes uniform, as there.
_MASKED = 1e30


@flax.struct.dataclass
class XLNetOutput(EncoderOutput):
    """What the encoder returns: BERT's `EncoderOutput` (sequence_output: [B, L, H] compute
    dtype, the content stream's last layer; pooled_output None; word_embeddings the word
    table), and

    query: [B, P, H] compute dtype, the query stream at the targets, or None without targets.
    memory: [B, layers, M, H], the memory the next segment of these rows reads (its dtype is
      the input memory's), or None when mem_len is 0 (a caller that reads none, as
      fine-tuning, leaves it to the compiler to drop).
    """

    query: jax.Array | None = None
    memory: jax.Array | None = None


def relative_distances(qlen: int, klen: int, direction: jax.Array, clamp_len: int) -> jax.Array:
    """[B, klen + qlen] float32: the relative distances klen, klen - 1, ..., -qlen + 1 that
    the sinusoid encodes, times each row's direction (+1, or -1 for a row read backwards),
    clipped to [-clamp_len, clamp_len] when clamp_len > 0 (as the original)."""
    distances = jnp.arange(klen, -qlen, -1, dtype=jnp.float32)[None, :] * direction[:, None].astype(
        jnp.float32
    )
    if clamp_len > 0:
        distances = jnp.clip(distances, -clamp_len, clamp_len)
    return distances


def sinusoid(distances: jax.Array, width: int) -> jax.Array:
    """[..., R] -> [..., R, width] float32: [sin(d / 10000^(2i/width)), cos(...)] (the halves
    concatenated, as the original's `positional_embedding`)."""
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, width, 2, dtype=jnp.float32) / width))
    angles = distances[..., None] * inv_freq
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def relative_shift(scores: jax.Array, klen: int) -> jax.Array:
    """Transformer-XL's shift: [B, N, L, klen + L] scores against every relative distance ->
    [B, N, L, klen], entry (i, j) the score against distance (M + i) - j, i.e. column
    L - i + j of the input (M = klen - L memory positions). A reshape, no gather."""
    b, n, qlen, r = scores.shape
    shifted = scores.reshape(b, n, r, qlen)[:, :, 1:, :].reshape(b, n, qlen, r - 1)
    return shifted[..., :klen]


def relative_gather(scores: jax.Array, positions: jax.Array, qlen: int, klen: int) -> jax.Array:
    """The shift for queries at arbitrary positions: [B, N, P, klen + qlen] scores of the
    queries at `positions` [B, P] int32 -> [B, N, P, klen], entry (m, j) = column
    qlen - positions[m] + j (what `relative_shift` takes for a query at that position)."""
    columns = qlen - positions[:, None, :, None] + jnp.arange(klen)[None, None, None, :]
    return jnp.take_along_axis(scores, columns, axis=-1)


class RelativeAttention(nn.Module):
    """One layer's relative multi-head attention, applied to either stream.

    Parameters: query, key, value, relative [H, N, D] and output [N, D, H] (no biases),
    r_w, r_r, r_s [N, D], seg_embed [2, N, D] (index 0: same segment, 1: different).
    """

    config: EncoderConfig

    def setup(self):
        cfg = self.config
        self.query = heads_in(cfg, "query", use_bias=False)
        self.key = heads_in(cfg, "key", use_bias=False)
        self.value = heads_in(cfg, "value", use_bias=False)
        self.relative = heads_in(cfg, "relative", use_bias=False)
        self.output = heads_out(cfg, use_bias=False)
        vector = kernel_init(cfg, (axes.HEADS, axes.KV))
        shape = (cfg.num_heads, cfg.head_dim)
        self.r_w = self.param("r_w", vector, shape, cfg.storage_dtype)
        self.r_r = self.param("r_r", vector, shape, cfg.storage_dtype)
        self.r_s = self.param("r_s", vector, shape, cfg.storage_dtype)
        self.seg_embed = self.param(
            "seg_embed", kernel_init(cfg, (None, axes.HEADS, axes.KV)), (2, *shape), cfg.storage_dtype
        )

    def keys(self, context: jax.Array, position_embeddings: jax.Array) -> tuple[jax.Array, ...]:
        """(k, v, k_r): [B, K, N, D] of the context [B, K, H] (memory then the content stream)
        and [B, R, N, D] of the relative position embeddings [B, R, H]."""
        return self.key(context), self.value(context), self.relative(position_embeddings)

    def __call__(
        self,
        x: jax.Array,
        keys: tuple[jax.Array, ...],
        positions: jax.Array | None,
        different_segment: jax.Array,
        visible: jax.Array,
        deterministic: bool,
        row_index: jax.Array | None = None,
    ) -> jax.Array:
        """The attention of queries x [B, Q, H] (compute dtype) over the context's keys.

        positions: [B, Q] int32, each query's position in the row (the query stream's
          targets), or None for the content stream (query i at position i: the reshape
          shift). different_segment: [B, Q, K] bool. visible: [B, Q, K] bool, True = may
          attend. Returns [B, Q, H] compute dtype (before the residual and LayerNorm).
        """
        cfg = self.config
        k, v, k_r = keys
        klen = k.shape[1]
        q = self.query(x).astype(jnp.float32)
        dot = lambda spec, a, b: matmul.einsum(  # noqa: E731
            spec, a, b, cfg.compute_dtype, accumulate_f32=cfg.accumulate_f32
        ).astype(jnp.float32)
        content = dot("bqnd,bknd->bnqk", q + self.r_w.astype(jnp.float32), k)
        by_distance = dot("bqnd,brnd->bnqr", q + self.r_r.astype(jnp.float32), k_r)
        if positions is None:
            position = relative_shift(by_distance, klen)
        else:
            position = relative_gather(by_distance, positions, k_r.shape[1] - klen, klen)
        segment = jnp.einsum(
            "bqnd,snd->bnqs", q + self.r_s.astype(jnp.float32), self.seg_embed.astype(jnp.float32)
        )
        segment = jnp.where(different_segment[:, None], segment[..., 1:2], segment[..., 0:1])
        scores = (content + position + segment) * jnp.float32(1.0 / np.sqrt(cfg.head_dim))
        scores = scores - _MASKED * (~visible[:, None]).astype(jnp.float32)
        probs = jax.nn.softmax(scores, axis=-1)
        probs = drop_probabilities(
            self, probs, cfg.attention_dropout_rate, cfg.dropout_bits, deterministic, row_index
        )
        attended = dot("bnqk,bknd->bqnd", probs, v).astype(cfg.compute_dtype)
        return self.output(attended)


class XLNetLayer(TransformerLayer):
    """A layer of both streams: relative attention (shared weights), then BERT's post-LN
    FFN block (`TransformerLayer.feed_forward`), each stream through the same modules."""

    def make_attention(self) -> nn.Module:
        return RelativeAttention(self.config)

    def setup(self):
        super().setup()
        cfg = self.config
        rate = cfg.xlnet.activation_dropout
        self.activation_dropout = Dropout(cfg.dropout_rate if rate is None else rate, bits=cfg.dropout_bits)

    def attend_stream(
        self,
        x: jax.Array,
        keys: tuple[jax.Array, ...],
        positions: jax.Array | None,
        different_segment: jax.Array,
        visible: jax.Array,
        deterministic: bool,
        row_index: jax.Array | None,
    ) -> jax.Array:
        """The attention block of one stream: x [B, Q, H] -> norm(x + dropout(attention))."""
        attended = self.attention(x, keys, positions, different_segment, visible, deterministic, row_index)
        attended = self.dropout(attended, deterministic=deterministic)
        return add_and_normalize(self.config, self.attention_layer_norm, x, attended)

    def feed_forward(self, x: jax.Array, deterministic: bool) -> jax.Array:
        """The FFN block, with the original's dropout after the activation as well as after
        the output (modeling.py `positionwise_ffn`: drop_1, drop_2), which BERT's lacks; the
        first at XLNetOptions.activation_dropout (the paper's "GeLU dropout")."""
        h = self.config.activation(self.intermediate(x))
        h = self.activation_dropout(h, deterministic=deterministic)
        h = self.dropout(self.output(h), deterministic=deterministic)
        return add_and_normalize(self.config, self.output_layer_norm, x, h)


class XLNetEncoder(nn.Module):
    """XLNet's encoder: `word_embeddings` and `layer_{i}` (XLNetLayer), both streams and
    memories (module docstring). `config.xlnet` holds mem_len, reuse_len and clamp_len.

    Called as BERT's encoder (models/backbone.py: fine-tuning, feature extraction, MLM), it
    runs the content stream alone with no memory, every real token visible: the original's
    fine-tuning model."""

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
        memory: jax.Array | None = None,
        visible: jax.Array | None = None,
        target_positions: jax.Array | None = None,
        query_visible: jax.Array | None = None,
        mask_embedding: jax.Array | None = None,
        direction: jax.Array | None = None,
        row_index: jax.Array | None = None,
    ) -> XLNetOutput:
        """Both streams over a batch of rows.

        Args:
          input_ids, segment_ids: [B, L] int32 (segments 0, 1, 2 in pretraining: A, B, <cls>;
            fine-tuning pads with another id).
          input_mask: [B, L] int32, 1 = real token (keys at 0 are hidden).
          positions: ignored (BERT's encoder's argument): positions are relative.
          example_ids: packed rows, which XLNet's encoder does not take (an error).
          memory: [B, layers, M, H], the rows' memories (always visible, segment 0), or None
            (none read: the first segment, fine-tuning).
          visible: [B, L, L] bool, query i may attend to key j by the permutation (the
            content stream also always sees itself); None = every real token.
          target_positions: [B, P] int32, the query stream's targets; None = no query stream.
          query_visible: [B, P, L] bool, what each target's query may attend to (its
            permutation row, itself hidden); required with target_positions.
          mask_embedding: [H], the query stream's start (the pretraining head's `mask_emb`).
          direction: [B] int32, +1 (forward) or -1 (a row read backwards); None = forward.
          row_index: [B] int32, the rows' places in the global batch (attention dropout).
        """
        cfg = self.config
        opts = cfg.xlnet
        batch, length = input_ids.shape
        if example_ids is not None:
            raise ConfigError(
                "XLNet's encoder does not take packed rows (example_ids): use a PipelineConfig "
                "format without packing"
            )
        if direction is None:
            direction = jnp.ones((batch,), jnp.int32)
        table = self.param(
            "word_embeddings",
            nn.with_logical_partitioning(real_rows_init(cfg), (axes.VOCAB, axes.EMBED)),
            (cfg.padded_vocab_size, cfg.hidden_size),
            cfg.storage_dtype,
        )
        drop = hidden_dropout(cfg)
        h = drop(jnp.take(table, input_ids, axis=0).astype(cfg.compute_dtype), deterministic=deterministic)
        h = constrain_hidden(h)
        mem_len = memory.shape[2] if memory is not None else 0
        klen = mem_len + length
        distances = relative_distances(length, klen, direction, opts.clamp_len)
        positions = drop(
            sinusoid(distances, cfg.hidden_size).astype(cfg.compute_dtype), deterministic=deterministic
        )

        # Keys: the memory (segment 0, always visible), then the row (its real tokens).
        key_segments = jnp.concatenate([jnp.zeros((batch, mem_len), segment_ids.dtype), segment_ids], axis=1)
        key_real = jnp.concatenate([jnp.ones((batch, mem_len), bool), input_mask.astype(bool)], axis=1)
        if visible is None:
            visible = jnp.ones((batch, length, length), bool)
        on_memory = jnp.ones((batch, length, mem_len), bool)
        # Every position sees itself, padding included (as the original: its padding mask and
        # permutation mask are summed, then the diagonal opened), so no content row is empty.
        content_visible = jnp.concatenate([on_memory, visible], axis=-1) & key_real[:, None, :]
        content_visible |= jnp.eye(length, klen, mem_len, dtype=bool)[None]
        content_segments = segment_ids[:, :, None] != key_segments[:, None, :]

        g = None
        if target_positions is not None:
            num_targets = target_positions.shape[1]
            g = jnp.broadcast_to(
                mask_embedding.astype(cfg.compute_dtype), (batch, num_targets, cfg.hidden_size)
            )
            g = drop(g, deterministic=deterministic)
            query_visible = jnp.concatenate([on_memory[:, :num_targets], query_visible], axis=-1)
            query_visible &= key_real[:, None, :]
            target_segments = jnp.take_along_axis(segment_ids, target_positions, axis=1)
            query_segments = target_segments[:, :, None] != key_segments[:, None, :]

        new_memory = []
        for i in range(cfg.num_layers):
            layer = XLNetLayer(cfg, name=f"layer_{i}")
            layer_memory = memory[:, i].astype(h.dtype) if memory is not None else h[:, :0]
            if opts.mem_len > 0:
                cached = h[:, : opts.reuse_len] if opts.reuse_len > 0 else h
                cached = jnp.concatenate([layer_memory, cached], axis=1)
                new_memory.append(jax.lax.stop_gradient(cached[:, -opts.mem_len :]))
            context = jnp.concatenate([layer_memory, h], axis=1)
            keys = layer.attention.keys(context, positions)
            h_next = layer.attend_stream(
                h, keys, None, content_segments, content_visible, deterministic, row_index
            )
            if g is not None:
                g = layer.attend_stream(
                    g, keys, target_positions, query_segments, query_visible, deterministic, row_index
                )
                g = layer.feed_forward(g, deterministic)
            h = layer.feed_forward(constrain_hidden(h_next), deterministic)
        memory_out = None
        if new_memory:
            memory_out = jnp.stack(new_memory, axis=1)
            if memory is not None:
                memory_out = memory_out.astype(memory.dtype)
        h = drop(h, deterministic=deterministic)
        if g is not None:
            g = drop(g, deterministic=deterministic)
        return XLNetOutput(
            sequence_output=h, pooled_output=None, word_embeddings=table, query=g, memory=memory_out
        )


class PLMHead(nn.Module):
    """`plm_head`: the query stream's start `mask_emb` [H] and the LM output bias [V]."""

    config: EncoderConfig

    def setup(self):
        cfg = self.config
        self.mask_emb = self.param(
            "mask_emb", kernel_init(cfg, (axes.EMBED,)), (cfg.hidden_size,), cfg.storage_dtype
        )
        self.output_bias = self.param(
            "output_bias",
            nn.with_logical_partitioning(nn.initializers.zeros_init(), (axes.VOCAB,)),
            (cfg.padded_vocab_size,),
            cfg.storage_dtype,
        )

    def start(self) -> jax.Array:
        """[H]: what the query stream starts from at every target."""
        return self.mask_emb

    def logits(self, query: jax.Array, table: jax.Array) -> jax.Array:
        """[B, P, H] query stream -> [B, P, vocab_size] float32 logits through the tied word
        table [V_padded, H] plus the bias (padding rows sliced off)."""
        cfg = self.config
        logits = matmul.einsum(
            "bph,vh->bpv", query, table, cfg.compute_dtype, accumulate_f32=cfg.accumulate_f32
        )
        logits = logits.astype(jnp.float32) + self.output_bias.astype(jnp.float32)
        return logits[..., : cfg.vocab_size]


class PermutationLMModel(nn.Module):
    """XLNet's pretraining model: `encoder` (XLNetEncoder) and `plm_head` (PLMHead); the
    LM's weights are the word table (tied), with no transform before it (modeling.py
    `lm_loss`)."""

    config: EncoderConfig

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,
        segment_ids: jax.Array,
        input_mask: jax.Array,
        target_positions: jax.Array,
        visible: jax.Array,
        query_visible: jax.Array,
        *,
        deterministic: bool,
        memory: jax.Array | None = None,
        direction: jax.Array | None = None,
        row_index: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array | None]:
        """(logits [B, P, vocab_size] float32 at the targets, the new memory or None):
        arguments as XLNetEncoder's."""
        head = PLMHead(self.config, name="plm_head")
        encoder = XLNetEncoder(self.config, name="encoder")
        out = encoder(
            input_ids,
            input_mask,
            segment_ids,
            deterministic=deterministic,
            memory=memory,
            visible=visible,
            target_positions=target_positions,
            query_visible=query_visible,
            mask_embedding=head.start(),
            direction=direction,
            row_index=row_index,
        )
        return head.logits(out.query, out.word_embeddings), out.memory


def _summary_features(cfg: EncoderConfig, encoded: EncoderOutput, dropout: Dropout, deterministic: bool):
    last = encoded.sequence_output[:, -1]
    return jnp.tanh(dense(cfg, cfg.hidden_size, (axes.EMBED, axes.MLP), name="classifier_dense")(last))


#: XLNet's sequence summary (modeling.py `summarize_sequence`, summary_type "last",
#: use_proj; transformers' SequenceSummary): the last position, where `<cls>` sits in a
#: left-padded row -> dense H -> tanh -> dropout -> classifier. No dropout before the dense.
CLASSIFIER_HEAD = ClassifierHead(_summary_features)


def abstract_params(config: EncoderConfig) -> Any:
    """PermutationLMModel's parameter tree (`encoder`, `plm_head`) as ShapeDtypeStructs in
    their partitioning boxes; allocates nothing."""
    ids = jnp.zeros((1, 4), jnp.int32)
    variables = jax.eval_shape(
        lambda: PermutationLMModel(config).init(
            jax.random.key(0),
            ids,
            ids,
            ids,
            ids[:, :2],
            jnp.ones((1, 4, 4), bool),
            jnp.ones((1, 2, 4), bool),
            deterministic=True,
        )
    )
    return variables["params"]


class FillMaskModel(nn.Module):
    """Fill-mask through the query stream (`interop.predict`): each mask is predicted from
    every token that is not a mask, and from no other mask (the masks come last in the
    factorization order, none before another): the parameters `encoder` and `plm_head` of
    the pretraining tree, called as models/trees.py `masked_lm`'s modules are."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool) -> dict[str, jax.Array]:
        """batch: int32 input_ids, input_mask, segment_ids [B, L], masked_lm_positions [B, P],
        and masked_lm_weights [B, P] (0 for a padded slot; default all 1). Returns
        {"mlm_logits": [B, P, vocab_size] float32}."""
        positions = batch["masked_lm_positions"]
        weights = batch.get("masked_lm_weights", jnp.ones(positions.shape, jnp.float32))
        batch_size, length = batch["input_ids"].shape
        rows = jnp.arange(batch_size)[:, None]
        is_target = jnp.zeros((batch_size, length), bool).at[rows, positions].max(weights > 0)
        visible = jnp.broadcast_to(~is_target[:, None, :], (batch_size, length, length))
        head = PLMHead(self.config, name="plm_head")
        out = XLNetEncoder(self.config, name="encoder")(
            batch["input_ids"],
            batch["input_mask"],
            batch["segment_ids"],
            deterministic=deterministic,
            visible=visible,
            target_positions=positions,
            query_visible=jnp.take_along_axis(visible, positions[:, :, None], axis=1),
            mask_embedding=head.start(),
        )
        return {"mlm_logits": head.logits(out.query, out.word_embeddings)}


def masked_lm(config: EncoderConfig, params: Any) -> tuple[nn.Module, dict[str, Any]] | None:
    """models/trees.py `masked_lm` for XLNet's trees: (FillMaskModel, {encoder, plm_head});
    None for another family's config, and for an XLNet encoder trained with BERT's MLM head
    (`XLNetMLM`), which BERT's masked LM reads."""
    if config.xlnet is None or "mlm_head" in params:
        return None
    if "plm_head" not in params:
        raise NoMaskedLMError(
            "the workdir has no PLM head (it was imported from XLNetModel): fill-mask needs the query "
            "stream's start and LM bias of an XLNetLMHeadModel"
        )
    return FillMaskModel(config), {"encoder": params["encoder"], "plm_head": params["plm_head"]}
