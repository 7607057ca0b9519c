"""Self-attention kernels and the choice between them (`EncoderConfig.attention_implementation`).

Every path computes softmax(q k^T / sqrt(D), masked) v over [B, L, N, D] queries, keys
and values (B batch, L length, N heads, D head width); they differ in what they can do and
where they are fast:

    explicit  written out step by step (float32 logits and softmax), with dropout on the
              attention probabilities (models/dropout.py's masks). Training with
              attention_dropout_rate > 0 takes it unless 'flash' is set.
    flash     our Pallas flash attention (models/flash_attention.py: Mosaic on TPU,
              Triton on GPU, Pallas's interpreter elsewhere, which is slow: for tests),
              with the explicit path's very dropout masks drawn inside the kernel.
              Opt-in: 'auto' never picks it until an accelerator measurement shows it
              faster than 'explicit' with dropout (docs/performance.md).
    xla       jax.nn.dot_product_attention's XLA path (the dense mask).
    cudnn     cuDNN's fused flash attention through jax.nn.dot_product_attention (NVIDIA
              GPUs of compute capability >= 8.0; bf16 or fp16; head width <= 128, a
              multiple of 8). Padding goes in as per-row lengths, so input_mask must be
              a prefix of ones (every pipeline and tool of ours pads at the end of a
              row). Packed rows take XLA's path instead: cuDNN would take their mask as
              a [B, 1, L, L] bias and compute its gradient too.
    splash    Pallas splash attention (TPU; Pallas interpret mode anywhere else, which
              is how the tests run it): padding and packed rows as segment ids, L a
              multiple of 128 (its block size). A pallas_call cannot be partitioned by
              XLA, so under a mesh it runs in shard_map over batch and heads.

'auto' (the default) takes cudnn on GPU and splash on TPU where they apply, else xla;
`choose` decides and says why, and the model logs each decision once per process.
The paths agree to float rounding (tests/test_attention.py, tests/test_flash_attention.py),
'explicit' and 'flash' with dropout too.

Padding queries (input_mask 0) get different, never-read outputs on different paths: with
the dense mask and with cuDNN's lengths they attend to the row's real tokens, with segment
ids splash lets padding attend to padding. Real tokens see the same keys
everywhere, and no loss or output reads a padding position.
"""

from __future__ import annotations

import functools
import logging

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask
from jax.sharding import PartitionSpec

from core import axes, sharding
from models import flash_attention, matmul
from models.dropout import dropout

log = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "explicit", "xla", "cudnn", "splash", "flash")
# The value jax.nn.dot_product_attention's XLA path gives masked logits, so the explicit
# and XLA paths agree exactly; finite, so fully masked rows give no NaN.
MASKED_LOGIT = -0.7 * float(jnp.finfo(jnp.float32).max)
SPLASH_BLOCK = 128  # splash's tiles are multiples of the TPU's 128 lanes
_CUDNN_DTYPES = ("bfloat16", "float16")


@flax.struct.dataclass
class KeyMask:
    """Which keys each query may attend to, kept as the [B, L] arrays the kernels take.

    Attributes:
      input_mask: [B, L] int, 1 for real tokens, 0 for padding (at the end of the row).
      example_ids: [B, L] int, the packed example of each token (1..k, 0 = pad), or
        None without packing; tokens then attend only within their own example.
      row_index: [B] int32, each row's place in the global batch (the step's `row_index`),
        or None = 0..B-1: the attention dropout's row counter, so that a microbatch draws
        the whole batch's masks at its rows.
    """

    input_mask: jax.Array
    example_ids: jax.Array | None = None
    row_index: jax.Array | None = None

    def dense(self) -> jax.Array:
        """[B, 1, 1, L] bool without packing, [B, 1, L, L] with it; True = may attend."""
        mask = self.input_mask.astype(bool)[:, None, None, :]
        if self.example_ids is not None:
            mask = mask & (self.example_ids[:, None, :, None] == self.example_ids[:, None, None, :])
        return mask

    def lengths(self) -> jax.Array:
        """[B] int32: real tokens per row (the padding is trailing)."""
        return self.input_mask.astype(jnp.int32).sum(axis=-1)

    def segment_ids(self) -> jax.Array:
        """[B, L] int32: 0 for padding, else the token's example (1 without packing)."""
        ids = self.input_mask if self.example_ids is None else self.example_ids
        return jnp.where(self.input_mask.astype(bool), ids, 0).astype(jnp.int32)


