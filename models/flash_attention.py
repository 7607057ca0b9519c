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
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton
from jax.sharding import PartitionSpec

from core import axes, sharding
from core.errors import ConfigError
from models import dropout as dropout_bits

#: `backend` of `flash_attention`: the kernel language, or Pallas's interpreter running one
#: of the two designs (any platform; for tests).
BACKENDS = ("tpu", "triton", "interpret", "interpret_triton")
_DESIGN = {"tpu": "grid", "interpret": "grid", "triton": "loop", "interpret_triton": "loop"}
# Finite, so that a query with no key to attend (a padding query of a packed row) gives
# no NaN; the explicit path's value (models/attention.py).
_MASKED = -0.7 * float(np.finfo(np.float32).max)
_QUARTERS = 4  # 16-bit draws per Threefry block (models/dropout.py)
_LANES, _SUBLANES = 128, 8
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


@dataclasses.dataclass(frozen=True)
class _Static:
    """What the kernels are specialised on (hashable: a custom_vjp's static argument)."""

    block_q: int
    block_k: int
    block_q_backward: int
    block_k_backward: int
    wide: bool  # the grid design's forward and dq passes take a key block's four quarters as one tile
    scale: float  # 1 / sqrt(D)
    threshold: int  # an element is kept when its 16 bits are >= this; 0 = no dropout
    inverse_keep: float  # 1 / keep probability
    backend: str
    length: int  # L: the row counter's stride
    total_heads: int  # N of the whole batch: the row counter's head stride

    @property
    def dropout(self) -> bool:
        return self.threshold > 0

    @property
    def design(self) -> str:
        return _DESIGN[self.backend]


# --- what both designs compute -------------------------------------------------------


def _dot(a: jax.Array, b: jax.Array, *, transpose_b: bool = False) -> jax.Array:
    """a @ b (or a @ b^T), float32 accumulation: the only two matmul forms Mosaic and Triton share."""
    contract = ((1,), (1 if transpose_b else 0,))
    return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32)


def _keep(static: _Static, key_words, row_base, first_query, first_column, shape, query_axis: int):
    """The keep masks [*shape] of the four quarters of a tile, or None without dropout.

    The tile's counters: rows row_base + first_query + the query index along `query_axis`,
    columns first_column + the index along the other; key_words: the key's two int32 words."""
    if not static.dropout:
        return None
    rows = row_base + first_query + jax.lax.broadcasted_iota(jnp.int32, shape, query_axis)
    columns = first_column + jax.lax.broadcasted_iota(jnp.int32, shape, 1 - query_axis)
    quarters = dropout_bits.quarters(*dropout_bits.threefry2x32(*key_words, rows, columns))
    return [quarter >= static.threshold for quarter in quarters]


def _keep_wide(static: _Static, key_words, row_base, first_query, rows: int, width: int):
    """The keep mask [rows, 4 * width] of a wide tile (lane c of quarter c // width), or None.

    Every lane hashes its own counter (row, c mod width) and keeps its quarter's 16 bits: the
    same hash work as one [rows, width] grid, which fills a quarter of each vector anyway."""
    if not static.dropout:
        return None
    lane = jax.lax.broadcasted_iota(jnp.int32, (rows, _QUARTERS * width), 1)
    quarter = sum((lane >= c * width).astype(jnp.int32) for c in range(1, _QUARTERS))
    rows_ = row_base + first_query + jax.lax.broadcasted_iota(jnp.int32, lane.shape, 0)
    words = dropout_bits.threefry2x32(*key_words, rows_, lane - quarter * width)
    q0, q1, q2, q3 = dropout_bits.quarters(*words)
    bits = jnp.where(quarter == 0, q0, jnp.where(quarter == 1, q1, jnp.where(quarter == 2, q2, q3)))
    return bits >= static.threshold


def _dropped(probs: jax.Array, keep: jax.Array | None, static: _Static) -> jax.Array:
    if keep is None:
        return probs
    return jnp.where(keep, probs * static.inverse_keep, 0.0)


def _logits(a: jax.Array, b: jax.Array, query_ids, key_ids, static: _Static) -> jax.Array:
    """a @ b^T / sqrt(D), float32, with MASKED where a query may not attend a key (another
    segment id, or a padding key of id 0): [bq, bk] from q, k, or [bk, bq] from k, q. The ids
    broadcast to the tile."""
    allowed = (query_ids == key_ids) & (key_ids != 0)
    return jnp.where(allowed, _dot(a, b, transpose_b=True) * static.scale, _MASKED)


