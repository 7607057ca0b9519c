"""The loop design of the flash attention kernel (models/flash_attention.py), for GPUs (Triton)
and Triton's interpreter: a program per query (or key) block walks the other blocks in a loop
with the whole row in its block spec (Triton has neither scratch nor sequential grid
dimensions). `forward` and `backward` are the custom VJP's two halves."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from models import flash_tiles as tiles


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
        keep = tiles.keep(static, key_words, row_base, first_query, start, (bq, bk), 0)
        for c in range(tiles.QUARTERS):
            keys = pl.ds(start, bk)
            s = tiles.logits(q, k_ref[c, keys, :], q_ids, kv_ids_ref[c, :, keys], static)
            m_next = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
            rescale = jnp.exp(m - m_next)
            p = jnp.exp(s - m_next)
            l = rescale * l + jnp.sum(p, axis=1, keepdims=True)  # the softmax's sum is before dropout
            p = tiles.dropped(p, None if keep is None else keep[c], static)
            acc = rescale * acc + tiles.dot(p.astype(v_ref.dtype), v_ref[c, keys, :])
            m = m_next
        return m, l, acc

    init = (
        jnp.full((bq, 1), tiles.MASKED, jnp.float32),
        jnp.zeros((bq, 1), jnp.float32),
        jnp.zeros((bq, q.shape[-1]), jnp.float32),
    )
    m, l, acc = _loop(k_ref.shape[1] // bk, body, init)
    empty = m == tiles.MASKED
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
    keys = [k_ref[c] for c in range(tiles.QUARTERS)]
    values = [v_ref[c] for c in range(tiles.QUARTERS)]
    key_ids = [kv_ids_ref[c] for c in range(tiles.QUARTERS)]

    def body(i, carry):
        dks, dvs = list(carry[0]), list(carry[1])
        start = _start(i, bq)
        queries = pl.ds(start, bq)
        q, do = q_ref[queries, :], do_ref[queries, :]
        lse, delta = lse_ref[:, queries], delta_ref[:, queries]  # [1, bq]
        keep = tiles.keep(static, key_words, row_base, start, first_column, (bk, bq), 1)
        for c in range(tiles.QUARTERS):
            keep_c = None if keep is None else keep[c]
            s = tiles.logits(keys[c], q, q_ids_ref[:, queries], key_ids[c], static)
            p = jnp.exp(s - lse)
            dvs[c] = dvs[c] + tiles.dot(tiles.dropped(p, keep_c, static).astype(do.dtype), do)
            ds = p * (tiles.dropped(tiles.dot(values[c], do, transpose_b=True), keep_c, static) - delta)
            dks[c] = dks[c] + tiles.dot(ds.astype(q.dtype), q) * static.scale
        return tuple(dks), tuple(dvs)

    zeros = tuple(jnp.zeros(keys[0].shape, jnp.float32) for _ in range(tiles.QUARTERS))
    dks, dvs = _loop(q_ref.shape[0] // bq, body, (zeros, zeros))
    for c in range(tiles.QUARTERS):
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
        keep = tiles.keep(static, key_words, row_base, first_query, start, (bq, bk), 0)
        for c in range(tiles.QUARTERS):
            keys = pl.ds(start, bk)
            k = k_ref[c, keys, :]
            s = tiles.logits(q, k, q_ids, kv_ids_ref[c, :, keys], static)
            p = jnp.exp(s - lse)
            dp = tiles.dropped(
                tiles.dot(do, v_ref[c, keys, :], transpose_b=True), None if keep is None else keep[c], static
            )
            dq = dq + tiles.dot((p * (dp - delta)).astype(k.dtype), k) * static.scale
        return dq

    dq = _loop(k_ref.shape[1] // bk, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


def _loop_call(kernel, static: tiles.Static, grid, in_specs, out_specs, out_shape, cost, *args):
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


def _loop_specs(static: tiles.Static, q: jax.Array, k: jax.Array, block_q: int, block_k: int):
    """BlockSpecs of the loop design's kernels, indexed by (row, head, block)."""
    _, _, lqp, d = q.shape
    wp = k.shape[3]
    whole = {
        "q": pl.BlockSpec((None, None, lqp, d), lambda b, h, n: (b, h, 0, 0)),
        "kv": pl.BlockSpec((None, None, tiles.QUARTERS, wp, d), lambda b, h, n: (b, h, 0, 0, 0)),
        "row_base": pl.BlockSpec((None, None, 1, 1), lambda b, h, n: (b, h, 0, 0)),
        "key_word": pl.BlockSpec((1, 1), lambda b, h, n: (0, 0)),
        "lse_row": pl.BlockSpec((None, None, 1, lqp), lambda b, h, n: (b, h, 0, 0)),
        "q_ids_row": pl.BlockSpec((None, 1, lqp), lambda b, h, n: (b, 0, 0)),
        "kv_ids_row": pl.BlockSpec((None, tiles.QUARTERS, 1, wp), lambda b, h, n: (b, 0, 0, 0)),
    }
    block = {
        "q": pl.BlockSpec((None, None, block_q, d), lambda b, h, n: (b, h, n, 0)),
        "lse_column": pl.BlockSpec((None, None, block_q, 1), lambda b, h, n: (b, h, n, 0)),
        "q_ids_column": pl.BlockSpec((None, block_q, 1), lambda b, h, n: (b, n, 0)),
        "kv": pl.BlockSpec((None, None, tiles.QUARTERS, block_k, d), lambda b, h, n: (b, h, 0, n, 0)),
        "kv_ids_column": pl.BlockSpec((None, tiles.QUARTERS, block_k, 1), lambda b, h, n: (b, 0, n, 0)),
    }
    return whole, block


def _loop_scalars(static: tiles.Static, q, rows, scalars):
    """The row counters [B, N, 1, 1] and the key's words [1, 1] as the loop kernels take them."""
    n = q.shape[1]
    heads = jnp.arange(n, dtype=jnp.int32)[None, :] + scalars[2]
    row_base = (rows[:, None] * static.total_heads + heads) * static.length
    return row_base[..., None, None], scalars[0].reshape(1, 1), scalars[1].reshape(1, 1)


def forward(static: tiles.Static, q, k, v, q_ids, kv_ids, rows, scalars):
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
            tiles.cost(4, q, tiles.QUARTERS * k.shape[3], *inputs, *out_shape),
            *inputs,
        )


def backward(static: tiles.Static, residuals, do):
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
            tiles.cost(8, q, tiles.QUARTERS * k.shape[3], *key_grads_in, *kv_shapes),
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
            tiles.cost(6, q, tiles.QUARTERS * k.shape[3], *query_grads_in, out_shape),
            *query_grads_in,
        )
    return dq, dk, dv
