"""BERT-family encoder: embeddings, post-LN Transformer layers and the pooler (Flax linen).

One module covers BERT, RoBERTa (`position_offset`, one token type) and ALBERT
(factorized embedding `embedding_size`, cross-layer `sharing`).

Shapes use B = batch, L = length, H = hidden_size, N = num_heads,
D = H / N (head width), F = intermediate_size, V = vocab_size,
E = embedding width (`embedding_size`, H unless ALBERT factorizes it).

Parameter tree of `Encoder` (names chosen to map one-to-one onto the published
checkpoints; q/k/v kernels are stored as [H, N, D], i.e. TF's [H, H] reshaped):

    embeddings/{word_embeddings, position_embeddings, token_type_embeddings}/embedding   [*, E]
    embeddings/layer_norm/{scale, bias}                                                  [E]
    embedding_projection/{kernel, bias}      [E, H], [H]; only when E != H (ALBERT's
                                             embedding_hidden_mapping_in)
    <layer>/attention/{query, key, value, output}/{kernel, bias}
    <layer>/attention_layer_norm/{scale, bias}
    <layer>/{intermediate, output}/{kernel, bias}
    <layer>/output_layer_norm/{scale, bias}
    pooler/{kernel, bias}

where <layer> depends on `EncoderConfig.sharing` (one parameter set per name):

    "none"       layer_0 .. layer_{n-1}, each with all of the above (BERT, RoBERTa)
    "all"        shared_layer, applied num_layers times (ALBERT's default)
    "attention"  shared_attention/{attention, attention_layer_norm} used by every layer,
                 layer_{i}/{intermediate, output, output_layer_norm} per layer
    "ffn"        shared_ffn/{intermediate, output, output_layer_norm} used by every layer,
                 layer_{i}/{attention, attention_layer_norm} per layer

A sub-block's post-LayerNorm belongs to the sub-block (the attention block is
attention + dropout + add & LayerNorm; the FFN block likewise), as in HF's
AlbertAttention, which owns its LayerNorm.

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

from core import axes
from core.errors import ConfigError
from models import matmul
from models.attention import (
    ATTENTION_DROPOUT,
    IMPLEMENTATIONS,
    KeyMask,
    attend,
    attention_dropout_key,
    choose,
    log_choice,
)
from models.attention import platform as attention_platform
from models.disentangled import DisentangledConfig
from models.dropout import DROPOUT_BITS, Dropout
from models.flash_attention import BlockSizes
from models.xlnet_options import XLNetOptions

_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    # HF configs' "gelu" is the exact erf form. google-research/bert's modeling.py used erf
    # when BERT's checkpoints were trained and released (2018) and switched to the tanh
    # approximation later; google-research/albert's modeling.py has the tanh form (HF albert
    # configs say "gelu_new"). interop/convert/ imports each TF config accordingly.
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
}
_DTYPES = ("float32", "bfloat16", "float16")
_MATMUL_ACCUMULATIONS = ("float32", "compute")
# Cross-layer parameter sharing (ALBERT, arXiv 1909.11942 Table 4): which sub-blocks
# all layers share. See the module docstring for the parameter trees.
SHARING_MODES = ("none", "all", "attention", "ffn")
# What the backward pass may keep from the forward pass of each layer (the rest is
# recomputed): "none" keeps everything (no remat), "full" keeps only the layer inputs,
# "dots_saveable" keeps matmul outputs and recomputes the cheap elementwise work.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


# EncoderConfig's fields that say how the model is computed, not what it is: a pretraining
# run may resume with other values of these (pretrain/launches.py), every other field
# changes what its checkpoints mean.
COMPUTE_FIELDS = frozenset(
    {"dtype", "attention_implementation", "matmul_accumulation", "remat_policy", "dropout_bits"}
)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Hyperparameters of a BERT-style encoder; the single gin touchpoint of models/.

    Passed whole to every module (hashable, immutable). Defaults are BERT-base.
    Attributes:
      dropout_rate: hidden dropout (embeddings, attention output, FFN output).
      attention_dropout_rate: dropout on the attention probabilities.
      dropout_bits: random bits per element of a dropout mask: 16 (default; four
        elements per threefry block, models/dropout.py) or 32 (flax's nn.Dropout, a
        float32 uniform per element), kept to measure what 16 buys (`bench.pretrain
        --without=dropout_bits`).
      hidden_act: "gelu" (exact erf GELU: HF "gelu", the released BERT checkpoints) or
        "gelu_tanh" (the tanh approximation: ALBERT, HF "gelu_new").
      initializer_range: stddev of the truncated normal for kernels and embeddings.
      dtype: compute dtype ("float32", "bfloat16", "float16").
      param_dtype: storage dtype of the parameters.
      attention_implementation: the attention path, one of models/attention.py's
        IMPLEMENTATIONS: "auto" (cuDNN flash attention on GPU, splash on TPU, where they
        apply; else XLA's), "explicit", "xla", "cudnn", "splash" or "flash" (our Pallas
        kernel, with attention dropout: opt-in). Training with attention dropout takes
        "explicit" unless "flash" is set; both draw the same masks. DeBERTa's
        disentangled attention has its own path and takes "auto" only.
      flash_block_sizes: the "flash" kernel's tiles (models/flash_attention.py
        `BlockSizes`, gin `@BlockSizes()`); None = its defaults. The masks do not depend
        on them.
      matmul_accumulation: "float32" (default): every matmul takes its operands in the
        compute dtype and accumulates in float32, forward and backward (models/matmul.py);
        "compute": the product in the compute dtype (flax's nn.Dense in bf16), kept to
        measure what float32 accumulation buys (`bench.pretrain --without`). The same
        thing in float32 compute.
      remat_policy: rematerialisation of each layer in the backward pass: "none",
        "full" or "dots_saveable" (memory at length 512 / large models vs ~30% compute).
        With sharing "attention" or "ffn" each sub-block is rematerialised separately.
      scan_layers: run the layers as one `lax.scan` (MaxText's scan_layers): XLA compiles
        one layer instead of num_layers (compile time of 24-layer models); the parameter
        tree is unchanged (Encoder._scanned_layers). Sharing "none" or "all" only.
      embedding_size: E, the width of the embedding tables (ALBERT: 128). None or
        hidden_size = no factorization. Otherwise the embeddings (after their LayerNorm
        and dropout) are projected E -> H, and the MLM head's transform outputs E so that
        its decoder is tied to the [V, E] table.
      sharing: cross-layer parameter sharing, one of SHARING_MODES ("none": BERT;
        "all": ALBERT). Sharing saves parameters, never FLOPs.
      position_offset: added to every position id before the position-embedding lookup.
        RoBERTa (fairseq, HF) numbers positions from padding_idx + 1 = 2, so its table
        has max_position_embeddings = 514 rows of which rows 0 and 1 are never read.
      pooler: the encoder ends with BERT's pooler (dense + tanh on the first token),
        which BERT's and ALBERT's classifiers read. RoBERTa has none (fairseq trains no
        pooler; its classifier brings a fresh dense layer). A pretraining model with a
        sentence objective (NSP/SOP) builds it whatever this says.
      classifier_head: the family's fine-tuning head, a name in models/classifier.py's
        `HEADS`: "pooler" (BERT, ALBERT: dropout -> dense on the pooled
        output) or "roberta" (fairseq's RobertaClassificationHead: dropout -> dense ->
        tanh -> dropout -> dense on the first token) or "electra" (google-research/electra
        classification_tasks.py: dropout -> dense on the first token's hidden state) or
        "deberta" (the original's ContextPooler: dense -> GELU on the first token ->
        dropout -> dense).
      vocab_pad_multiple: the word table and the MLM output bias get `padded_vocab_size`
        rows, vocab_size rounded up to this multiple (128 for TPU lanes / GPU tiles; 1 =
        none), so the [P, E] x [E, V] decoder matmul runs on aligned shapes. The extra
        rows are never looked up and their logits are sliced off, so outputs and loss
        are those of the unpadded model; exports and imports drop / add them.
      disentangled: DeBERTa's disentangled attention and its options
        (models/disentangled.py); None = BERT's absolute positions and attention. Set,
        `encoder_module` builds models/deberta.py's encoder from this same config.
      xlnet: XLNet's memory and relative-position options (models/xlnet_options.py); set,
        the model is XLNet's two-stream encoder (models/xlnet.py).
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
    dropout_bits: int = 16
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_implementation: str = "auto"
    flash_block_sizes: BlockSizes | None = None
    matmul_accumulation: str = "float32"
    remat_policy: str = "none"
    scan_layers: bool = False
    embedding_size: int | None = None
    sharing: str = "none"
    position_offset: int = 0
    vocab_pad_multiple: int = 1
    pooler: bool = True
    classifier_head: str = "pooler"
    disentangled: DisentangledConfig | None = None
    xlnet: XLNetOptions | None = None

    def __post_init__(self):
        for name, options in (
            ("disentangled", DisentangledConfig),
            ("xlnet", XLNetOptions),
            ("flash_block_sizes", BlockSizes),
        ):
            value = getattr(self, name)
            if isinstance(value, dict):  # as model_config.json stores it
                known = {field.name for field in dataclasses.fields(options)}
                if unknown := sorted(set(value) - known):
                    raise ConfigError(f"EncoderConfig.{name} has fields this code does not know: {unknown}")
                object.__setattr__(self, name, options(**value))

        def fail(name: str, requirement: str) -> None:
            raise ConfigError(f"EncoderConfig.{name} must be {requirement}, got {getattr(self, name)!r}")

        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "max_position_embeddings",
            "vocab_pad_multiple",
        ):
            if getattr(self, name) < 1:
                fail(name, ">= 1")
        if self.type_vocab_size < 0:
            fail("type_vocab_size", ">= 0 (0 = no token type table)")
        if self.hidden_size % self.num_heads:
            fail("hidden_size", f"divisible by num_heads ({self.num_heads})")
        for name in ("dropout_rate", "attention_dropout_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                fail(name, "in [0, 1)")
        if self.dropout_bits not in DROPOUT_BITS:
            fail("dropout_bits", f"one of {DROPOUT_BITS}")
        if self.hidden_act not in _ACTIVATIONS:
            fail("hidden_act", f"one of {sorted(_ACTIVATIONS)}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                fail(name, f"one of {_DTYPES}")
        if self.attention_implementation is None:  # model_config.json files written before 'auto'
            object.__setattr__(self, "attention_implementation", "auto")
        if self.attention_implementation not in IMPLEMENTATIONS:
            fail("attention_implementation", f"one of {IMPLEMENTATIONS}")
        if self.matmul_accumulation not in _MATMUL_ACCUMULATIONS:
            fail("matmul_accumulation", f"one of {_MATMUL_ACCUMULATIONS}")
        if self.remat_policy not in REMAT_POLICIES:
            fail("remat_policy", f"one of {sorted(REMAT_POLICIES)}")
        if self.embedding_size is not None and self.embedding_size < 1:
            fail("embedding_size", ">= 1 (or None for embedding_size = hidden_size)")
        if self.sharing not in SHARING_MODES:
            fail("sharing", f"one of {SHARING_MODES}")
        if self.scan_layers and self.sharing not in ("none", "all"):
            raise ConfigError(
                f"EncoderConfig.scan_layers is not implemented for sharing={self.sharing!r}: "
                "use sharing 'none' or 'all', or scan_layers=False"
            )
        if not 0 <= self.position_offset < self.max_position_embeddings:
            fail("position_offset", f"in [0, max_position_embeddings={self.max_position_embeddings})")
        # The heads live in the families' modules, which build on this one: looked up at
        # construction, when every module is loaded.
        from models.classifier import HEADS

        if self.classifier_head not in HEADS:
            fail("classifier_head", f"one of {tuple(HEADS)}")
        if self.disentangled is not None and self.xlnet is not None:
            raise ConfigError(
                "EncoderConfig.disentangled and EncoderConfig.xlnet are both set: choose one encoder"
            )
        for family, options in (("DeBERTa", "disentangled"), ("XLNet", "xlnet")):
            if getattr(self, options) is None:
                continue
            settings = (("sharing", "none"), ("scan_layers", False), ("position_offset", 0))
            for name, bert_only in (*settings, ("attention_implementation", "auto")):
                if getattr(self, name) != bert_only:
                    raise ConfigError(
                        f"EncoderConfig.{name}={getattr(self, name)!r} is not implemented for {family} "
                        f"(EncoderConfig.{options} is set): use {bert_only!r}"
                    )
        if self.xlnet is not None:
            if self.pooler:
                raise ConfigError(
                    "EncoderConfig.pooler is True, but XLNet's encoder has no pooler: set "
                    "EncoderConfig.pooler = False and a classifier head that reads none "
                    "(EncoderConfig.classifier_head = 'xlnet', its summary of the last position)"
                )
            opts = self.xlnet
            rate = 0.0 if opts.activation_dropout is None else opts.activation_dropout
            if opts.mem_len < 0 or opts.reuse_len < 0 or opts.clamp_len < -1 or not 0 <= rate < 1:
                raise ConfigError(
                    "XLNetOptions needs mem_len >= 0, reuse_len >= 0, clamp_len >= -1 and 0 <= "
                    f"activation_dropout < 1, got {opts}"
                )
        if self.disentangled is not None:
            opts = self.disentangled
            reach, half = opts.max_relative(self.max_position_embeddings), opts.position_buckets // 2
            if opts.position_buckets and reach <= half + 1:
                raise ConfigError(
                    f"DisentangledConfig.position_buckets = {opts.position_buckets} needs a reach "
                    f"(max_relative_positions, else max_position_embeddings) above {half + 1}, got {reach}: "
                    "the log buckets begin at half the buckets"
                )

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the word table and the MLM output bias (>= vocab_size)."""
        return -(-self.vocab_size // self.vocab_pad_multiple) * self.vocab_pad_multiple

    def with_dropout(self, rate: float) -> EncoderConfig:
        """This config with one dropout rate everywhere (fine-tuning's): hidden, attention and
        XLNet's after the FFN activation (which then follows the hidden rate, as the original's
        run_classifier.py has it, whatever its pretraining recipe set)."""
        xlnet = None if self.xlnet is None else dataclasses.replace(self.xlnet, activation_dropout=None)
        return dataclasses.replace(self, dropout_rate=rate, attention_dropout_rate=rate, xlnet=xlnet)

    @property
    def embedding_width(self) -> int:
        """E: the width of the embedding tables and of the tied MLM decoder."""
        return self.hidden_size if self.embedding_size is None else self.embedding_size

    @property
    def factorized_embedding(self) -> bool:
        """Whether E != H, i.e. an E -> H projection follows the embeddings (ALBERT)."""
        return self.embedding_width != self.hidden_size

    @property
    def embedding_axis(self) -> str:
        """Logical name of the E dimension: `embed` when E = H, else `factorized`."""
        return axes.FACTORIZED if self.factorized_embedding else axes.EMBED

    @property
    def max_length(self) -> int:
        """The longest sequence the position table covers (after `position_offset`)."""
        return self.max_position_embeddings - self.position_offset

    def check_length(self, length: int, what: str = "max_seq_length") -> None:
        """The one check of a sequence length against the position table (every stage calls it).

        RoBERTa's table has 514 rows of which the first 2 are never read (position_offset),
        so the limit is max_length (512), not max_position_embeddings.
        """
        if length > self.max_length:
            offset = f" minus position_offset = {self.position_offset}" if self.position_offset else ""
            raise ConfigError(
                f"{what} {length} exceeds EncoderConfig.max_position_embeddings = "
                f"{self.max_position_embeddings}{offset}: lower it, or use a model with more positions"
            )

    def attention_choice(self, length: int, *, dropout: bool) -> tuple[str, str]:
        """(path, reason): the self-attention this config takes at `length` on this process's
        platform (models/attention.py's `choose`), with `dropout` = training; DeBERTa's
        disentangled attention (models/deberta.py) and XLNet's relative attention
        (models/xlnet.py) always take their own."""
        if self.disentangled is not None:
            return "disentangled", "DeBERTa's disentangled attention has its own path"
        if self.xlnet is not None:
            return "relative", "XLNet's relative two-stream attention has its own path"
        return choose(
            self.attention_implementation,
            platform=attention_platform(),
            dtype=self.dtype,
            head_dim=self.head_dim,
            length=length,
            dropout=dropout and self.attention_dropout_rate > 0.0,
            dropout_bits=self.dropout_bits,
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def storage_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def accumulate_f32(self) -> bool:
        return self.matmul_accumulation == "float32"

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


def real_rows_init(config: EncoderConfig) -> nn.initializers.Initializer:
    """BERT's truncated normal for the vocab_size real rows of the word table, zeros for the
    padding rows (`vocab_pad_multiple`). Padding rows are never looked up and their logits
    are sliced off, so they get no gradient: zero, they stay zero, and neither weight
    decay nor LAMB's per-tensor trust ratio ||w|| / ||update|| sees them. The real rows
    draw the same values as without padding (same key, the first rows of the same draw)."""
    base = nn.initializers.truncated_normal(config.initializer_range)

    def init(key, shape, dtype=jnp.float32):
        return base(key, shape, dtype).at[config.vocab_size :].set(0)

    return init


def dense(
    config: EncoderConfig, features: int, names: tuple[str | None, str | None], *, name: str | None = None
) -> matmul.Dense:
    """Dense layer [..., in] -> [..., features] in compute dtype (float32 accumulation:
    models/matmul.py); kernel axes `names`."""
    return matmul.Dense(
        features,
        dtype=config.compute_dtype,
        accumulate_f32=config.accumulate_f32,
        param_dtype=config.storage_dtype,
        kernel_init=kernel_init(config, names),
        bias_init=bias_init(names[1:]),
        name=name,
    )


def layer_norm(config: EncoderConfig, axis: str = axes.EMBED, *, name: str | None = None) -> nn.LayerNorm:
    """LayerNorm over the last dimension (logical name `axis`: H, or E for the
    factorized embeddings), computing in float32 (callers cast the result back)."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=jnp.float32,
        param_dtype=config.storage_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), (axis,)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (axis,)),
        name=name,
    )


def add_and_normalize(
    config: EncoderConfig, norm: nn.LayerNorm, residual: jax.Array, update: jax.Array
) -> jax.Array:
    """Post-LN residual: norm(residual + update), [B, L, H] compute dtype.

    The sum is taken in float32 because the LayerNorm reads float32 anyway (an
    elementwise cast that XLA fuses into the normalisation).
    """
    x = residual.astype(jnp.float32) + update.astype(jnp.float32)
    return norm(x).astype(config.compute_dtype)


def constrain_hidden(x: jax.Array) -> jax.Array:
    return nn.with_logical_constraint(x, (axes.BATCH, axes.LENGTH, axes.EMBED))


# --- attention -------------------------------------------------------------------


def heads_in(config: EncoderConfig, name: str, *, use_bias: bool = True) -> matmul.Einsum:
    """A q/k/v projection [B, L, H] -> [B, L, N, D], kernel [H, N, D].

    An Einsum, not nn.DenseGeneral: DenseGeneral initialises a flattened 2-D kernel and
    reshapes it, which applies our 3-D logical axes to a 2-D array and fails under a mesh.
    """
    return matmul.Einsum(
        (config.hidden_size, config.num_heads, config.head_dim),
        "blh,hnd->blnd",
        dtype=config.compute_dtype,
        accumulate_f32=config.accumulate_f32,
        param_dtype=config.storage_dtype,
        kernel_init=kernel_init(config, (axes.EMBED, axes.HEADS, axes.KV)),
        bias_init=bias_init((axes.HEADS, axes.KV)),
        use_bias=use_bias,
        name=name,
    )


def heads_out(config: EncoderConfig, *, use_bias: bool = True) -> matmul.Einsum:
    """The attention output projection [B, L, N, D] -> [B, L, H] (kernel [N, D, H]), `output`."""
    return matmul.Einsum(
        (config.num_heads, config.head_dim, config.hidden_size),
        "blnd,ndh->blh",
        dtype=config.compute_dtype,
        accumulate_f32=config.accumulate_f32,
        param_dtype=config.storage_dtype,
        kernel_init=kernel_init(config, (axes.HEADS, axes.KV, axes.EMBED)),
        bias_init=bias_init((axes.EMBED,)),
        use_bias=use_bias,
        name="output",
    )


def hidden_dropout(cfg: EncoderConfig) -> Dropout:
    """The hidden-state dropout (rate `dropout_rate`, masks of `dropout_bits`)."""
    return Dropout(cfg.dropout_rate, bits=cfg.dropout_bits)


class SelfAttention(nn.Module):
    """Multi-head self-attention: q/k/v projections, attention, output projection.

    The attention itself is one of models/attention.py's paths, as `choose` picks it for
    `config.attention_implementation`, the platform and whether dropout is on.
    """

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: KeyMask, *, deterministic: bool) -> jax.Array:
        """x: [B, L, H] compute dtype; mask: the batch's KeyMask. Returns [B, L, H] compute dtype."""
        cfg = self.config
        heads_axes = (axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV)

        def project(name: str) -> jax.Array:
            return nn.with_logical_constraint(heads_in(cfg, name)(x), heads_axes)

        query, key, value = project("query"), project("key"), project("value")
        implementation, reason = cfg.attention_choice(x.shape[1], dropout=not deterministic)
        log_choice(implementation, reason)
        context = attend(
            implementation,
            query,
            key,
            value,
            mask,
            dropout_rate=0.0 if deterministic else cfg.attention_dropout_rate,
            # Only the explicit and flash paths drop anything (and ask for the "dropout" rng).
            dropout_rng=attention_dropout_key(self)
            if implementation in ("explicit", "flash") and not deterministic
            else None,
            dropout_bits=cfg.dropout_bits,
            accumulate_f32=cfg.accumulate_f32,
            flash_block_sizes=cfg.flash_block_sizes,
        )
        context = nn.with_logical_constraint(context, heads_axes)
        return heads_out(cfg)(context)


# --- embeddings, layers, encoder -------------------------------------------------


class Embeddings(nn.Module):
    """Word + learned absolute position + token type embeddings (width E), LayerNorm, dropout."""

    config: EncoderConfig

    @nn.compact
    def __call__(
        self, input_ids: jax.Array, segment_ids: jax.Array, positions: jax.Array, *, deterministic: bool
    ) -> tuple[jax.Array, jax.Array]:
        """input_ids, segment_ids, positions: [B, L] int32 (positions count from 0;
        `config.position_offset` is added here).

        Returns:
          embeddings [B, L, E] compute dtype, and the word embedding table
          [padded V, E] param dtype (for the tied MLM decoder).
        """
        cfg = self.config
        width_axis = cfg.embedding_axis

        def table(num: int, first_axis: str | None, name: str) -> nn.Embed:
            # Lookups are gathers (no FLOPs); they read float32 because the sum
            # feeds a float32 LayerNorm.
            return nn.Embed(
                num,
                cfg.embedding_width,
                dtype=jnp.float32,
                param_dtype=cfg.storage_dtype,
                embedding_init=kernel_init(cfg, (first_axis, width_axis)),
                name=name,
            )

        word_embeddings = nn.Embed(
            cfg.padded_vocab_size,
            cfg.embedding_width,
            dtype=jnp.float32,
            param_dtype=cfg.storage_dtype,
            embedding_init=nn.with_logical_partitioning(real_rows_init(cfg), (axes.VOCAB, width_axis)),
            name="word_embeddings",
        )
        x = word_embeddings(input_ids) + table(cfg.max_position_embeddings, None, "position_embeddings")(
            positions + cfg.position_offset
        )
        if cfg.type_vocab_size:
            x = x + table(cfg.type_vocab_size, None, "token_type_embeddings")(segment_ids)
        x = layer_norm(cfg, width_axis, name="layer_norm")(x).astype(cfg.compute_dtype)
        x = hidden_dropout(cfg)(x, deterministic=deterministic)
        return nn.with_logical_constraint(x, (axes.BATCH, axes.LENGTH, width_axis)), word_embeddings.embedding


class TransformerLayer(nn.Module):
    """Post-LN layer: attention block (attention -> add & LN), then FFN block
    (H -> F -> H -> add & LN).

    The two blocks are separate methods so that cross-layer sharing can take one
    block from a shared layer and the other from the layer's own: submodules are
    defined in `setup`, which creates parameters only for the blocks a layer runs
    (a `shared_attention` layer holds no FFN parameters).
    """

    config: EncoderConfig

    def make_attention(self) -> nn.Module:
        """The attention module (`attention`): DeBERTa's layer brings its own."""
        return SelfAttention(self.config)

    def setup(self):
        cfg = self.config
        self.attention = self.make_attention()
        self.attention_layer_norm = layer_norm(cfg)
        self.intermediate = dense(cfg, cfg.intermediate_size, (axes.EMBED, axes.MLP))
        self.output = dense(cfg, cfg.hidden_size, (axes.MLP, axes.EMBED))
        self.output_layer_norm = layer_norm(cfg)
        self.dropout = hidden_dropout(cfg)

    def attend(self, x: jax.Array, mask: KeyMask, deterministic: bool) -> jax.Array:
        """The attention block. x: [B, L, H] compute dtype; mask: the batch's KeyMask."""
        attended = self.attention(x, mask, deterministic=deterministic)
        attended = self.dropout(attended, deterministic=deterministic)
        return constrain_hidden(add_and_normalize(self.config, self.attention_layer_norm, x, attended))

    def feed_forward(self, x: jax.Array, deterministic: bool) -> jax.Array:
        """The FFN block. x: [B, L, H] compute dtype."""
        h = self.intermediate(x)
        h = nn.with_logical_constraint(self.config.activation(h), (axes.BATCH, axes.LENGTH, axes.MLP))
        h = self.dropout(self.output(h), deterministic=deterministic)
        return constrain_hidden(add_and_normalize(self.config, self.output_layer_norm, x, h))

    def __call__(self, x: jax.Array, mask: KeyMask, deterministic: bool) -> jax.Array:
        """x: [B, L, H] compute dtype; mask: the batch's KeyMask. Returns [B, L, H] compute dtype.

        `deterministic` is positional so that nn.remat can mark it static.
        """
        return self.feed_forward(self.attend(x, mask, deterministic), deterministic)


# The units that Encoder rematerialises, as functions of the layer that owns the
# parameters (nn.remat lifts a function whose first argument is a module): the whole
# layer when one module owns both blocks, else each block on its own.
def _whole_layer(layer: TransformerLayer, x: jax.Array, mask: KeyMask, deterministic: bool) -> jax.Array:
    return layer(x, mask, deterministic)


def _attention_block(layer: TransformerLayer, x: jax.Array, mask: KeyMask, deterministic: bool) -> jax.Array:
    return layer.attend(x, mask, deterministic)


def _ffn_block(layer: TransformerLayer, x: jax.Array, deterministic: bool) -> jax.Array:
    return layer.feed_forward(x, deterministic)


@flax.struct.dataclass
class EncoderOutput:
    """What `Encoder` returns.

    Attributes:
      sequence_output: [B, L, H] compute dtype, the last layer's hidden states.
      pooled_output: [B, H] compute dtype, tanh(dense(first token)); None when the
        config has no pooler.
      word_embeddings: [padded V, E] param dtype, the token table (the tied MLM
        decoder; `config.padded_vocab_size` rows).
      masked_states: [B, P, H] compute dtype, DeBERTa's enhanced mask decoder output at
        the requested positions (models/deberta.py); None otherwise.
    """

    sequence_output: jax.Array
    pooled_output: jax.Array | None
    word_embeddings: jax.Array
    masked_states: jax.Array | None = None


def default_positions(input_ids: jax.Array) -> jax.Array:
    """Position ids 0..L-1 in every row: [B, L] int32 for [B, L] input_ids."""
    return jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)


def pool(config: EncoderConfig, sequence_output: jax.Array) -> jax.Array | None:
    """BERT's pooler, tanh(dense(first token)) [B, H], as a submodule `pooler` of the calling
    (compact) module; None when `config.pooler` is off."""
    if not config.pooler:
        return None
    return jnp.tanh(
        dense(config, config.hidden_size, (axes.EMBED, axes.MLP), name="pooler")(sequence_output[:, 0])
    )


class Encoder(nn.Module):
    """Embeddings (projected E -> H if factorized), `num_layers` Transformer layers
    (parameters shared as `config.sharing` says) and, if `config.pooler`, the pooler."""

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
        embedded: tuple[jax.Array, jax.Array] | None = None,
        embeddings_only: bool = False,
    ) -> EncoderOutput:
        """Encodes a batch.

        Args:
          input_ids, input_mask, segment_ids: [B, L] int32 (input_mask 1 = real token, 0 =
            padding, which is at the end of each row: cuDNN's attention reads the mask as
            per-row lengths; models/attention.py).
          positions: [B, L] int32 position ids counting from 0 (`position_offset` is
            added in the embeddings); default 0..L-1 in every row.
          example_ids: [B, L] int32 packed-example ids (0 = pad), or None without packing.
          deterministic: False in training: enables dropout (rng collection "dropout"; the
            attention probabilities' from "attention_dropout" where given).
          row_index: [B] int32, the rows' places in the global batch (the train step's), or
            None = 0..B-1: the attention dropout's row counter (`KeyMask.row_index`).
          embedded: another encoder's embedding block output (its `embeddings_only`
            call: the [B, L, E] embeddings and the [padded V, E] table) used instead of
            an embedding block of this encoder's own, which it then does not have:
            ELECTRA's generator reads the discriminator's embeddings (models/electra.py).
            `input_ids` and `segment_ids` are then unused.
          embeddings_only: stop after the embedding block: `sequence_output` is its
            [B, L, E] output (after LayerNorm and dropout, before any E -> H projection).
        """
        cfg = self.config
        if positions is None:
            positions = default_positions(input_ids)
        if embedded is None:
            x, word_embeddings = Embeddings(cfg, name="embeddings")(
                input_ids, segment_ids, positions, deterministic=deterministic
            )
        else:
            x, word_embeddings = embedded
        if embeddings_only:
            return EncoderOutput(sequence_output=x, pooled_output=None, word_embeddings=word_embeddings)
        if cfg.factorized_embedding:
            # ALBERT's embedding_hidden_mapping_in. The original (google-research/albert
            # modeling.py) applies it only when E != H; HF's AlbertTransformer always has it.
            # We follow the original, so E = H (the E = 768 ablation arm) is plain BERT.
            x = dense(cfg, cfg.hidden_size, (axes.FACTORIZED, axes.EMBED), name="embedding_projection")(x)
            x = constrain_hidden(x)
        mask = KeyMask(input_mask, example_ids, row_index)

        whole_layer, attention_block, ffn_block = _whole_layer, _attention_block, _ffn_block
        if cfg.remat_policy != "none":
            # The last argument (deterministic) is a Python bool: static. Flax counts the
            # module argument in static_argnums.
            policy = REMAT_POLICIES[cfg.remat_policy]
            whole_layer = nn.remat(_whole_layer, policy=policy, static_argnums=(3,))
            attention_block = nn.remat(_attention_block, policy=policy, static_argnums=(3,))
            ffn_block = nn.remat(_ffn_block, policy=policy, static_argnums=(2,))

        # Flax shares the parameters of a module called more than once.
        if cfg.scan_layers and not self.is_initializing():
            x = self._scanned_layers(x, mask, deterministic)
        elif cfg.sharing == "all":
            shared = TransformerLayer(cfg, name="shared_layer")
            for _ in range(cfg.num_layers):
                x = whole_layer(shared, x, mask, deterministic)
        elif cfg.sharing == "none":
            for i in range(cfg.num_layers):
                x = whole_layer(TransformerLayer(cfg, name=f"layer_{i}"), x, mask, deterministic)
        else:
            shared = TransformerLayer(cfg, name=f"shared_{cfg.sharing}")
            for i in range(cfg.num_layers):
                own = TransformerLayer(cfg, name=f"layer_{i}")
                attention_owner, ffn_owner = (shared, own) if cfg.sharing == "attention" else (own, shared)
                x = attention_block(attention_owner, x, mask, deterministic)
                x = ffn_block(ffn_owner, x, deterministic)
        return EncoderOutput(sequence_output=x, pooled_output=pool(cfg, x), word_embeddings=word_embeddings)

    def _scanned_layers(self, x: jax.Array, mask: KeyMask, deterministic: bool) -> jax.Array:
        """The layers as one `lax.scan` over their stacked parameters (`scan_layers`): XLA
        compiles one layer body instead of num_layers copies.

        The parameter tree stays `layer_{i}` (or `shared_layer`), which checkpoints and
        conversions read; the layers' parameters are stacked inside the step, a copy of
        the encoder's parameters per step (and its transpose in the backward pass). Layer
        i's dropout keys are fold_in(the encoder's keys, i), so the masks are not
        those of the unrolled loop; without dropout both give the same numbers.
        """
        cfg = self.config
        params = nn.meta.unbox(self.variables["params"])
        indices = jnp.arange(cfg.num_layers)
        if cfg.sharing == "all":  # one parameter set, closed over; only the index is scanned
            xs = (None, indices)
        else:
            layers = [params[f"layer_{i}"] for i in range(cfg.num_layers)]
            xs = (jax.tree.map(lambda *ps: jnp.stack(ps), *layers), indices)
        keys = {}
        if not deterministic:
            keys = {"dropout": self.make_rng("dropout")}
            if self.has_rng(ATTENTION_DROPOUT):
                keys[ATTENTION_DROPOUT] = self.make_rng(ATTENTION_DROPOUT)
        layer = TransformerLayer(cfg, parent=None)

        def body(x, inputs):
            layer_params, index = inputs
            if layer_params is None:
                layer_params = params["shared_layer"]
            rngs = {name: jax.random.fold_in(key, index) for name, key in keys.items()}
            return layer.apply({"params": layer_params}, x, mask, deterministic, rngs=rngs), None

        if cfg.remat_policy != "none":
            body = jax.checkpoint(body, policy=REMAT_POLICIES[cfg.remat_policy])
        x, _ = jax.lax.scan(body, x, xs)
        return x
