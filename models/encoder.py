"""BERT encoder: embeddings, post-LN Transformer layers and the pooler (Flax linen).

Shapes use B = batch, L = length, H = hidden_size, N = num_heads,
D = H / N (head width), F = intermediate_size, V = vocab_size.

Parameter tree of `Encoder` (names chosen to map one-to-one onto the published
BERT checkpoints; q/k/v kernels are stored as [H, N, D], i.e. TF's [H, H] reshaped):

    embeddings/{word_embeddings, position_embeddings, token_type_embeddings}/embedding
    embeddings/layer_norm/{scale, bias}
    layer_{i}/attention/{query, key, value, output}/{kernel, bias}
    layer_{i}/attention_layer_norm/{scale, bias}
    layer_{i}/{intermediate, output}/{kernel, bias}
    layer_{i}/output_layer_norm/{scale, bias}
    pooler/{kernel, bias}

Every parameter carries logical axis names (models/axes.py); compute happens in
`config.dtype`, storage in `config.param_dtype`, and LayerNorm statistics and the
attention softmax are always float32.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import flax.linen as nn
import flax.struct
import gin
import jax
import jax.numpy as jnp
import numpy as np

from models import axes

_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    # HF configs' "gelu" is the exact erf form; google-research/bert used the tanh form.
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
}
_DTYPES = ("float32", "bfloat16", "float16")
_ATTENTION_IMPLEMENTATIONS = (None, "xla", "cudnn")
# What the backward pass may keep from the forward pass of each layer (the rest is
# recomputed): "none" keeps everything (no remat), "full" keeps only the layer inputs,
# "dots_saveable" keeps matmul outputs and recomputes the cheap elementwise work.
_REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# The value jax.nn.dot_product_attention's XLA path gives masked logits, so both
# attention paths below agree exactly; finite, so fully padded rows give no NaN.
_MASKED_LOGIT = -0.7 * float(jnp.finfo(jnp.float32).max)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Hyperparameters of a BERT-style encoder; the single gin touchpoint of models/.

    Passed whole to every module (hashable, immutable). Defaults are BERT-base.
    Attributes:
      dropout_rate: hidden dropout (embeddings, attention output, FFN output).
      attention_dropout_rate: dropout on the attention probabilities.
      hidden_act: "gelu" (exact erf GELU, HF "gelu") or "gelu_tanh" (the tanh
        approximation of google-research/bert modeling.py).
      initializer_range: stddev of the truncated normal for kernels and embeddings.
      dtype: compute dtype ("float32", "bfloat16", "float16").
      param_dtype: storage dtype of the parameters.
      attention_implementation: `implementation` of jax.nn.dot_product_attention
        (None = let JAX choose, "xla", "cudnn"); unused while attention dropout is
        active in training (see `explicit_attention`).
      remat_policy: rematerialisation of each layer in the backward pass: "none",
        "full" or "dots_saveable" (memory at length 512 / large models vs ~30% compute).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_implementation: str | None = None
    remat_policy: str = "none"

    def __post_init__(self):
        def fail(name: str, requirement: str) -> None:
            raise ValueError(f"EncoderConfig.{name} must be {requirement}, got {getattr(self, name)!r}")

        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            if getattr(self, name) < 1:
                fail(name, ">= 1")
        if self.hidden_size % self.num_heads:
            fail("hidden_size", f"divisible by num_heads ({self.num_heads})")
        for name in ("dropout_rate", "attention_dropout_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                fail(name, "in [0, 1)")
        if self.hidden_act not in _ACTIVATIONS:
            fail("hidden_act", f"one of {sorted(_ACTIVATIONS)}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                fail(name, f"one of {_DTYPES}")
        if self.attention_implementation not in _ATTENTION_IMPLEMENTATIONS:
            fail("attention_implementation", f"one of {_ATTENTION_IMPLEMENTATIONS}")
        if self.remat_policy not in _REMAT_POLICIES:
            fail("remat_policy", f"one of {sorted(_REMAT_POLICIES)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def storage_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    def activation(self, x: jax.Array) -> jax.Array:
        return _ACTIVATIONS[self.hidden_act](x)


# --- initialisers and building blocks shared with models/heads.py ---------------


def kernel_init(config: EncoderConfig, names: Sequence[str | None]) -> nn.initializers.Initializer:
    """BERT's truncated normal (stddev initializer_range) with logical axis names."""
    return nn.with_logical_partitioning(
        nn.initializers.truncated_normal(config.initializer_range), tuple(names)
    )


def bias_init(names: Sequence[str | None]) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(names))


def dense(
    config: EncoderConfig, features: int, names: tuple[str | None, str | None], *, name: str
) -> nn.Dense:
    """Dense layer [..., in] -> [..., features] in compute dtype; kernel axes `names`."""
    return nn.Dense(
        features,
        dtype=config.compute_dtype,
        param_dtype=config.storage_dtype,
        kernel_init=kernel_init(config, names),
        bias_init=bias_init(names[1:]),
        name=name,
    )


