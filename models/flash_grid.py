"""The grid design of the flash attention kernel (models/flash_attention.py), for TPUs (Mosaic)
and Pallas's interpreter: key blocks as a sequential grid dimension, the online softmax's
state in VMEM scratch, scalars through scalar prefetch, lane-replicated ids and statistics.
`forward` and `backward` are the custom VJP's two halves."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from models import flash_tiles as tiles


def _row_base(scalars_ref, rows_ref, static: tiles.Static):
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
        m_ref[...] = jnp.full(m_ref.shape, tiles.MASKED, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def online_softmax(s, keep, v):
        m_prev, l_prev = m_ref[...], l_ref[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - tiles.lanes(m_next, s.shape[1]))
        rescale = jnp.exp(m_prev - m_next)
        l_ref[...] = rescale * l_prev + jnp.sum(
            p, axis=1, keepdims=True
        )  # the softmax's sum is before dropout
        m_ref[...] = m_next
        p = tiles.dropped(p, keep, static)
        acc_ref[...] = acc_ref[...] * tiles.lanes(rescale, v.shape[-1]) + tiles.dot(p.astype(v.dtype), v)

    bq, bk = static.block_q, static.block_k
    q, q_ids = q_ref[...], q_ids_ref[...]
    key_words, row_base = (scalars_ref[0], scalars_ref[1]), _row_base(scalars_ref, rows_ref, static)
    if static.wide:
        keys = k_ref.shape[0]
        keep = tiles.keep_wide(static, key_words, row_base, i * bq, bq, keys // tiles.QUARTERS)
        s = tiles.logits(q, k_ref[...], tiles.lanes(q_ids, keys), kv_ids_ref[:1, :], static)
        online_softmax(s, keep, v_ref[...])
    else:
        keep = tiles.keep(static, key_words, row_base, i * bq, j * bk, (bq, bk), 0)
        for c in range(tiles.QUARTERS):
            s = tiles.logits(q, k_ref[c], tiles.lanes(q_ids, bk), kv_ids_ref[c, :1, :], static)
            online_softmax(s, None if keep is None else keep[c], v_ref[c])

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        m, l = m_ref[...], l_ref[...]
        empty = m == tiles.MASKED  # every logit was masked: no key to attend
        d = acc_ref.shape[-1]
        o_ref[...] = jnp.where(tiles.lanes(empty, d), 0.0, acc_ref[...] / tiles.lanes(l, d)).astype(
            o_ref.dtype
        )
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
    keep = tiles.keep(static, key_words, row_base, i * bq, j * bk, (bk, bq), 1)
    for c in range(tiles.QUARTERS):
        s = tiles.logits(k_ref[c], q, q_ids_ref[:1, :], tiles.lanes(kv_ids_ref[c], bq), static)
        p = jnp.exp(s - lse)
        keep_c = None if keep is None else keep[c]
        dv_acc[c] = dv_acc[c] + tiles.dot(tiles.dropped(p, keep_c, static).astype(do.dtype), do)
        ds = p * (tiles.dropped(tiles.dot(v_ref[c], do, transpose_b=True), keep_c, static) - delta)
        dk_acc[c] = dk_acc[c] + tiles.dot(ds.astype(q.dtype), q) * static.scale

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
        p = jnp.exp(s - tiles.lanes(lse, s.shape[1]))
        dp = tiles.dropped(tiles.dot(do, v, transpose_b=True), keep, static)
        ds = p * (dp - tiles.lanes(delta, s.shape[1]))
        dq_acc[...] = dq_acc[...] + tiles.dot(ds.astype(k.dtype), k) * static.scale

    q, do, lse, delta, q_ids = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...], q_ids_ref[...]
    key_words, row_base = (scalars_ref[0], scalars_ref[1]), _row_base(scalars_ref, rows_ref, static)
    if static.wide:
        keys = k_ref.shape[0]
        keep = tiles.keep_wide(static, key_words, row_base, i * bq, bq, keys // tiles.QUARTERS)
        k = k_ref[...]
        accumulate(
            tiles.logits(q, k, tiles.lanes(q_ids, keys), kv_ids_ref[:1, :], static), keep, k, v_ref[...]
        )
    else:
        keep = tiles.keep(static, key_words, row_base, i * bq, j * bk, (bq, bk), 0)
        for c in range(tiles.QUARTERS):
            s = tiles.logits(q, k_ref[c], tiles.lanes(q_ids, bk), kv_ids_ref[c, :1, :], static)
            accumulate(s, None if keep is None else keep[c], k_ref[c], v_ref[c])

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = dq_acc[...].astype(dq_ref.dtype)


def _grid_call(kernel, static: tiles.Static, grid, in_specs, out_specs, out_shape, scratch, cost, *args):
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
    return jnp.broadcast_to(ids[..., None], (*ids.shape, tiles.LANES))


def _sublane_ids(ids: jax.Array) -> jax.Array:
    """[..., L] -> [..., 8, L]: each id replicated across the sublanes (ids as a row)."""
    return jnp.broadcast_to(ids[..., None, :], (*ids.shape[:-1], tiles.SUBLANES, ids.shape[-1]))


def _grid_keys(static: tiles.Static, k, v, kv_ids):
    """The keys of the forward and dq passes as their kernels take them, with their specs
    (grid (b, h, i, j)): k, v [B, N, 4, Wp, D] by key block j, ids [B, 4, 8, Wp]; wide, one
    block of all four quarters: k, v [B, N, 4 Wp, D], ids [B, 8, 4 Wp] (the same order)."""
    b, n, _, wp, d = k.shape
    if static.wide:
        k, v = (x.reshape(b, n, tiles.QUARTERS * wp, d) for x in (k, v))
        kv_spec = _spec((None, None, tiles.QUARTERS * wp, d), lambda b, h, i, j: (b, h, 0, 0))
        ids_spec = _spec((None, tiles.SUBLANES, tiles.QUARTERS * wp), lambda b, h, i, j: (b, 0, 0))
        return k, v, _sublane_ids(kv_ids.reshape(b, tiles.QUARTERS * wp)), kv_spec, ids_spec
    bk = static.block_k
    kv_spec = _spec((None, None, tiles.QUARTERS, bk, d), lambda b, h, i, j: (b, h, 0, j, 0))
    ids_spec = _spec((None, tiles.QUARTERS, tiles.SUBLANES, bk), lambda b, h, i, j: (b, 0, 0, j))
    return k, v, _sublane_ids(kv_ids), kv_spec, ids_spec


def forward(static: tiles.Static, q, k, v, q_ids, kv_ids, rows, scalars):
    """q [B, N, Lqp, D], k/v [B, N, 4, Wp, D], ids [B, Lqp] and [B, 4, Wp] -> o [B, N, Lqp, D],
    lse [B, N, Lqp, 1] float32: the kernel writes it lane-replicated, one lane is kept (a
    residual of the backward pass, 128 times smaller; jax's kernel keeps its l and m so)."""
    b, n, lqp, d = q.shape
    wp = k.shape[3]
    bq, bk = static.block_q, static.block_k
    q_spec = _spec((None, None, bq, d), lambda b, h, i, j: (b, h, i, 0))
    lse_spec = _spec((None, None, bq, tiles.LANES), lambda b, h, i, j: (b, h, i, 0))
    q_ids_spec = _spec((None, bq, tiles.LANES), lambda b, h, i, j: (b, i, 0))
    k, v, kv_ids, kv_spec, kv_ids_spec = _grid_keys(static, k, v, kv_ids)
    out_shape = [
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct((b, n, lqp, tiles.LANES), jnp.float32),
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
            [(bq, tiles.LANES), (bq, tiles.LANES), (bq, d)],
            tiles.cost(4, q, tiles.QUARTERS * wp, q, k, v, q_ids, kv_ids, *out_shape),
            scalars,
            rows,
            q,
            k,
            v,
            q_ids,
            kv_ids,
        )
    return o, lse[..., :1]


def backward(static: tiles.Static, residuals, do):
    q, k, v, q_ids, kv_ids, rows, scalars, o, lse = residuals
    b, n, lqp, d = q.shape
    wp = k.shape[3]
    # With dropout too: sum_s p_ts dp_ts = do_t . o_t (FlashAttention-2's D term).
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
    bq, bk = static.block_q_backward, static.block_k_backward
    row_spec = _spec((None, None, 1, bq), lambda b, h, j, i: (b, h, 0, i))
    block_kv = _spec((None, None, tiles.QUARTERS, bk, d), lambda b, h, j, i: (b, h, 0, j, 0))
    block_q = _spec((None, None, bq, d), lambda b, h, j, i: (b, h, i, 0))
    key_grads_in = (
        q,
        k,
        v,
        do,
        lse.swapaxes(2, 3),
        delta.swapaxes(2, 3),
        _sublane_ids(q_ids),
        jnp.broadcast_to(kv_ids[..., None], (*kv_ids.shape, tiles.LANES)),
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
                _spec((None, tiles.SUBLANES, bq), lambda b, h, j, i: (b, 0, i)),
                _spec((None, tiles.QUARTERS, bk, tiles.LANES), lambda b, h, j, i: (b, 0, j, 0)),
            ],
            [block_kv, block_kv],
            kv_shapes,
            [(tiles.QUARTERS, bk, d), (tiles.QUARTERS, bk, d)],
            tiles.cost(8, q, tiles.QUARTERS * wp, *key_grads_in, *kv_shapes),
            scalars,
            rows,
            *key_grads_in,
        )
    lanes = (b, n, lqp, tiles.LANES)
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


def _grid_dq(static: tiles.Static, q, k, v, do, lse, delta, q_ids, kv_ids, rows, scalars):
    """dq [B, N, Lqp, D] from lse and delta [B, N, Lqp, 128] lane-replicated; the keys' specs as
    the forward pass's."""
    b, n, lqp, d = q.shape
    wp = k.shape[3]
    bq, bk = static.block_q, static.block_k
    q_spec = _spec((None, None, bq, d), lambda b, h, i, j: (b, h, i, 0))
    lse_spec = _spec((None, None, bq, tiles.LANES), lambda b, h, i, j: (b, h, i, 0))
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
                _spec((None, bq, tiles.LANES), lambda b, h, i, j: (b, i, 0)),
                kv_ids_spec,
            ],
            [q_spec],
            out_shape,
            [(bq, d)],
            tiles.cost(6, q, tiles.QUARTERS * wp, *inputs, *out_shape),
            scalars,
            rows,
            *inputs,
        )
