"""Flash attention with BERT's attention dropout: Pallas kernels for TPU (Mosaic) and GPU (Triton).

softmax(q k^T / sqrt(D), masked) v, computed a tile of queries at a time with the online
softmax of FlashAttention (Dao et al. 2022, "FlashAttention: fast and memory-efficient exact
attention with IO-awareness"; the backward pass of FlashAttention-2, Dao 2023): the [L, L]
probabilities are never written to memory, in the forward pass or the backward pass, which
recomputes them from the queries, keys and the forward pass's per-query log-sum-exp.

Dropout on the probabilities is drawn inside the kernel, and is exactly models/dropout.py's
mask of the [B, N, L, L] probabilities that the explicit path (models/attention.py) draws from
the same key: the keep bit of (row b, head h, query t, key s) is 16 bits of the Threefry-2x32
block hashing the counter ((b * N + h) * L + t, s mod W), quarter s // W, with W = ceil(L / 4).
So the mask is a function of the key and those four indices only, whatever the tiling, the
mesh (a shard's rows and heads keep their global indices), the microbatch split (b is the
row's place in the global batch, `rows`) or the pass (the backward pass hashes the same
counters again instead of storing the mask), and a resumed run draws what the
uninterrupted run drew. Switching a run between 'explicit' and 'flash' changes float rounding,
not the dropout. The cost is the hash: 20 rounds of integer adds, rotations and xors per four
elements, on the vector units, beside the exponentials.

The keys are laid out as 4 quarters of W (each padded to a multiple of the key block), so
that one hashed [queries, block_k] grid of counters gives the bits of four key blocks
(quarter c, block j): every hashed bit is used and none crosses a lane. Two kernel designs
share that layout, the hash and the masking:

- `grid` (TPU; Pallas's interpreter, `interpret`), in the idioms of jax's own Pallas TPU flash
  attention (jax/experimental/pallas/ops/tpu/flash_attention.py): the key blocks are a grid
  dimension ("arbitrary": sequential) and the online softmax's state lives in VMEM scratch,
  so a program's VMEM does not grow with the length; the key words and each row's place come
  through scalar prefetch (SMEM); segment ids are replicated across lanes (queries) or
  sublanes (keys) instead of [block, 1] blocks; the log-sum-exp and the backward pass's
  delta are lane-replicated [.., 128] arrays. At lengths where the four quarters of a key
  block fit 128 lanes together (L <= 128: 4 x 32 keys), the forward and dq passes take one
  tile of all four quarters ("wide keys"), hashing each counter grid at full lane width and
  selecting each lane's quarter, instead of four tiles a quarter of a vector wide (the
  dk/dv pass has the keys on sublanes, where 32 rows are full vectors already).
- `loop` (GPU: Triton; `interpret_triton`): a program per query (or key) block walks the
  key (or query) blocks in a loop, the whole row in its block spec; Triton has neither
  scratch nor sequential grid dimensions.

The grid design is models/flash_grid.py, the loop design models/flash_loop.py, and what both
compute on a tile (the static settings, the hash's keep masks, the masked logits, the cost
estimate) models/flash_tiles.py; this module holds the custom VJP, the block choice and the
public functions.

The backward pass is two kernels: one per key block (dk, dv; its tiles are keys by queries,
so that it needs only plain and rhs-transposed matmuls, the forms Mosaic and Triton share)
and one per query block (dq). Tile sizes are `BlockSizes` (`EncoderConfig.flash_block_sizes`;
default: the smallest blocks that cover the row, capped per design), and each kernel gives
Pallas a `pl.CostEstimate` (its matmul FLOPs, exponentials and bytes; not the hash), so that
XLA's cost model prices it (core/compiled_program.py).

Masking: a query attends a key of the same segment id, 0 being padding (keys of segment 0
are never attended). Without packing, every query has id 1, so padding queries attend the
row's real tokens as on the dense-mask paths. With packing a padding query (id 0) has no
key to attend: it gets 0 and no gradient (the explicit path spreads it over every key).
No loss reads either.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from core import axes, sharding
from core.errors import ConfigError
from models import dropout as dropout_bits
from models import flash_grid, flash_loop
from models import flash_tiles as tiles

BACKENDS = tiles.BACKENDS
# The largest default blocks by design (forward queries, keys per quarter; then the
# backward pass's): TPU tiles are 128 lanes wide; Triton keeps a tile and two words of hash
# per tile in registers, and its dk/dv programs carry eight accumulators (dk and dv per
# quarter), so their blocks are smaller. The mask does not depend on the blocks.
_LARGEST = {"grid": (128, 128, 128, 128), "loop": (64, 64, 32, 32)}


class SegmentIds(NamedTuple):
    """Segment ids of the queries and the keys, [B, L] int each: a query attends the keys of
    its own id; keys of id 0 are padding and never attended."""

    q: jax.Array
    kv: jax.Array


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """The kernels' tile sizes (`EncoderConfig.flash_block_sizes`); None = the default: the
    smallest block covering the row (L queries, ceil(L / 4) keys per quarter), capped at 128
    (TPU) or 64 / 32 (Triton's forward / backward).

    Attributes:
      block_q: queries per tile of the forward and dq passes.
      block_k: keys per quarter per tile of the forward and dq passes.
      block_q_backward, block_k_backward: the dk/dv pass's (default: the largest divisors
        of the forward's within the design's cap).
      wide_keys: (TPU design) the forward and dq passes take the four quarters of a key
        block as one tile; None = where they fit 128 lanes (L <= 128).

    Each is a positive multiple of 8; on Triton a power of two >= 16; on a TPU a multiple
    of 128 or one block covering the row (Mosaic's tiles). The mask does not depend on them.
    """

    block_q: int | None = None
    block_k: int | None = None
    block_q_backward: int | None = None
    block_k_backward: int | None = None
    wide_keys: bool | None = None

    def __post_init__(self):
        for name in ("block_q", "block_k", "block_q_backward", "block_k_backward"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 8 or value % 8
            ):
                raise ConfigError(
                    f"flash attention BlockSizes.{name} must be a positive multiple of 8, got {value!r}"
                )
        if self.wide_keys not in (None, True, False):
            raise ConfigError(
                f"flash attention BlockSizes.wide_keys must be True, False or None: {self.wide_keys!r}"
            )


# --- the custom VJP and the public functions -------------------------------------------

_FORWARD = {"grid": flash_grid.forward, "loop": flash_loop.forward}
_BACKWARD = {"grid": flash_grid.backward, "loop": flash_loop.backward}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(static: tiles.Static, q, k, v, q_ids, kv_ids, rows, scalars):
    return _FORWARD[static.design](static, q, k, v, q_ids, kv_ids, rows, scalars)[0]


def _flash_fwd(static, q, k, v, q_ids, kv_ids, rows, scalars):
    o, lse = _FORWARD[static.design](static, q, k, v, q_ids, kv_ids, rows, scalars)
    return o, (q, k, v, q_ids, kv_ids, rows, scalars, o, lse)


def _flash_bwd(static, residuals, do):
    dq, dk, dv = _BACKWARD[static.design](static, residuals, do)
    return dq, dk, dv, None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def default_backend(platform: str) -> str:
    """The kernel language for `models.attention.platform()`: Mosaic on TPU, Triton on NVIDIA
    GPUs of compute capability >= 8.0 ("cuda"), the interpreter (the TPU design) elsewhere."""
    return {"tpu": "tpu", "cuda": "triton"}.get(platform, "interpret")


def _block(requested: int | None, extent: int, backend: str, maximum: int, name: str) -> int:
    """A block size: the requested one (checked), or the smallest that covers `extent`, capped
    at `maximum` (so that a short row is not padded up to a full-size block)."""
    pow2 = tiles.DESIGN[backend] == "loop"  # Triton's tensor shapes are powers of two (and dots >= 16)
    if requested is not None:
        if pow2 and (requested < 16 or requested & (requested - 1)):
            raise ValueError(
                f"flash attention {name} must be a power of two >= 16 on {backend}, got {requested}"
            )
        # Mosaic tiles: a block along lanes is a multiple of 128, or the whole (padded) row.
        if backend == "tpu" and requested % tiles.LANES and requested < extent:
            raise ValueError(
                f"flash attention {name} must be a multiple of {tiles.LANES} or cover the row ({extent}) "
                f"on tpu, got {requested}"
            )
        return requested
    block = _round_up(extent, 16 if pow2 else 8)
    if pow2:
        block = 1 << (block - 1).bit_length()
    return min(maximum, block)


def _statics(sizes: BlockSizes, backend: str, length: int, width: int) -> dict:
    """The blocks and the wide-keys choice for a row of `length` (`width` keys per quarter)."""
    largest = _LARGEST[tiles.DESIGN[backend]]
    block_q = _block(sizes.block_q, length, backend, largest[0], "block_q")
    block_k = _block(sizes.block_k, width, backend, largest[1], "block_k")
    # The backward pass's blocks divide the forward's, so that the padded lengths fit.
    block_q_backward = _block(
        sizes.block_q_backward, length, backend, math.gcd(block_q, largest[2]), "block_q_backward"
    )
    block_k_backward = _block(
        sizes.block_k_backward, width, backend, math.gcd(block_k, largest[3]), "block_k_backward"
    )
    for name, forward, backward in (("q", block_q, block_q_backward), ("k", block_k, block_k_backward)):
        if forward % backward:
            raise ValueError(
                f"flash attention block_{name}_backward ({backward}) must divide block_{name} ({forward})"
            )
    one_key_block = block_k >= width
    wide = sizes.wide_keys
    if wide is None:
        wide = tiles.DESIGN[backend] == "grid" and one_key_block and tiles.QUARTERS * block_k <= tiles.LANES
    if wide and (tiles.DESIGN[backend] != "grid" or not one_key_block):
        raise ValueError(
            "flash attention wide_keys needs the TPU design and one key block per quarter "
            f"(block_k >= {width}); got {backend}, block_k {block_k}"
        )
    return dict(
        block_q=block_q,
        block_k=block_k,
        block_q_backward=block_q_backward,
        block_k_backward=block_k_backward,
        wide=wide,
    )


def flash_attention_heads_first(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    segment_ids: SegmentIds,
    *,
    dropout_rate: float = 0.0,
    dropout_key: jax.Array | None = None,
    rows: jax.Array,
    head_offset: jax.Array | int = 0,
    total_heads: int | None = None,
    backend: str = "interpret",
    block_sizes: BlockSizes | None = None,
) -> jax.Array:
    """The kernel on one shard: [B, N, L, D] query, key, value -> [B, N, L, D].

    Args:
      segment_ids: [B, L] int ids of the queries and keys (`SegmentIds`).
      dropout_rate: the probability of dropping an attention probability.
      dropout_key: a threefry key (typed or raw uint32[2]); None = no dropout.
      rows: [B] int32, each row's place in the global batch, head_offset: this shard's first
        head, and total_heads: the global head count (default N): the dropout counters are
        global.
      backend: one of BACKENDS. block_sizes: the tiles (`BlockSizes`; None = the defaults).
    """
    if backend not in BACKENDS:
        raise ValueError(f"flash attention backend must be one of {BACKENDS}, got {backend!r}")
    b, n, length, d = query.shape
    width = -(-length // tiles.QUARTERS)
    blocks = _statics(block_sizes or BlockSizes(), backend, length, width)
    keep = dropout_bits.keep_probability(dropout_rate) if dropout_key is not None else 1.0
    if keep == 0.0:
        raise ValueError("flash attention with attention dropout 1.0 drops everything: use a rate below 1")
    static = tiles.Static(
        **blocks,
        scale=float(1.0 / np.sqrt(d)),
        threshold=round((1.0 - keep) * 2**16),
        inverse_keep=float(1.0 / keep),
        backend=backend,
        length=length,
        total_heads=total_heads or n,
    )
    key_words = jnp.zeros((2,), jnp.int32) if dropout_key is None else _key_words(dropout_key)
    scalars = jnp.concatenate([key_words, jnp.asarray(head_offset, jnp.int32).reshape(1)])
    lqp = _round_up(length, static.block_q)
    wp = _round_up(width, static.block_k)

    def quartered(x):  # [B, ..., L, ...] on axis 2 -> [B, ..., 4, Wp, ...]
        pad = [(0, 0)] * x.ndim
        pad[2] = (0, tiles.QUARTERS * width - length)
        x = jnp.pad(x, pad).reshape(*x.shape[:2], tiles.QUARTERS, width, *x.shape[3:])
        pad = [(0, 0)] * x.ndim
        pad[3] = (0, wp - width)
        return jnp.pad(x, pad)

    q = jnp.pad(query, ((0, 0), (0, 0), (0, lqp - length), (0, 0)))
    q_ids = jnp.pad(segment_ids.q.astype(jnp.int32), ((0, 0), (0, lqp - length)))
    kv_ids = quartered(segment_ids.kv.astype(jnp.int32)[:, None, :])[:, 0]
    out = _flash(static, q, quartered(key), quartered(value), q_ids, kv_ids, rows.astype(jnp.int32), scalars)
    return out[:, :, :length]


def is_threefry(key: jax.Array) -> bool:
    """Whether `key` (typed, or raw uint32[2] words) is a threefry key, which the kernel hashes."""
    return (
        not jnp.issubdtype(key.dtype, jax.dtypes.prng_key) or str(jax.random.key_impl(key)) == "threefry2x32"
    )


def _key_words(key: jax.Array) -> jax.Array:
    """[2] int32: a threefry key's two words, bit for bit."""
    if not is_threefry(key):
        raise ValueError(
            f"flash attention draws its dropout with threefry, not {jax.random.key_impl(key)}: set "
            "run.dropout_prng = 'threefry' or EncoderConfig.attention_implementation = 'explicit'"
        )
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return jax.lax.bitcast_convert_type(key.astype(jnp.uint32), jnp.int32).reshape(2)


def flash_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    segment_ids: SegmentIds,
    *,
    dropout_rate: float = 0.0,
    dropout_key: jax.Array | None = None,
    rows: jax.Array | None = None,
    backend: str = "interpret",
    block_sizes: BlockSizes | None = None,
) -> jax.Array:
    """Flash attention on [B, L, N, D] query, key, value -> [B, L, N, D] (value's dtype).

    Args:
      segment_ids: [B, L] int ids of the queries and keys (`SegmentIds`).
      dropout_rate, dropout_key: attention dropout (16-bit masks of models/dropout.py over the
        [B, N, L, L] probabilities); dropout_key None = none.
      rows: [B] int32, the rows' places in the global batch (a microbatch's), default 0..B-1.
      backend, block_sizes: see `flash_attention_heads_first`.

    Under a mesh (jax.set_mesh) the kernel runs per shard in shard_map over rows and heads as
    the logical-axis rules place them (a pallas_call is opaque to XLA's partitioner), each
    shard's dropout counters those of its rows and heads in the global batch.
    """
    b, length, n, _ = query.shape
    if dropout_key is not None and b * n * length >= 2**32:
        raise ValueError(
            f"attention dropout over {b} x {n} x {length} rows does not fit the 32-bit row counter: "
            "use fewer rows per step or attention_implementation = 'explicit' with dropout_bits = 32"
        )
    to_heads_first = functools.partial(jnp.swapaxes, axis1=1, axis2=2)
    kernel_args = dict(
        dropout_rate=dropout_rate, dropout_key=dropout_key, backend=backend, block_sizes=block_sizes
    )
    rows = jnp.arange(b, dtype=jnp.int32) if rows is None else rows

    def attend(q, k, v, q_ids, kv_ids, rows, head_offset=0):
        out = flash_attention_heads_first(
            to_heads_first(q),
            to_heads_first(k),
            to_heads_first(v),
            SegmentIds(q_ids, kv_ids),
            rows=rows,
            head_offset=head_offset,
            total_heads=n,
            **kernel_args,
        )
        return to_heads_first(out)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return attend(query, key, value, segment_ids.q, segment_ids.kv, rows)
    rows_axes, _, heads_axes, _ = sharding.divisible_spec(
        nn.logical_to_mesh_axes((axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV)), query.shape, mesh
    )

    def sharded(q, k, v, q_ids, kv_ids, rows):
        first_head = 0 if heads_axes is None else jax.lax.axis_index(heads_axes) * q.shape[2]
        return attend(q, k, v, q_ids, kv_ids, rows, first_head)

    # Rows and heads only: a shard holds whole sequences (every key its queries attend to).
    per_head = PartitionSpec(rows_axes, None, heads_axes, None)
    per_row = PartitionSpec(rows_axes, None)
    return jax.shard_map(
        sharded,
        in_specs=(per_head, per_head, per_head, per_row, per_row, PartitionSpec(rows_axes)),
        out_specs=per_head,
        check_vma=False,
    )(query, key, value, segment_ids.q, segment_ids.kv, rows)