def layer_norm(config: EncoderConfig, *, name: str) -> nn.LayerNorm:
    """LayerNorm over H computing in float32 (callers cast the result back)."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=jnp.float32,
        param_dtype=config.storage_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), (axes.EMBED,)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (axes.EMBED,)),
        name=name,
    )


def _add_and_normalize(
    config: EncoderConfig, residual: jax.Array, update: jax.Array, *, name: str
) -> jax.Array:
    """Post-LN residual: LayerNorm(residual + update), [B, L, H] compute dtype.

    The sum is taken in float32 because the LayerNorm reads float32 anyway (an
    elementwise cast that XLA fuses into the normalisation).
    """
    x = residual.astype(jnp.float32) + update.astype(jnp.float32)
    return layer_norm(config, name=name)(x).astype(config.compute_dtype)


def _constrain_hidden(x: jax.Array) -> jax.Array:
    return nn.with_logical_constraint(x, (axes.BATCH, axes.LENGTH, axes.EMBED))


# --- attention -------------------------------------------------------------------


def attention_mask(input_mask: jax.Array, example_ids: jax.Array | None = None) -> jax.Array:
    """Which keys each query may attend to.

    Args:
      input_mask: [B, L] int, 1 for real tokens, 0 for padding.
      example_ids: optional [B, L] int, the packed example of each token (1..k,
        0 = pad); tokens then attend only within their own example.
    Returns:
      [B, 1, 1, L] bool without packing, [B, 1, L, L] bool with it (broadcast over heads).
    """
    mask = input_mask.astype(bool)[:, None, None, :]
    if example_ids is not None:
        mask = mask & (example_ids[:, None, :, None] == example_ids[:, None, None, :])
    return mask


def explicit_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
) -> jax.Array:
    """Softmax attention written out step by step, with dropout on the probabilities.

    BERT drops attention probabilities in training, and jax.nn.dot_product_attention
    has no dropout, so training with attention_dropout_rate > 0 takes this path. It
    mirrors that function's XLA path (float32 logits and softmax, the same masked
    value), so without dropout the two agree.

    Args:
      query, key, value: [B, L, N, D] compute dtype.
      mask: bool, broadcastable to [B, N, L, L]; True = may attend.
      dropout_rate: probability of dropping an attention probability.
      dropout_rng: PRNG key for the dropout; None = no dropout.
    Returns:
      [B, L, N, D] in value's dtype.
    """
    scale = jnp.float32(1.0 / np.sqrt(query.shape[-1]))
    logits = jnp.einsum("btnd,bsnd->bnts", query, key, preferred_element_type=jnp.float32) * scale
    probs = jax.nn.softmax(jnp.where(mask, logits, _MASKED_LOGIT), axis=-1)
    if dropout_rng is not None and dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    return jnp.einsum("bnts,bsnd->btnd", probs.astype(value.dtype), value)


class SelfAttention(nn.Module):
    """Multi-head self-attention: q/k/v projections, attention, output projection."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, *, deterministic: bool) -> jax.Array:
        """x: [B, L, H] compute dtype; mask: from `attention_mask`. Returns [B, L, H] compute dtype."""
        cfg = self.config
        heads_axes = (axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV)

        # nn.Einsum, not nn.DenseGeneral: DenseGeneral initialises a flattened 2-D
        # kernel and reshapes it, which applies our 3-D logical axes to a 2-D array
        # and fails under a mesh.
        def project(name: str) -> jax.Array:
            y = nn.Einsum(
                (cfg.hidden_size, cfg.num_heads, cfg.head_dim),
                "blh,hnd->blnd",
                dtype=cfg.compute_dtype,
                param_dtype=cfg.storage_dtype,
                kernel_init=kernel_init(cfg, (axes.EMBED, axes.HEADS, axes.KV)),
                bias_init=bias_init((axes.HEADS, axes.KV)),
                name=name,
            )(x)
            return nn.with_logical_constraint(y, heads_axes)

        query, key, value = project("query"), project("key"), project("value")
        if deterministic or cfg.attention_dropout_rate == 0.0:
            if cfg.attention_implementation == "cudnn":
                # cuDNN's fused kernel takes a mask only at its full [B, 1, L, L] shape.
                length = query.shape[1]
                mask = jnp.broadcast_to(mask, (mask.shape[0], 1, length, length))
            context = jax.nn.dot_product_attention(
                query, key, value, mask=mask, implementation=cfg.attention_implementation
            )
        else:
            context = explicit_attention(
                query,
                key,
                value,
                mask,
                dropout_rate=cfg.attention_dropout_rate,
                dropout_rng=self.make_rng("dropout"),
            )
        context = nn.with_logical_constraint(context, heads_axes)
        return nn.Einsum(
            (cfg.num_heads, cfg.head_dim, cfg.hidden_size),
            "blnd,ndh->blh",
            dtype=cfg.compute_dtype,
            param_dtype=cfg.storage_dtype,
            kernel_init=kernel_init(cfg, (axes.HEADS, axes.KV, axes.EMBED)),
            bias_init=bias_init((axes.EMBED,)),
            name="output",
        )(context)