def _lanes(x: jax.Array, width: int) -> jax.Array:
    """A lane-replicated [rows, 128] array as [rows, width]."""
    if width <= _LANES:
        return x[:, :width]
    tiled = jnp.tile(x, (1, -(-width // _LANES)))
    return tiled if tiled.shape[1] == width else tiled[:, :width]


def _cost(flops_per_score: int, q: jax.Array, keys: int, *arrays) -> pl.CostEstimate:
    """A kernel's cost for XLA: its matmul FLOPs (flops_per_score x D per query-key pair),
    one exponential per pair, and the bytes of its operands and results. The hash's integer
    operations are not counted."""
    b, n, lqp, d = q.shape
    pairs = b * n * lqp * keys
    return pl.CostEstimate(
        flops=flops_per_score * d * pairs,
        transcendentals=pairs,
        bytes_accessed=sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in arrays),
    )


# --- the grid design (TPU) ------------------------------------------------------------


def _row_base(scalars_ref, rows_ref, static: _Static):
    """models/dropout.py's row counter of this program's (row, head) at query 0 (int32, wraps
    as the uint32 counter does)."""
    b, h = pl.program_id(0), pl.program_id(1)
    return (rows_ref[b] * static.total_heads + scalars_ref[2] + h) * static.length


def _grid_forward_kernel(
    scalars_ref,
    rows_ref,
    q_ref,
    k_ref,
    v_ref,
    q_ids_ref,
    kv_ids_ref,
    o_ref,
    lse_ref,
    m_ref,
    l_ref,
    acc_ref,
    *,
    static,
):
    """Query block i, key block j: q [bq, D], k/v [4, bk, D] (wide: [4 bk, D]), q ids [bq, 128]
    lane-replicated, key ids [4, 8, bk] (wide: [8, 4 bk]) sublane-replicated -> o [bq, D], lse
    [bq, 128] float32 at the last j; m, l [bq, 128] and acc [bq, D] are VMEM scratch.

    A query with no key to attend (a padding query of a packed row) gets o = 0 and lse = inf,
    so that the backward pass gives it p = 0 everywhere: gradients of its output are 0."""
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _start():
        m_ref[...] = jnp.full(m_ref.shape, _MASKED, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def online_softmax(s, keep, v):
        m_prev, l_prev = m_ref[...], l_ref[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - _lanes(m_next, s.shape[1]))
        rescale = jnp.exp(m_prev - m_next)
        l_ref[...] = rescale * l_prev + jnp.sum(
            p, axis=1, keepdims=True
        )  # the softmax's sum is before dropout
        m_ref[...] = m_next
        p = _dropped(p, keep, static)
        acc_ref[...] = acc_ref[...] * _lanes(rescale, v.shape[-1]) + _dot(p.astype(v.dtype), v)

    bq, bk = static.block_q, static.block_k
    q, q_ids = q_ref[...], q_ids_ref[...]
    key_words, row_base = (scalars_ref[0], scalars_ref[1]), _row_base(scalars_ref, rows_ref, static)
    if static.wide:
        keys = k_ref.shape[0]
        keep = _keep_wide(static, key_words, row_base, i * bq, bq, keys // _QUARTERS)
        s = _logits(q, k_ref[...], _lanes(q_ids, keys), kv_ids_ref[:1, :], static)
        online_softmax(s, keep, v_ref[...])
    else:
        keep = _keep(static, key_words, row_base, i * bq, j * bk, (bq, bk), 0)
        for c in range(_QUARTERS):
            s = _logits(q, k_ref[c], _lanes(q_ids, bk), kv_ids_ref[c, :1, :], static)
            online_softmax(s, None if keep is None else keep[c], v_ref[c])

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        m, l = m_ref[...], l_ref[...]
        empty = m == _MASKED  # every logit was masked: no key to attend
        d = acc_ref.shape[-1]
        o_ref[...] = jnp.where(_lanes(empty, d), 0.0, acc_ref[...] / _lanes(l, d)).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log(l))


def _grid_key_grads_kernel(
    scalars_ref,
    rows_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    q_ids_ref,
    kv_ids_ref,
    dk_ref,
    dv_ref,
    dk_acc,
    dv_acc,
    *,
    static,
):
    """Key block j (in each quarter), query block i: tiles are [bk, bq] (keys by queries) so
    that dv += p^T do and dk += ds^T q are plain matmuls. q, do [bq, D]; lse, delta [1, bq]
    rows; q ids [8, bq] sublane-replicated; key ids [4, bk, 128] lane-replicated; dk, dv
    [4, bk, D] accumulate in VMEM scratch over i."""
    j, i = pl.program_id(2), pl.program_id(3)
    bq, bk = static.block_q_backward, static.block_k_backward

    @pl.when(i == 0)
    def _start():
        dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    key_words, row_base = (scalars_ref[0], scalars_ref[1]), _row_base(scalars_ref, rows_ref, static)
    keep = _keep(static, key_words, row_base, i * bq, j * bk, (bk, bq), 1)
    for c in range(_QUARTERS):
        s = _logits(k_ref[c], q, q_ids_ref[:1, :], _lanes(kv_ids_ref[c], bq), static)
        p = jnp.exp(s - lse)
        keep_c = None if keep is None else keep[c]
        dv_acc[c] = dv_acc[c] + _dot(_dropped(p, keep_c, static).astype(do.dtype), do)
        ds = p * (_dropped(_dot(v_ref[c], do, transpose_b=True), keep_c, static) - delta)
        dk_acc[c] = dk_acc[c] + _dot(ds.astype(q.dtype), q) * static.scale

    @pl.when(i == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _grid_query_grads_kernel(
    scalars_ref,
    rows_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    q_ids_ref,
    kv_ids_ref,
    dq_ref,
    dq_acc,
    *,
    static,
):
    """Query block i, key block j: q, do [bq, D], lse, delta [bq, 128] lane-replicated, keys as
    in the forward pass -> dq [bq, D], accumulated in VMEM scratch over j."""
    i, j = pl.program_id(2), pl.program_id(3)
    bq, bk = static.block_q, static.block_k

    @pl.when(j == 0)
    def _start():
        dq_acc[...] = jnp.zeros(dq_acc.shape, jnp.float32)

    def accumulate(s, keep, k, v):
        p = jnp.exp(s - _lanes(lse, s.shape[1]))
        dp = _dropped(_dot(do, v, transpose_b=True), keep, static)
        ds = p * (dp - _lanes(delta, s.shape[1]))
        dq_acc[...] = dq_acc[...] + _dot(ds.astype(k.dtype), k) * static.scale

    q, do, lse, delta, q_ids = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...], q_ids_ref[...]
    key_words, row_base = (scalars_ref[0], scalars_ref[1]), _row_base(scalars_ref, rows_ref, static)
    if static.wide:
        keys = k_ref.shape[0]
        keep = _keep_wide(static, key_words, row_base, i * bq, bq, keys // _QUARTERS)
        k = k_ref[...]
        accumulate(_logits(q, k, _lanes(q_ids, keys), kv_ids_ref[:1, :], static), keep, k, v_ref[...])
    else:
        keep = _keep(static, key_words, row_base, i * bq, j * bk, (bq, bk), 0)
        for c in range(_QUARTERS):
            s = _logits(q, k_ref[c], _lanes(q_ids, bk), kv_ids_ref[c, :1, :], static)
            accumulate(s, None if keep is None else keep[c], k_ref[c], v_ref[c])

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = dq_acc[...].astype(dq_ref.dtype)


def _grid_call(kernel, static: _Static, grid, in_specs, out_specs, out_shape, scratch, cost, *args):
    """A grid-design pallas_call: two scalar-prefetch operands (the key words and head offset,
    each row's place) first, the last grid dimension sequential."""
    params = None
    if static.backend == "tpu":
        params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))
    return pl.pallas_call(
        functools.partial(kernel, static=static),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            scratch_shapes=[pltpu.VMEM(shape, jnp.float32) for shape in scratch],
        ),
        out_shape=out_shape,
        compiler_params=params,
        cost_estimate=cost,
        interpret=static.backend == "interpret",
    )(*args)


def _spec(block, index):
    return pl.BlockSpec(block, lambda *grid: index(*grid[:4]))


def _lane_ids(ids: jax.Array) -> jax.Array:
    """[B, L] -> [B, L, 128]: each id replicated across the lanes (a query's id as a column)."""
    return jnp.broadcast_to(ids[..., None], (*ids.shape, _LANES))


def _sublane_ids(ids: jax.Array) -> jax.Array:
    """[..., L] -> [..., 8, L]: each id replicated across the sublanes (ids as a row)."""
    return jnp.broadcast_to(ids[..., None, :], (*ids.shape[:-1], _SUBLANES, ids.shape[-1]))


def _grid_keys(static: _Static, k, v, kv_ids):
    """The keys of the forward and dq passes as their kernels take them, with their specs
    (grid (b, h, i, j)): k, v [B, N, 4, Wp, D] by key block j, ids [B, 4, 8, Wp]; wide, one
    block of all four quarters: k, v [B, N, 4 Wp, D], ids [B, 8, 4 Wp] (the same order)."""
    b, n, _, wp, d = k.shape
    if static.wide:
        k, v = (x.reshape(b, n, _QUARTERS * wp, d) for x in (k, v))
        kv_spec = _spec((None, None, _QUARTERS * wp, d), lambda b, h, i, j: (b, h, 0, 0))
        ids_spec = _spec((None, _SUBLANES, _QUARTERS * wp), lambda b, h, i, j: (b, 0, 0))
        return k, v, _sublane_ids(kv_ids.reshape(b, _QUARTERS * wp)), kv_spec, ids_spec
    bk = static.block_k
    kv_spec = _spec((None, None, _QUARTERS, bk, d), lambda b, h, i, j: (b, h, 0, j, 0))
    ids_spec = _spec((None, _QUARTERS, _SUBLANES, bk), lambda b, h, i, j: (b, 0, 0, j))
    return k, v, _sublane_ids(kv_ids), kv_spec, ids_spec


def _grid_forward(static: _Static, q, k, v, q_ids, kv_ids, rows, scalars):
    """q [B, N, Lqp, D], k/v [B, N, 4, Wp, D], ids [B, Lqp] and [B, 4, Wp] -> o [B, N, Lqp, D],
    lse [B, N, Lqp, 1] float32: the kernel writes it lane-replicated, one lane is kept (a
    residual of the backward pass, 128 times smaller; jax's kernel keeps its l and m so)."""
    b, n, lqp, d = q.shape
    wp = k.shape[3]
    bq, bk = static.block_q, static.block_k
    q_spec = _spec((None, None, bq, d), lambda b, h, i, j: (b, h, i, 0))
    lse_spec = _spec((None, None, bq, _LANES), lambda b, h, i, j: (b, h, i, 0))
    q_ids_spec = _spec((None, bq, _LANES), lambda b, h, i, j: (b, i, 0))
    k, v, kv_ids, kv_spec, kv_ids_spec = _grid_keys(static, k, v, kv_ids)
    out_shape = [
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct((b, n, lqp, _LANES), jnp.float32),
    ]
    q_ids = _lane_ids(q_ids)
    with jax.named_scope("flash_attention_forward"):
        o, lse = _grid_call(
            _grid_forward_kernel,
            static,
            (b, n, lqp // bq, 1 if static.wide else wp // bk),
            [q_spec, kv_spec, kv_spec, q_ids_spec, kv_ids_spec],
            [q_spec, lse_spec],
            out_shape,
            [(bq, _LANES), (bq, _LANES), (bq, d)],
            _cost(4, q, _QUARTERS * wp, q, k, v, q_ids, kv_ids, *out_shape),
            scalars,
            rows,
            q,
            k,
            v,
            q_ids,
            kv_ids,
        )
    return o, lse[..., :1]


def _grid_backward(static: _Static, residuals, do):
    q, k, v, q_ids, kv_ids, rows, scalars, o, lse = residuals
    b, n, lqp, d = q.shape
    wp = k.shape[3]
    # With dropout too: sum_s p_ts dp_ts = do_t . o_t (FlashAttention-2's D term).
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
    bq, bk = static.block_q_backward, static.block_k_backward
    row_spec = _spec((None, None, 1, bq), lambda b, h, j, i: (b, h, 0, i))
    block_kv = _spec((None, None, _QUARTERS, bk, d), lambda b, h, j, i: (b, h, 0, j, 0))
    block_q = _spec((None, None, bq, d), lambda b, h, j, i: (b, h, i, 0))
    key_grads_in = (
        q,
        k,
        v,
        do,
        lse.swapaxes(2, 3),
        delta.swapaxes(2, 3),
        _sublane_ids(q_ids),
        jnp.broadcast_to(kv_ids[..., None], (*kv_ids.shape, _LANES)),
    )
    kv_shapes = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    with jax.named_scope("flash_attention_key_grads"):
        dk, dv = _grid_call(
            _grid_key_grads_kernel,
            static,
            (b, n, wp // bk, lqp // bq),
            [
                block_q,
                block_kv,
                block_kv,
                block_q,
                row_spec,
                row_spec,
                _spec((None, _SUBLANES, bq), lambda b, h, j, i: (b, 0, i)),
                _spec((None, _QUARTERS, bk, _LANES), lambda b, h, j, i: (b, 0, j, 0)),
            ],
            [block_kv, block_kv],
            kv_shapes,
            [(_QUARTERS, bk, d), (_QUARTERS, bk, d)],
            _cost(8, q, _QUARTERS * wp, *key_grads_in, *kv_shapes),
            scalars,
            rows,
            *key_grads_in,
        )
    lanes = (b, n, lqp, _LANES)
    (dq,) = _grid_dq(
        static,
        q,
        k,
        v,
        do,
        jnp.broadcast_to(lse, lanes),
        jnp.broadcast_to(delta, lanes),
        q_ids,
        kv_ids,
        rows,
        scalars,
    )
    return dq, dk, dv


def _grid_dq(static: _Static, q, k, v, do, lse, delta, q_ids, kv_ids, rows, scalars):
    """dq [B, N, Lqp, D] from lse and delta [B, N, Lqp, 128] lane-replicated; the keys' specs as
    the forward pass's."""
    b, n, lqp, d = q.shape
    wp = k.shape[3]
    bq, bk = static.block_q, static.block_k
    q_spec = _spec((None, None, bq, d), lambda b, h, i, j: (b, h, i, 0))
    lse_spec = _spec((None, None, bq, _LANES), lambda b, h, i, j: (b, h, i, 0))
    k, v, kv_ids, kv_spec, kv_ids_spec = _grid_keys(static, k, v, kv_ids)
    inputs = (q, k, v, do, lse, delta, _lane_ids(q_ids), kv_ids)
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    with jax.named_scope("flash_attention_query_grads"):
        return _grid_call(
            _grid_query_grads_kernel,
            static,
            (b, n, lqp // bq, 1 if static.wide else wp // bk),
            [
                q_spec,
                kv_spec,
                kv_spec,
                q_spec,
                lse_spec,
                lse_spec,
                _spec((None, bq, _LANES), lambda b, h, i, j: (b, i, 0)),
                kv_ids_spec,
            ],
            [q_spec],
            out_shape,
            [(bq, d)],
            _cost(6, q, _QUARTERS * wp, *inputs, *out_shape),
            scalars,
            rows,
            *inputs,
        )


# --- the loop design (GPU: Triton) ------------------------------------------------------


def _loop(blocks: int, body, init):
    """fori_loop over `blocks` (a Python int); one block runs once with a static index, so a
    row that fits one block slices its refs statically."""
    return body(0, init) if blocks == 1 else jax.lax.fori_loop(0, blocks, body, init)


def _start(index, block: int):
    return index * block if isinstance(index, int) else pl.multiple_of(index * block, block)


def _loop_forward_kernel(
    q_ref, k_ref, v_ref, q_ids_ref, kv_ids_ref, row_base_ref, k1_ref, k2_ref, o_ref, lse_ref, *, static
):
    """One block of queries: q [bq, D], k/v [4, Wp, D] -> o [bq, D], lse [bq, 1] float32 (a
    query with no key to attend: o = 0, lse = inf, as in the grid design)."""
    bq, bk = static.block_q, static.block_k
    q, q_ids = q_ref[...], q_ids_ref[...]  # [bq, D], [bq, 1]
    key_words, row_base, first_query = (k1_ref[...], k2_ref[...]), row_base_ref[...], pl.program_id(2) * bq

    def body(j, carry):
        m, l, acc = carry  # [bq, 1], [bq, 1], [bq, D] float32
        start = _start(j, bk)
        keep = _keep(static, key_words, row_base, first_query, start, (bq, bk), 0)
        for c in range(_QUARTERS):
            keys = pl.ds(start, bk)
            s = _logits(q, k_ref[c, keys, :], q_ids, kv_ids_ref[c, :, keys], static)
            m_next = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
            rescale = jnp.exp(m - m_next)
            p = jnp.exp(s - m_next)
            l = rescale * l + jnp.sum(p, axis=1, keepdims=True)  # the softmax's sum is before dropout
            p = _dropped(p, None if keep is None else keep[c], static)
            acc = rescale * acc + _dot(p.astype(v_ref.dtype), v_ref[c, keys, :])
            m = m_next
        return m, l, acc

    init = (
        jnp.full((bq, 1), _MASKED, jnp.float32),
        jnp.zeros((bq, 1), jnp.float32),
        jnp.zeros((bq, q.shape[-1]), jnp.float32),
    )
    m, l, acc = _loop(k_ref.shape[1] // bk, body, init)
    empty = m == _MASKED
    o_ref[...] = jnp.where(empty, 0.0, acc / l).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log(l))


def _loop_key_grads_kernel(
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    q_ids_ref,
    kv_ids_ref,
    row_base_ref,
    k1_ref,
    k2_ref,
    dk_ref,
    dv_ref,
    *,
    static,
):
    """One key block (in each quarter), all queries: tiles [bk, bq] (keys by queries); lse,
    delta and the query ids [1, Lqp] as rows, the key ids [4, bk, 1] as columns."""
    bq, bk = static.block_q_backward, static.block_k_backward
    first_column, row_base = pl.program_id(2) * bk, row_base_ref[...]
    key_words = (k1_ref[...], k2_ref[...])
    keys = [k_ref[c] for c in range(_QUARTERS)]
    values = [v_ref[c] for c in range(_QUARTERS)]
    key_ids = [kv_ids_ref[c] for c in range(_QUARTERS)]

    def body(i, carry):
        dks, dvs = list(carry[0]), list(carry[1])
        start = _start(i, bq)
        queries = pl.ds(start, bq)
        q, do = q_ref[queries, :], do_ref[queries, :]
        lse, delta = lse_ref[:, queries], delta_ref[:, queries]  # [1, bq]
        keep = _keep(static, key_words, row_base, start, first_column, (bk, bq), 1)
        for c in range(_QUARTERS):
            keep_c = None if keep is None else keep[c]
            s = _logits(keys[c], q, q_ids_ref[:, queries], key_ids[c], static)
            p = jnp.exp(s - lse)
            dvs[c] = dvs[c] + _dot(_dropped(p, keep_c, static).astype(do.dtype), do)
            ds = p * (_dropped(_dot(values[c], do, transpose_b=True), keep_c, static) - delta)
            dks[c] = dks[c] + _dot(ds.astype(q.dtype), q) * static.scale
        return tuple(dks), tuple(dvs)

    zeros = tuple(jnp.zeros(keys[0].shape, jnp.float32) for _ in range(_QUARTERS))
    dks, dvs = _loop(q_ref.shape[0] // bq, body, (zeros, zeros))
    for c in range(_QUARTERS):
        dk_ref[c] = dks[c].astype(dk_ref.dtype)
        dv_ref[c] = dvs[c].astype(dv_ref.dtype)


def _loop_query_grads_kernel(
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    q_ids_ref,
    kv_ids_ref,
    row_base_ref,
    k1_ref,
    k2_ref,
    dq_ref,
    *,
    static,
):
    """One block of queries: q, do [bq, D], lse, delta [bq, 1], all keys -> dq [bq, D]."""
    bq, bk = static.block_q, static.block_k
    q, do, lse, delta, q_ids = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...], q_ids_ref[...]
    key_words, row_base, first_query = (k1_ref[...], k2_ref[...]), row_base_ref[...], pl.program_id(2) * bq

    def body(j, dq):
        start = _start(j, bk)
        keep = _keep(static, key_words, row_base, first_query, start, (bq, bk), 0)
        for c in range(_QUARTERS):
            keys = pl.ds(start, bk)
            k = k_ref[c, keys, :]
            s = _logits(q, k, q_ids, kv_ids_ref[c, :, keys], static)
            p = jnp.exp(s - lse)
            dp = _dropped(
                _dot(do, v_ref[c, keys, :], transpose_b=True), None if keep is None else keep[c], static
            )
            dq = dq + _dot((p * (dp - delta)).astype(k.dtype), k) * static.scale
        return dq

    dq = _loop(k_ref.shape[1] // bk, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


def _loop_call(kernel, static: _Static, grid, in_specs, out_specs, out_shape, cost, *args):
    params = pltriton.CompilerParams(num_warps=4, num_stages=2) if static.backend == "triton" else None
    return pl.pallas_call(
        functools.partial(kernel, static=static),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=params,
        cost_estimate=cost,
        interpret=static.backend == "interpret_triton",
    )(*args)


def _loop_specs(static: _Static, q: jax.Array, k: jax.Array, block_q: int, block_k: int):
    """BlockSpecs of the loop design's kernels, indexed by (row, head, block)."""
    _, _, lqp, d = q.shape
    wp = k.shape[3]
    whole = {
        "q": pl.BlockSpec((None, None, lqp, d), lambda b, h, n: (b, h, 0, 0)),
        "kv": pl.BlockSpec((None, None, _QUARTERS, wp, d), lambda b, h, n: (b, h, 0, 0, 0)),
        "row_base": pl.BlockSpec((None, None, 1, 1), lambda b, h, n: (b, h, 0, 0)),
        "key_word": pl.BlockSpec((1, 1), lambda b, h, n: (0, 0)),
        "lse_row": pl.BlockSpec((None, None, 1, lqp), lambda b, h, n: (b, h, 0, 0)),
        "q_ids_row": pl.BlockSpec((None, 1, lqp), lambda b, h, n: (b, 0, 0)),
        "kv_ids_row": pl.BlockSpec((None, _QUARTERS, 1, wp), lambda b, h, n: (b, 0, 0, 0)),
    }
    block = {
        "q": pl.BlockSpec((None, None, block_q, d), lambda b, h, n: (b, h, n, 0)),
        "lse_column": pl.BlockSpec((None, None, block_q, 1), lambda b, h, n: (b, h, n, 0)),
        "q_ids_column": pl.BlockSpec((None, block_q, 1), lambda b, h, n: (b, n, 0)),
        "kv": pl.BlockSpec((None, None, _QUARTERS, block_k, d), lambda b, h, n: (b, h, 0, n, 0)),
        "kv_ids_column": pl.BlockSpec((None, _QUARTERS, block_k, 1), lambda b, h, n: (b, 0, n, 0)),
    }
    return whole, block


def _loop_scalars(static: _Static, q, rows, scalars):
    """The row counters [B, N, 1, 1] and the key's words [1, 1] as the loop kernels take them."""
    n = q.shape[1]
    heads = jnp.arange(n, dtype=jnp.int32)[None, :] + scalars[2]
    row_base = (rows[:, None] * static.total_heads + heads) * static.length
    return row_base[..., None, None], scalars[0].reshape(1, 1), scalars[1].reshape(1, 1)


def _loop_forward(static: _Static, q, k, v, q_ids, kv_ids, rows, scalars):
    """As `_grid_forward`, lse [B, N, Lqp, 1]."""
    b, n, lqp, d = q.shape
    whole, block = _loop_specs(static, q, k, static.block_q, static.block_k)
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, n, lqp, 1), jnp.float32)]
    inputs = (q, k, v, q_ids[..., None], kv_ids[:, :, None, :], *_loop_scalars(static, q, rows, scalars))
    with jax.named_scope("flash_attention_forward"):
        return _loop_call(
            _loop_forward_kernel,
            static,
            (b, n, lqp // static.block_q),
            [
                block["q"],
                whole["kv"],
                whole["kv"],
                block["q_ids_column"],
                whole["kv_ids_row"],
                whole["row_base"],
                whole["key_word"],
                whole["key_word"],
            ],
            [block["q"], block["lse_column"]],
            out_shape,
            _cost(4, q, _QUARTERS * k.shape[3], *inputs, *out_shape),
            *inputs,
        )


def _loop_backward(static: _Static, residuals, do):
    q, k, v, q_ids, kv_ids, rows, scalars, o, lse = residuals
    b, n, lqp, _ = q.shape
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
    bq, bk = static.block_q_backward, static.block_k_backward
    whole, block = _loop_specs(static, q, k, bq, bk)
    row_base, k1, k2 = _loop_scalars(static, q, rows, scalars)
    key_grads_in = (
        q,
        k,
        v,
        do,
        lse.swapaxes(2, 3),
        delta.swapaxes(2, 3),
        q_ids[:, None, :],
        kv_ids[..., None],
        row_base,
        k1,
        k2,
    )
    kv_shapes = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    with jax.named_scope("flash_attention_key_grads"):
        dk, dv = _loop_call(
            _loop_key_grads_kernel,
            static,
            (b, n, k.shape[3] // bk),
            [
                whole["q"],
                block["kv"],
                block["kv"],
                whole["q"],
                whole["lse_row"],
                whole["lse_row"],
                whole["q_ids_row"],
                block["kv_ids_column"],
                whole["row_base"],
                whole["key_word"],
                whole["key_word"],
            ],
            [block["kv"], block["kv"]],
            kv_shapes,
            _cost(8, q, _QUARTERS * k.shape[3], *key_grads_in, *kv_shapes),
            *key_grads_in,
        )
    whole, block = _loop_specs(static, q, k, static.block_q, static.block_k)
    query_grads_in = (q, k, v, do, lse, delta, q_ids[..., None], kv_ids[:, :, None, :], row_base, k1, k2)
    out_shape = jax.ShapeDtypeStruct(q.shape, q.dtype)
    with jax.named_scope("flash_attention_query_grads"):
        dq = _loop_call(
            _loop_query_grads_kernel,
            static,
            (b, n, lqp // static.block_q),
            [
                block["q"],
                whole["kv"],
                whole["kv"],
                block["q"],
                block["lse_column"],
                block["lse_column"],
                block["q_ids_column"],
                whole["kv_ids_row"],
                whole["row_base"],
                whole["key_word"],
                whole["key_word"],
            ],
            block["q"],
            out_shape,
            _cost(6, q, _QUARTERS * k.shape[3], *query_grads_in, out_shape),
            *query_grads_in,
        )
    return dq, dk, dv


# --- the custom VJP and the public functions -------------------------------------------

_FORWARD = {"grid": _grid_forward, "loop": _loop_forward}
_BACKWARD = {"grid": _grid_backward, "loop": _loop_backward}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(static: _Static, q, k, v, q_ids, kv_ids, rows, scalars):
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
    pow2 = _DESIGN[backend] == "loop"  # Triton's tensor shapes are powers of two (and dots >= 16)
    if requested is not None:
        if pow2 and (requested < 16 or requested & (requested - 1)):
            raise ValueError(
                f"flash attention {name} must be a power of two >= 16 on {backend}, got {requested}"
            )
        # Mosaic tiles: a block along lanes is a multiple of 128, or the whole (padded) row.
        if backend == "tpu" and requested % _LANES and requested < extent:
            raise ValueError(
                f"flash attention {name} must be a multiple of {_LANES} or cover the row ({extent}) on tpu, "
                f"got {requested}"
            )
        return requested
    block = _round_up(extent, 16 if pow2 else 8)
    if pow2:
        block = 1 << (block - 1).bit_length()
    return min(maximum, block)


def _statics(sizes: BlockSizes, backend: str, length: int, width: int) -> dict:
    """The blocks and the wide-keys choice for a row of `length` (`width` keys per quarter)."""
    largest = _LARGEST[_DESIGN[backend]]
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
        wide = _DESIGN[backend] == "grid" and one_key_block and _QUARTERS * block_k <= _LANES
    if wide and (_DESIGN[backend] != "grid" or not one_key_block):
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
    width = -(-length // _QUARTERS)
    blocks = _statics(block_sizes or BlockSizes(), backend, length, width)
    keep = dropout_bits.keep_probability(dropout_rate) if dropout_key is not None else 1.0
    if keep == 0.0:
        raise ValueError("flash attention with attention dropout 1.0 drops everything: use a rate below 1")
    static = _Static(
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
        pad[2] = (0, _QUARTERS * width - length)
        x = jnp.pad(x, pad).reshape(*x.shape[:2], _QUARTERS, width, *x.shape[3:])
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