def attention_mask(input_mask: jax.Array, example_ids: jax.Array | None = None) -> jax.Array:
    """The dense mask of `KeyMask(input_mask, example_ids)`: [B, 1, 1, L] or [B, 1, L, L] bool."""
    return KeyMask(input_mask, example_ids).dense()


def platform() -> str:
    """The target's accelerator as the kernels see it: "tpu", "cuda" (an NVIDIA GPU of compute
    capability 8.0 or more: cuDNN's flash attention), "gpu" (any other GPU) or "cpu".

    The target is the mesh the step is being built for (core/sharding.py `target_device`):
    a TPU slice compiled for ahead of time on a CPU gets the TPU's kernels."""
    device = sharding.target_device()
    if device.platform != "gpu":
        return device.platform
    capability = float(getattr(device, "compute_capability", 0) or 0)
    return "cuda" if "cuda" in device.client.platform_version.lower() and capability >= 8.0 else "gpu"


def choose(
    requested: str,
    *,
    platform: str,
    dtype: str,
    head_dim: int,
    length: int,
    dropout: bool,
    dropout_bits: int = 16,
) -> tuple[str, str]:
    """The path a layer takes, and why.

    Args:
      requested: `EncoderConfig.attention_implementation` (one of IMPLEMENTATIONS).
      platform: `platform()`: "cpu", "cuda", "gpu" or "tpu".
      dtype: the compute dtype's name.
      head_dim: D. length: L.
      dropout: attention dropout is active (training with attention_dropout_rate > 0).
      dropout_bits: `EncoderConfig.dropout_bits` (flash draws the 16-bit masks only).
    Returns:
      (one of IMPLEMENTATIONS other than "auto", a reason for the log). A fused kernel
      asked for where it cannot run (cuDNN off an sm80+ NVIDIA GPU or outside its dtypes
      and widths, splash at a length it cannot tile) falls back to "xla", saying why: a
      checkpoint's config travels to machines other than the one it was trained on.
    """
    if requested == "flash":
        return _choose_flash(platform, head_dim, dropout, dropout_bits)
    if dropout:
        return "explicit", "attention dropout is on in training: the explicit path (or 'flash') has it"
    if requested in ("explicit", "xla"):
        return requested, "set in EncoderConfig.attention_implementation"
    if requested == "cudnn" or (requested == "auto" and platform == "cuda"):
        if platform == "cuda" and dtype in _CUDNN_DTYPES and head_dim <= 128 and head_dim % 8 == 0:
            return "cudnn", f"NVIDIA GPU, {dtype}, head width {head_dim}"
        needs = (
            "an NVIDIA GPU of compute capability >= 8.0, bf16/fp16, a head width <= 128 and a multiple of 8"
        )
        return "xla", f"cuDNN flash attention needs {needs}: {platform}, {dtype}, {head_dim}"
    if requested == "splash" or (requested == "auto" and platform == "tpu"):
        if length % SPLASH_BLOCK:
            return "xla", f"splash attention needs a length divisible by {SPLASH_BLOCK}: {length}"
        if platform != "tpu":
            return "splash", f"splash in Pallas interpret mode on {platform} (slow: for tests)"
        return "splash", f"TPU, length {length}"
    return "xla", f"no fused kernel on {platform}"


def _choose_flash(platform: str, head_dim: int, dropout: bool, dropout_bits: int) -> tuple[str, str]:
    fallback = "explicit" if dropout else "xla"
    if dropout and dropout_bits != 16:
        return fallback, "flash attention draws the 16-bit dropout masks; EncoderConfig.dropout_bits is 32"
    if platform == "gpu":
        return fallback, "flash attention on GPU (Triton) needs an NVIDIA GPU of compute capability >= 8.0"
    if platform == "cuda" and (head_dim < 16 or head_dim & (head_dim - 1)):
        return fallback, f"flash attention on GPU (Triton) needs a power-of-two head width >= 16: {head_dim}"
    backend = flash_attention.default_backend(platform)
    if backend == "interpret":
        return "flash", f"flash attention in Pallas interpret mode on {platform} (slow: for tests)"
    return "flash", f"set in EncoderConfig.attention_implementation ({backend} kernel)"