# --- embeddings, layers, encoder -------------------------------------------------


class Embeddings(nn.Module):
    """Word + learned absolute position + token type embeddings, LayerNorm, dropout."""

    config: EncoderConfig

    @nn.compact
    def __call__(
        self, input_ids: jax.Array, segment_ids: jax.Array, positions: jax.Array, *, deterministic: bool
    ) -> tuple[jax.Array, jax.Array]:
        """input_ids, segment_ids, positions: [B, L] int32.

        Returns:
          embeddings [B, L, H] compute dtype, and the word embedding table
          [V, H] param dtype (for the tied MLM decoder).
        """
        cfg = self.config

        def table(num: int, first_axis: str | None, name: str) -> nn.Embed:
            # Lookups are gathers (no FLOPs); they read float32 because the sum
            # feeds a float32 LayerNorm.
            return nn.Embed(
                num,
                cfg.hidden_size,
                dtype=jnp.float32,
                param_dtype=cfg.storage_dtype,
                embedding_init=kernel_init(cfg, (first_axis, axes.EMBED)),
                name=name,
            )

        word_embeddings = table(cfg.vocab_size, axes.VOCAB, "word_embeddings")
        x = (
            word_embeddings(input_ids)
            + table(cfg.max_position_embeddings, None, "position_embeddings")(positions)
            + table(cfg.type_vocab_size, None, "token_type_embeddings")(segment_ids)
        )
        x = layer_norm(cfg, name="layer_norm")(x).astype(cfg.compute_dtype)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        return _constrain_hidden(x), word_embeddings.embedding


class TransformerLayer(nn.Module):
    """Post-LN layer: attention -> add & LN -> FFN (H -> F -> H) -> add & LN."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool) -> jax.Array:
        """x: [B, L, H] compute dtype; mask: from `attention_mask`. Returns [B, L, H] compute dtype.

        `deterministic` is positional so that nn.remat can mark it static.
        """
        cfg = self.config
        dropout = nn.Dropout(cfg.dropout_rate)
        attended = SelfAttention(cfg, name="attention")(x, mask, deterministic=deterministic)
        attended = dropout(attended, deterministic=deterministic)
        x = _constrain_hidden(_add_and_normalize(cfg, x, attended, name="attention_layer_norm"))

        h = dense(cfg, cfg.intermediate_size, (axes.EMBED, axes.MLP), name="intermediate")(x)
        h = nn.with_logical_constraint(cfg.activation(h), (axes.BATCH, axes.LENGTH, axes.MLP))
        h = dense(cfg, cfg.hidden_size, (axes.MLP, axes.EMBED), name="output")(h)
        h = dropout(h, deterministic=deterministic)
        return _constrain_hidden(_add_and_normalize(cfg, x, h, name="output_layer_norm"))


@flax.struct.dataclass
class EncoderOutput:
    """What `Encoder` returns.

    Attributes:
      sequence_output: [B, L, H] compute dtype, the last layer's hidden states.
      pooled_output: [B, H] compute dtype, tanh(dense(first token)).
      word_embeddings: [V, H] param dtype, the token table (the tied MLM decoder).
    """

    sequence_output: jax.Array
    pooled_output: jax.Array
    word_embeddings: jax.Array


class Encoder(nn.Module):
    """Embeddings, `num_layers` Transformer layers and the pooler."""

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
    ) -> EncoderOutput:
        """Encodes a batch.

        Args:
          input_ids, input_mask, segment_ids: [B, L] int32 (input_mask 1 = real token).
          positions: [B, L] int32 position ids; default 0..L-1 in every row.
          example_ids: [B, L] int32 packed-example ids (0 = pad), or None without packing.
          deterministic: False in training: enables dropout (rng collection "dropout").
        """
        cfg = self.config
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)
        x, word_embeddings = Embeddings(cfg, name="embeddings")(
            input_ids, segment_ids, positions, deterministic=deterministic
        )
        mask = attention_mask(input_mask, example_ids)
        layer = TransformerLayer
        if cfg.remat_policy != "none":
            # Argument 3 (self, x, mask, deterministic) is a Python bool: static.
            layer = nn.remat(TransformerLayer, policy=_REMAT_POLICIES[cfg.remat_policy], static_argnums=(3,))
        for i in range(cfg.num_layers):
            x = layer(cfg, name=f"layer_{i}")(x, mask, deterministic)
        pooled = jnp.tanh(dense(cfg, cfg.hidden_size, (axes.EMBED, axes.MLP), name="pooler")(x[:, 0]))
        return EncoderOutput(sequence_output=x, pooled_output=pooled, word_embeddings=word_embeddings)
