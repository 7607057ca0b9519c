"""XLNet's factorization orders, drawn in the step: per-row ranks and the attention masks
they give (zihangdai/xlnet `data_utils.py` `_local_perm`, applied to the reused part and to
the rest of each row on its own, as `create_data` / `parser` do).

The original draws the order in its tf.data pipeline, on every read; we draw it on the
device from the step's key folded with each row's place in the global batch (like
ELECTRA's masking), so that a resume, a different microbatch count or another mesh draws
the same orders, and the [B, L, L] masks never cross the host-device boundary.

Within a half (the first `reuse_len` positions, or the rest):
- every position gets a rank, a uniform random permutation of the half's positions
  (the original's perm_size equals the half's length in its pretraining runs, so its
  block-wise shuffle is one block: a uniform permutation);
- a plain token (neither a target nor <sep> / <cls>) takes rank -1: every position sees it,
  and it sees only the other plain tokens and itself, so nothing leaks from the targets;
- a target sees the positions of lower rank, not itself; <sep> and <cls> (not targets)
  see the positions of lower or equal rank, themselves included.
Across the halves: the reused half sees nothing of the rest; the rest sees all of the
reused half, so the memory the next step reads never holds later tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.electra import row_keys


def draw_ranks(key: jax.Array, row_index: jax.Array, length: int, reuse_len: int) -> jax.Array:
    """[B, L] int32: each position's place in its half's random order (0 .. half length - 1),
    a uniform permutation per half and row, a function of `key` and the row's place in the
    global batch (`row_index` [B] int32)."""

    def one_row(row_key):
        first, rest = jax.random.split(row_key)
        return jnp.concatenate(
            [
                jax.random.permutation(first, reuse_len).astype(jnp.int32),
                jax.random.permutation(rest, length - reuse_len).astype(jnp.int32),
            ]
        )

    return jax.vmap(one_row)(row_keys(key, row_index))


def visibility(ranks: jax.Array, is_target: jax.Array, is_functional: jax.Array, reuse_len: int) -> jax.Array:
    """[B, L, L] bool: position i may attend to position j (the original's 1 - perm_mask).

    ranks: [B, L] int32 (`draw_ranks`); is_target: [B, L] bool, the prediction targets
    (never <sep> or <cls>); is_functional: [B, L] bool, <sep> and <cls>. The content stream
    also sees itself (the encoder opens the diagonal); a target's query stream reads its row
    of this mask as it is, which hides the target itself.
    """
    length = ranks.shape[1]
    plain = ~is_target & ~is_functional
    rank = jnp.where(plain, -1, ranks)
    # A target must rank strictly below i's rank to be seen; <sep>/<cls> and plain tokens
    # see their own rank too (the original's self_rev_index = rev_index + 1 for them).
    own = jnp.where(is_target, rank, rank + 1)
    sees = (rank[:, None, :] < own[:, :, None]) | plain[:, None, :]
    half = jnp.arange(length) >= reuse_len
    same_half = half[:, None] == half[None, :]
    return jnp.where(same_half[None], sees, half[None, :, None] & ~half[None, None, :])
