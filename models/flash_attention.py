"""Flash attention with BERT's attention dropout: one Pallas kernel for TPU (Mosaic) and GPU (Triton).

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
uninterrupted run drew. Switching a run between 'explicit' and 'flash' changes float rounding, not the
dropout. The cost is the hash: 20 rounds of integer adds, rotations and xors per four
elements, on the vector units, beside the exponentials.

Tiling. The keys are laid out as 4 quarters of W (padded to a multiple of the key block):
one program of the forward pass holds a block of queries and walks the key blocks j, and at
each j hashes one [block_q, block_k] grid of counters whose four quarters are the dropout
bits of the four key blocks (quarter c, block j): every hashed bit is used and none crosses
a lane. The backward pass is two kernels, one per key block (dk, dv; its tiles are
transposed, keys by queries, so that it needs only plain and rhs-transposed matmuls) and one
per query block (dq). Blocks are the smallest that cover the row, up to a size per backend
(`_BLOCKS`, `_BACKWARD_BLOCKS`). Each program's block spec holds its whole row of keys and
values (or queries): on a TPU that row sits in VMEM (about 512 KiB at L = 512, D = 64 in
bf16, double-buffered and padded to 128 lanes), on a GPU tiles are read as the loop needs
them. docs/performance.md says what only a device run can check.

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

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton
from jax.sharding import PartitionSpec

from core import axes, sharding
from models import dropout as dropout_bits

#: `backend` of `flash_attention`: the kernel language, or Pallas's interpreter (any platform).
BACKENDS = ("tpu", "triton", "interpret")
# Finite, so that a query with no key to attend (a padding query of a packed row) gives
# no NaN; the explicit path's value (models/attention.py).
_MASKED = -0.7 * float(np.finfo(np.float32).max)
_QUARTERS = 4  # 16-bit draws per Threefry block (models/dropout.py)
# Largest blocks (queries, keys per quarter) by backend: TPU tiles are 128 lanes wide (and
# the dk/dv tiles put queries on lanes); Triton keeps a tile and two words of hash per tile
# in registers, and its dk/dv programs carry eight accumulators (dk and dv per quarter), so
# their blocks are smaller. The mask does not depend on the blocks.
_BLOCKS = {"tpu": (128, 128), "triton": (64, 64), "interpret": (128, 128)}
_BACKWARD_BLOCKS = {"tpu": (128, 128), "triton": (32, 32), "interpret": (128, 128)}


@dataclasses.dataclass(frozen=True)
class _Static:
    """What the kernels are specialised on (hashable: a custom_vjp's static argument)."""

    block_q: int
    block_k: int
    scale: float  # 1 / sqrt(D)
    threshold: int  # an element is kept when its 16 bits are >= this; 0 = no dropout
    inverse_keep: float  # 1 / keep probability
    backend: str

    @property
    def dropout(self) -> bool:
        return self.threshold > 0


def _dot(a: jax.Array, b: jax.Array, *, transpose_b: bool = False) -> jax.Array:
    """a @ b (or a @ b^T), float32 accumulation: the only two matmul forms Mosaic and Triton share."""
    contract = ((1,), (1 if transpose_b else 0,))
    return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32)


def _keep(
    static: _Static, key_refs, row_base, first_query, first_column, shape: tuple[int, int], query_axis: int
) -> list[jax.Array] | None:
    """The keep masks [*shape] of the four quarters of a tile, or None without dropout.

    The tile's counters: rows row_base + first_query + the query index along `query_axis`,
    columns first_column + the key block index along the other axis. key_refs: the key's two
    words, [1, 1] int32 each; row_base [1, 1] int32 (models/dropout.py's row counter of query 0).
    """
    if not static.dropout:
        return None
    rows = row_base + first_query + jax.lax.broadcasted_iota(jnp.int32, shape, query_axis)
    columns = first_column + jax.lax.broadcasted_iota(jnp.int32, shape, 1 - query_axis)
    y1, y2 = dropout_bits.threefry2x32(key_refs[0][...], key_refs[1][...], rows, columns)
    return [quarter >= static.threshold for quarter in dropout_bits.quarters(y1, y2)]