#: The rng stream of the attention probabilities' dropout: the train step gives every
#: microbatch the same key for it (pretrain/step.py), and `KeyMask.row_index` the rows' places,
#: so a microbatch draws the whole batch's masks. Callers without it (fine-tuning, tools)
#: draw from "dropout".
ATTENTION_DROPOUT = "attention_dropout"


def attention_dropout_key(module: nn.Module) -> jax.Array:
    """The key of `module`'s attention dropout: from the ATTENTION_DROPOUT stream if the
    caller gives one, else from "dropout"."""
    return module.make_rng(ATTENTION_DROPOUT if module.has_rng(ATTENTION_DROPOUT) else "dropout")


def drop_probabilities(
    module: nn.Module, probs: jax.Array, rate: float, bits: int, deterministic: bool, rows: jax.Array | None
) -> jax.Array:
    """Attention probabilities [B, N, Q, K] after `module`'s attention dropout (none when
    deterministic or rate 0), drawn per row (`rows`: the rows' places in the global batch)
    from `attention_dropout_key`: for the attention paths that compute their probabilities
    themselves (DeBERTa's, XLNet's)."""
    if deterministic or rate == 0.0:
        return probs
    return dropout(probs, rate, attention_dropout_key(module), bits=bits, rows=rows)


@functools.cache
def log_choice(implementation: str, reason: str) -> None:
    """Logs each distinct decision once per process (a step is traced more than once)."""
    log.info("attention: %s (%s)", implementation, reason)


def explicit_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    dropout_bits: int = 16,
    dropout_rows: jax.Array | None = None,
    accumulate_f32: bool = True,
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
      dropout_bits: random bits per mask element (`EncoderConfig.dropout_bits`).
      dropout_rows: [B] int32, the rows' places in the global batch (`KeyMask.row_index`).
      accumulate_f32: `EncoderConfig.matmul_accumulation == "float32"` (models/matmul.py).
    Returns:
      [B, L, N, D] in value's dtype.
    """
    scale = jnp.float32(1.0 / np.sqrt(query.shape[-1]))
    dot = functools.partial(matmul.einsum, dtype=value.dtype, accumulate_f32=accumulate_f32)
    logits = dot("btnd,bsnd->bnts", query, key).astype(jnp.float32) * scale
    probs = jax.nn.softmax(jnp.where(mask, logits, MASKED_LOGIT), axis=-1)
    if dropout_rng is not None and dropout_rate > 0.0:
        probs = dropout(probs, dropout_rate, dropout_rng, bits=dropout_bits, rows=dropout_rows)
    return dot("bnts,bsnd->btnd", probs, value).astype(value.dtype)


def attend(
    implementation: str,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: KeyMask,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    dropout_bits: int = 16,
    accumulate_f32: bool = True,
    flash_block_sizes: flash_attention.BlockSizes | None = None,
) -> jax.Array:
    """Attention by the path `implementation` (as `choose` returns it): [B, L, N, D] -> [B, L, N, D].
    The dropout arguments are the explicit path's (`explicit_attention`) and flash's (which
    draws the 16-bit masks only); the other paths have none. flash_block_sizes: flash's tiles."""
    if implementation == "flash" and dropout_rng is not None and not flash_attention.is_threefry(dropout_rng):
        implementation = "explicit"
        log_choice(implementation, "flash attention hashes threefry keys; run.dropout_prng is not threefry")
    if implementation == "explicit":
        return explicit_attention(
            query,
            key,
            value,
            mask.dense(),
            dropout_rate=dropout_rate,
            dropout_rng=dropout_rng,
            dropout_bits=dropout_bits,
            dropout_rows=mask.row_index,
            accumulate_f32=accumulate_f32,
        )
    if implementation == "flash":
        return flash(
            query,
            key,
            value,
            mask,
            dropout_rate=dropout_rate,
            dropout_rng=dropout_rng,
            block_sizes=flash_block_sizes,
        )
    if implementation == "cudnn":
        return cudnn_attention(query, key, value, mask)
    if implementation == "splash":
        return splash_attention(query, key, value, mask)
    return jax.nn.dot_product_attention(query, key, value, mask=mask.dense(), implementation="xla")


