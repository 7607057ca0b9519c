"""What both designs of the flash attention kernel compute on a tile (models/flash_attention.py):
the kernels' static settings, the matmuls, the dropout keep masks (models/dropout.py's hash of
each score's counter), the masked logits and the cost estimate given to XLA."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from models import dropout as dropout_bits

#: `backend` of `flash_attention`: the kernel language, or Pallas's interpreter running one
#: of the two designs (any platform; for tests).
BACKENDS = ("tpu", "triton", "interpret", "interpret_triton")
DESIGN = {"tpu": "grid", "interpret": "grid", "triton": "loop", "interpret_triton": "loop"}
# Finite, so that a query with no key to attend (a padding query of a packed row) gives
# no NaN; the explicit path's value (models/attention.py).
MASKED = -0.7 * float(np.finfo(np.float32).max)
QUARTERS = 4  # 16-bit draws per Threefry block (models/dropout.py)
LANES, SUBLANES = 128, 8


@dataclasses.dataclass(frozen=True)
class Static:
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
        return DESIGN[self.backend]


def dot(a: jax.Array, b: jax.Array, *, transpose_b: bool = False) -> jax.Array:
    """a @ b (or a @ b^T), float32 accumulation: the only two matmul forms Mosaic and Triton share."""
    contract = ((1,), (1 if transpose_b else 0,))
    return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32)


def keep(static: Static, key_words, row_base, first_query, first_column, shape, query_axis: int):
    """The keep masks [*shape] of the four quarters of a tile, or None without dropout.

    The tile's counters: rows row_base + first_query + the query index along `query_axis`,
    columns first_column + the index along the other; key_words: the key's two int32 words."""
    if not static.dropout:
        return None
    rows = row_base + first_query + jax.lax.broadcasted_iota(jnp.int32, shape, query_axis)
    columns = first_column + jax.lax.broadcasted_iota(jnp.int32, shape, 1 - query_axis)
    quarters = dropout_bits.quarters(*dropout_bits.threefry2x32(*key_words, rows, columns))
    return [quarter >= static.threshold for quarter in quarters]


def keep_wide(static: Static, key_words, row_base, first_query, rows: int, width: int):
    """The keep mask [rows, 4 * width] of a wide tile (lane c of quarter c // width), or None.

    Every lane hashes its own counter (row, c mod width) and keeps its quarter's 16 bits: the
    same hash work as one [rows, width] grid, which fills a quarter of each vector anyway."""
    if not static.dropout:
        return None
    lane = jax.lax.broadcasted_iota(jnp.int32, (rows, QUARTERS * width), 1)
    quarter = sum((lane >= c * width).astype(jnp.int32) for c in range(1, QUARTERS))
    rows_ = row_base + first_query + jax.lax.broadcasted_iota(jnp.int32, lane.shape, 0)
    words = dropout_bits.threefry2x32(*key_words, rows_, lane - quarter * width)
    q0, q1, q2, q3 = dropout_bits.quarters(*words)
    bits = jnp.where(quarter == 0, q0, jnp.where(quarter == 1, q1, jnp.where(quarter == 2, q2, q3)))
    return bits >= static.threshold


def dropped(probs: jax.Array, keep: jax.Array | None, static: Static) -> jax.Array:
    if keep is None:
        return probs
    return jnp.where(keep, probs * static.inverse_keep, 0.0)


def logits(a: jax.Array, b: jax.Array, query_ids, key_ids, static: Static) -> jax.Array:
    """a @ b^T / sqrt(D), float32, with MASKED where a query may not attend a key (another
    segment id, or a padding key of id 0): [bq, bk] from q, k, or [bk, bq] from k, q. The ids
    broadcast to the tile."""
    allowed = (query_ids == key_ids) & (key_ids != 0)
    return jnp.where(allowed, dot(a, b, transpose_b=True) * static.scale, MASKED)


def lanes(x: jax.Array, width: int) -> jax.Array:
    """A lane-replicated [rows, 128] array as [rows, width]."""
    if width <= LANES:
        return x[:, :width]
    tiled = jnp.tile(x, (1, -(-width // LANES)))
    return tiled if tiled.shape[1] == width else tiled[:, :width]


def cost(flops_per_score: int, q: jax.Array, keys: int, *arrays) -> pl.CostEstimate:
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