def _dropped(probs: jax.Array, keep: list[jax.Array] | None, quarter: int, static: _Static) -> jax.Array:
    if keep is None:
        return probs
    return jnp.where(keep[quarter], probs * static.inverse_keep, 0.0)


def _logits(
    a: jax.Array, b: jax.Array, query_ids: jax.Array, key_ids: jax.Array, static: _Static
) -> jax.Array:
    """a @ b^T / sqrt(D), float32, with MASKED where a query may not attend a key (another
    segment id, or a padding key of id 0): [bq, bk] from q, k, or [bk, bq] from k, q."""
    allowed = (query_ids == key_ids) & (key_ids != 0)
    return jnp.where(allowed, _dot(a, b, transpose_b=True) * static.scale, _MASKED)


def _loop(blocks: int, body, init):
    """fori_loop over `blocks` (a Python int); one block runs once with a static index, so a
    row that fits one block slices its refs statically."""
    return body(0, init) if blocks == 1 else jax.lax.fori_loop(0, blocks, body, init)


def _start(index, block: int):
    return index * block if isinstance(index, int) else pl.multiple_of(index * block, block)


def _forward_kernel(
    q_ref,
    k_ref,
    v_ref,
    q_ids_ref,
    kv_ids_ref,
    row_base_ref,
    k1_ref,
    k2_ref,
    o_ref,
    lse_ref,
    *,
    static: _Static,
):
    """One block of queries: q [bq, D], k/v [4, Wp, D] -> o [bq, D], lse [bq, 1] float32.

    A query with no key to attend (a padding query of a packed row) gets o = 0 and lse = inf,
    so that the backward pass gives it p = 0 everywhere: gradients of its output are 0.
    """
    bq, bk = static.block_q, static.block_k
    q = q_ref[...]
    q_ids = q_ids_ref[...]  # [bq, 1]
    row_base, first_query = row_base_ref[...], pl.program_id(2) * bq

    def body(j, carry):
        m, l, acc = carry  # [bq, 1], [bq, 1], [bq, D] float32
        start = _start(j, bk)
        keep = _keep(static, (k1_ref, k2_ref), row_base, first_query, start, (bq, bk), 0)
        for c in range(_QUARTERS):
            keys = pl.ds(start, bk)
            s = _logits(q, k_ref[c, keys, :], q_ids, kv_ids_ref[c, :, keys], static)
            m_next = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
            rescale = jnp.exp(m - m_next)
            p = jnp.exp(s - m_next)
            l = rescale * l + jnp.sum(p, axis=1, keepdims=True)  # the softmax's sum is before dropout
            p = _dropped(p, keep, c, static)
            acc = rescale * acc + _dot(p.astype(v_ref.dtype), v_ref[c, keys, :])
            m = m_next
        return m, l, acc

    width = k_ref.shape[1]
    init = (
        jnp.full((bq, 1), _MASKED, jnp.float32),
        jnp.zeros((bq, 1), jnp.float32),
        jnp.zeros((bq, q.shape[-1]), jnp.float32),
    )
    m, l, acc = _loop(width // bk, body, init)
    empty = m == _MASKED  # every logit was masked: no key to attend
    o_ref[...] = jnp.where(empty, 0.0, acc / l).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log(l))