def flash(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: KeyMask,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    block_sizes: flash_attention.BlockSizes | None = None,
) -> jax.Array:
    """Our Pallas flash attention (models/flash_attention.py) in the target platform's kernel
    language: [B, L, N, D] -> [B, L, N, D]. Without packing every query has segment id 1
    (padding queries attend the real tokens, as with the dense mask); keys of id 0 are padding."""
    key_ids = mask.segment_ids()
    query_ids = key_ids if mask.example_ids is not None else jnp.ones_like(key_ids)
    return flash_attention.flash_attention(
        query,
        key,
        value,
        flash_attention.SegmentIds(query_ids, key_ids),
        dropout_rate=dropout_rate,
        dropout_key=dropout_rng if dropout_rate > 0.0 else None,
        rows=mask.row_index,
        backend=flash_attention.default_backend(platform()),
        block_sizes=block_sizes,
    )


def cudnn_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: KeyMask) -> jax.Array:
    """cuDNN flash attention: [B, L, N, D] bf16/fp16 -> [B, L, N, D], padding (at the end of
    each row) as per-row lengths. Packed rows go to XLA's path with the dense mask: cuDNN
    takes a mask only as a [B, 1, L, L] bias, whose gradient its backward pass computes."""
    if mask.example_ids is not None:
        return jax.nn.dot_product_attention(query, key, value, mask=mask.dense(), implementation="xla")
    return jax.nn.dot_product_attention(
        query, key, value, key_value_seq_lengths=mask.lengths(), implementation="cudnn"
    )


def splash_attention(
    query: jax.Array, key: jax.Array, value: jax.Array, mask: KeyMask, *, interpret: bool | None = None
) -> jax.Array:
    """Pallas splash attention: [B, L, N, D] -> [B, L, N, D], padding and packing as segment ids.

    Under a mesh (jax.set_mesh) the kernel runs per shard in shard_map, each shard holding
    its batch rows and heads as the logical-axis rules place them (a pallas_call is opaque
    to XLA's partitioner, which would otherwise gather every head onto every device).
    `interpret` runs the kernel in Pallas's interpreter (any backend; for tests); None: off
    a TPU only.
    """
    if interpret is None:
        interpret = platform() != "tpu"
    length, head_dim = query.shape[1], query.shape[-1]
    if length % SPLASH_BLOCK:
        raise ValueError(f"splash attention needs a length divisible by {SPLASH_BLOCK}, got {length}")
    query = query * jnp.asarray(1.0 / np.sqrt(head_dim), query.dtype)  # splash does not scale

    def attend(q, k, v, ids):  # [b, L, n, D] x3, [b, L] -> [b, L, n, D]
        heads = q.shape[2]
        kernel = splash.make_splash_mha(
            splash_mask.MultiHeadMask([splash_mask.FullMask((length, length))] * heads),
            head_shards=1,
            q_seq_shards=1,
            interpret=interpret,
        )
        to_heads_first = functools.partial(jnp.swapaxes, axis1=1, axis2=2)
        out = jax.vmap(kernel)(
            to_heads_first(q),
            to_heads_first(k),
            to_heads_first(v),
            segment_ids=splash.SegmentIds(q=ids, kv=ids),
        )
        return to_heads_first(out)

    ids = mask.segment_ids()
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return attend(query, key, value, ids)
    batch, _, heads, _ = sharding.divisible_spec(
        nn.logical_to_mesh_axes((axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV)), query.shape, mesh
    )
    # Rows and heads only: a shard holds whole sequences (every key its queries attend to).
    heads = PartitionSpec(batch, None, heads, None)
    rows = PartitionSpec(batch, None)
    return jax.shard_map(attend, in_specs=(heads, heads, heads, rows), out_specs=heads, check_vma=False)(
        query, key, value, ids
    )