def _key_grads_kernel(
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
    static: _Static,
):
    """One key block (in each quarter): k/v [4, bk, D], all queries -> dk, dv [4, bk, D].

    Tiles are [bk, bq] (keys by queries) so that dv += p^T do and dk += ds^T q are plain matmuls;
    lse, delta [1, Lqp] and the query ids [1, Lqp] come as rows, the key ids [4, bk, 1] as columns.
    """
    bq, bk = static.block_q, static.block_k
    first_column, row_base = pl.program_id(2) * bk, row_base_ref[...]
    keys = [k_ref[c] for c in range(_QUARTERS)]
    values = [v_ref[c] for c in range(_QUARTERS)]
    key_ids = [kv_ids_ref[c] for c in range(_QUARTERS)]

    def body(i, carry):
        dks, dvs = carry
        start = _start(i, bq)
        queries = pl.ds(start, bq)
        q, do = q_ref[queries, :], do_ref[queries, :]
        lse, delta = lse_ref[:, queries], delta_ref[:, queries]  # [1, bq]
        keep = _keep(static, (k1_ref, k2_ref), row_base, start, first_column, (bk, bq), 1)
        dks, dvs = list(dks), list(dvs)
        for c in range(_QUARTERS):
            s = _logits(keys[c], q, q_ids_ref[:, queries], key_ids[c], static)
            p = jnp.exp(s - lse)
            dvs[c] = dvs[c] + _dot(_dropped(p, keep, c, static).astype(do.dtype), do)
            dp = _dropped(_dot(values[c], do, transpose_b=True), keep, c, static)
            ds = p * (dp - delta)
            dks[c] = dks[c] + _dot(ds.astype(q.dtype), q) * static.scale
        return tuple(dks), tuple(dvs)

    zeros = tuple(jnp.zeros(keys[0].shape, jnp.float32) for _ in range(_QUARTERS))
    dks, dvs = _loop(q_ref.shape[0] // bq, body, (zeros, zeros))
    for c in range(_QUARTERS):
        dk_ref[c] = dks[c].astype(dk_ref.dtype)
        dv_ref[c] = dvs[c].astype(dv_ref.dtype)


def _query_grads_kernel(
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
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    q_ids = q_ids_ref[...]
    row_base, first_query = row_base_ref[...], pl.program_id(2) * bq

    def body(j, dq):
        start = _start(j, bk)
        keep = _keep(static, (k1_ref, k2_ref), row_base, first_query, start, (bq, bk), 0)
        for c in range(_QUARTERS):
            keys = pl.ds(start, bk)
            k = k_ref[c, keys, :]
            s = _logits(q, k, q_ids, kv_ids_ref[c, :, keys], static)
            p = jnp.exp(s - lse)
            dp = _dropped(_dot(do, v_ref[c, keys, :], transpose_b=True), keep, c, static)
            dq = dq + _dot((p * (dp - delta)).astype(k.dtype), k) * static.scale
        return dq

    dq = _loop(k_ref.shape[1] // bk, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


def _call(kernel, static: _Static, grid, in_specs, out_specs, out_shape, *args):
    params = {
        "tpu": lambda: pltpu.CompilerParams(dimension_semantics=("parallel",) * len(grid)),
        "triton": lambda: pltriton.CompilerParams(num_warps=4, num_stages=2),
        "interpret": lambda: None,
    }[static.backend]()
    return pl.pallas_call(
        functools.partial(kernel, static=static),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=params,
        interpret=static.backend == "interpret",
    )(*args)


def _specs(static: _Static, q: jax.Array, k: jax.Array):
    """BlockSpecs shared by the kernels, indexed by (row, head, block)."""
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
        "q": pl.BlockSpec((None, None, static.block_q, d), lambda b, h, n: (b, h, n, 0)),
        "lse_column": pl.BlockSpec((None, None, static.block_q, 1), lambda b, h, n: (b, h, n, 0)),
        "q_ids_column": pl.BlockSpec((None, static.block_q, 1), lambda b, h, n: (b, n, 0)),
        "kv": pl.BlockSpec((None, None, _QUARTERS, static.block_k, d), lambda b, h, n: (b, h, 0, n, 0)),
        "kv_ids_column": pl.BlockSpec((None, _QUARTERS, static.block_k, 1), lambda b, h, n: (b, 0, n, 0)),
    }
    return whole, block


def _forward(static: _Static, q, k, v, q_ids, kv_ids, row_base, key):
    """q [B, N, Lqp, D], k/v [B, N, 4, Wp, D], q_ids [B, Lqp], kv_ids [B, 4, Wp], row_base
    [B, N] int32, key [2] int32 -> (o [B, N, Lqp, D], lse [B, N, Lqp, 1] float32)."""
    b, n, lqp, d = q.shape
    whole, block = _specs(static, q, k)
    return _call(
        _forward_kernel,
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
        [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, n, lqp, 1), jnp.float32)],
        q,
        k,
        v,
        q_ids[..., None],
        kv_ids[:, :, None, :],
        row_base[..., None, None],
        *_words(key),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(static: _Static, q, k, v, q_ids, kv_ids, row_base, key):
    return _forward(static, q, k, v, q_ids, kv_ids, row_base, key)[0]


def _flash_fwd(static, q, k, v, q_ids, kv_ids, row_base, key):
    o, lse = _forward(static, q, k, v, q_ids, kv_ids, row_base, key)
    return o, (q, k, v, q_ids, kv_ids, row_base, key, o, lse)


def _words(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[2] int32 -> the two words as [1, 1] arrays (whole blocks: no lane slicing in a kernel)."""
    return key[0].reshape(1, 1), key[1].reshape(1, 1)


def _flash_bwd(static, residuals, do):
    q, k, v, q_ids, kv_ids, row_base, key, o, lse = residuals
    b, n, lqp, _ = q.shape
    # The backward's own blocks (smaller on Triton: see _BACKWARD_BLOCKS), dividing the
    # forward's so that the padded lengths fit; the mask does not depend on them.
    limit_q, limit_k = _BACKWARD_BLOCKS[static.backend]
    static = dataclasses.replace(
        static, block_q=math.gcd(static.block_q, limit_q), block_k=math.gcd(static.block_k, limit_k)
    )
    # With dropout too: sum_s p_ts dp_ts = do_t . o_t (FlashAttention-2's D term).
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
    whole, block = _specs(static, q, k)
    dk, dv = _call(
        _key_grads_kernel,
        static,
        (b, n, k.shape[3] // static.block_k),
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
        [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        q,
        k,
        v,
        do,
        jnp.swapaxes(lse, 2, 3),
        jnp.swapaxes(delta, 2, 3),
        q_ids[:, None, :],
        kv_ids[..., None],
        row_base[..., None, None],
        *_words(key),
    )
    dq = _call(
        _query_grads_kernel,
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
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        q,
        k,
        v,
        do,
        lse,
        delta,
        q_ids[..., None],
        kv_ids[:, :, None, :],
        row_base[..., None, None],
        *_words(key),
    )
    return dq, dk, dv, None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def default_backend(platform: str) -> str:
    """The kernel language for `models.attention.platform()`: Mosaic on TPU, Triton on NVIDIA
    GPUs of compute capability >= 8.0 ("cuda"), the interpreter elsewhere."""
    return {"tpu": "tpu", "cuda": "triton"}.get(platform, "interpret")


def _block(requested: int | None, extent: int, backend: str, maximum: int, name: str) -> int:
    """A block size: the requested one (checked), or the smallest that covers `extent`, capped
    at `maximum` (so that a short row is not padded up to a full-size block)."""
    pow2 = backend == "triton"  # Triton's tensor shapes are powers of two (and dots >= 16)
    if requested is not None:
        if requested <= 0 or requested % 8 or (pow2 and (requested < 16 or requested & (requested - 1))):
            need = "a power of two >= 16" if pow2 else "a positive multiple of 8"
            raise ValueError(f"flash attention {name} must be {need} on {backend}, got {requested}")
        return requested
    block = _round_up(extent, 16 if pow2 else 8)
    if pow2:
        block = 1 << (block - 1).bit_length()
    return min(maximum, block)


def flash_attention_heads_first(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    query_ids: jax.Array,
    key_ids: jax.Array,
    *,
    dropout_rate: float = 0.0,
    dropout_key: jax.Array | None = None,
    rows: jax.Array,
    head_offset: jax.Array | int = 0,
    total_heads: int | None = None,
    backend: str = "interpret",
    block_q: int | None = None,
    block_k: int | None = None,
) -> jax.Array:
    """The kernel on one shard: [B, N, L, D] query, key, value -> [B, N, L, D].

    Args:
      query_ids, key_ids: [B, L] int: segment ids (a query attends keys of its own id; keys
        of id 0 are padding and never attended).
      dropout_rate: the probability of dropping an attention probability.
      dropout_key: a threefry key (typed or raw uint32[2]); None = no dropout.
      rows: [B] int32, each row's place in the global batch, head_offset:
        this shard's first head, and total_heads: the global head count (default N): the
        dropout counters are global.
      backend: one of BACKENDS. block_q, block_k: queries and keys (per quarter) per tile of
        the forward pass (default: the smallest covering L and ceil(L / 4), capped by backend;
        the backward pass takes divisors of them).
    """
    if backend not in BACKENDS:
        raise ValueError(f"flash attention backend must be one of {BACKENDS}, got {backend!r}")
    b, n, length, d = query.shape
    width = -(-length // _QUARTERS)
    max_q, max_k = _BLOCKS[backend]
    block_q = _block(block_q, length, backend, max_q, "block_q")
    block_k = _block(block_k, width, backend, max_k, "block_k")
    total_heads = total_heads or n
    keep = dropout_bits.keep_probability(dropout_rate) if dropout_key is not None else 1.0
    if keep == 0.0:
        raise ValueError("flash attention with attention dropout 1.0 drops everything: use a rate below 1")
    static = _Static(
        block_q=block_q,
        block_k=block_k,
        scale=float(1.0 / np.sqrt(d)),
        threshold=round((1.0 - keep) * 2**16),
        inverse_keep=float(1.0 / keep),
        backend=backend,
    )
    key_words = jnp.zeros((2,), jnp.int32) if dropout_key is None else _key_words(dropout_key)
    rows = rows.astype(jnp.int32)[:, None]
    heads = (jnp.arange(n, dtype=jnp.int32) + head_offset)[None, :]
    row_base = (rows * total_heads + heads) * length  # int32, wraps as the uint32 counter does

    lqp = _round_up(length, block_q)
    wp = _round_up(width, block_k)

    def quartered(x):  # [B, ..., L, ...] on axis 2 -> [B, ..., 4, Wp, ...]
        pad = [(0, 0)] * x.ndim
        pad[2] = (0, _QUARTERS * width - length)
        x = jnp.pad(x, pad).reshape(*x.shape[:2], _QUARTERS, width, *x.shape[3:])
        pad = [(0, 0)] * x.ndim
        pad[3] = (0, wp - width)
        return jnp.pad(x, pad)

    q = jnp.pad(query, ((0, 0), (0, 0), (0, lqp - length), (0, 0)))
    q_ids = jnp.pad(query_ids.astype(jnp.int32), ((0, 0), (0, lqp - length)))
    kv_ids = quartered(key_ids.astype(jnp.int32)[:, None, :])[:, 0]
    out = _flash(static, q, quartered(key), quartered(value), q_ids, kv_ids, row_base, key_words)
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
    query_ids: jax.Array,
    key_ids: jax.Array,
    *,
    dropout_rate: float = 0.0,
    dropout_key: jax.Array | None = None,
    rows: jax.Array | None = None,
    backend: str = "interpret",
    block_q: int | None = None,
    block_k: int | None = None,
) -> jax.Array:
    """Flash attention on [B, L, N, D] query, key, value -> [B, L, N, D] (value's dtype).

    Args:
      query_ids, key_ids: [B, L] int segment ids (see `flash_attention_heads_first`).
      dropout_rate, dropout_key: attention dropout (16-bit masks of models/dropout.py over the
        [B, N, L, L] probabilities); dropout_key None = none.
      rows: [B] int32, the rows' places in the global batch (a microbatch's), default 0..B-1.
      backend, block_q, block_k: see `flash_attention_heads_first`.

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
        dropout_rate=dropout_rate, dropout_key=dropout_key, backend=backend, block_q=block_q, block_k=block_k
    )

    rows = jnp.arange(b, dtype=jnp.int32) if rows is None else rows

    def attend(q, k, v, q_ids, kv_ids, rows, head_offset=0):
        out = flash_attention_heads_first(
            to_heads_first(q),
            to_heads_first(k),
            to_heads_first(v),
            q_ids,
            kv_ids,
            rows=rows,
            head_offset=head_offset,
            total_heads=n,
            **kernel_args,
        )
        return to_heads_first(out)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return attend(query, key, value, query_ids, key_ids, rows)
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
    )(query, key, value, query_ids, key_ids, rows)
