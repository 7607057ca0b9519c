"""XLNet's factorization orders (pretrain/objectives/permutation.py) against a transcription
of the original's `_local_perm` (zihangdai/xlnet data_utils.py) and the rules it implies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pretrain.objectives import permutation

SEP, CLS = 4, 3
L, REUSE = 16, 6


def _local_perm(inputs, is_masked, index):
    """data_utils.py `_local_perm`, its perm_mask and target_mask, in NumPy: `index` is the
    shuffled range (with perm_size equal to the length, one uniform permutation)."""
    non_func_tokens = ~((inputs == SEP) | (inputs == CLS))
    non_mask_tokens = ~is_masked & non_func_tokens
    masked_or_func_tokens = ~non_mask_tokens
    rev_index = np.where(non_mask_tokens, -1, index)
    target_tokens = masked_or_func_tokens & non_func_tokens
    self_rev_index = np.where(target_tokens, rev_index, rev_index + 1)
    perm_mask = (self_rev_index[:, None] <= rev_index[None, :]) & masked_or_func_tokens
    return perm_mask, target_tokens


def _original_row(inputs, is_masked, index):
    """data_utils.py `create_data`'s row: `_local_perm` of the reused part and of the rest,
    the reused part blind to the rest, the rest seeing all of the reused part."""
    mask_0, target_0 = _local_perm(inputs[:REUSE], is_masked[:REUSE], index[:REUSE])
    mask_1, target_1 = _local_perm(inputs[REUSE:], is_masked[REUSE:], index[REUSE:])
    perm_mask = np.block(
        [[mask_0, np.ones((REUSE, L - REUSE), bool)], [np.zeros((L - REUSE, REUSE), bool), mask_1]]
    )
    return perm_mask, np.concatenate([target_0, target_1])


def _rows(seed, n=64):
    rs = np.random.RandomState(seed)
    inputs = rs.randint(5, 50, (n, L))
    inputs[:, L - 1] = CLS
    inputs[:, [REUSE - 1, L - 2]] = SEP
    is_masked = rs.rand(n, L) < 0.3  # some on <sep> / <cls>: never targets there
    index = np.stack([np.concatenate([rs.permutation(REUSE), rs.permutation(L - REUSE)]) for _ in range(n)])
    return inputs, is_masked, index


def _visibility(index, targets, functional):
    ranks, targets, functional = (jnp.asarray(x) for x in (index.astype(np.int32), targets, functional))
    return np.asarray(permutation.visibility(ranks, targets, functional, REUSE))


def test_visibility_is_the_originals_perm_mask():
    inputs, is_masked, index = _rows(0)
    functional = (inputs == SEP) | (inputs == CLS)
    ours = _visibility(index, is_masked & ~functional, functional)
    for b in range(len(inputs)):
        perm_mask, targets = _original_row(inputs[b], is_masked[b], index[b])
        np.testing.assert_array_equal(targets, is_masked[b] & ~functional[b])
        np.testing.assert_array_equal(ours[b], ~perm_mask, err_msg=f"row {b}")


def test_targets_form_a_strict_order_in_each_half():
    """Of two targets in one half exactly one sees the other; none sees itself; plain tokens
    see no target of their half; the reused half sees nothing of the rest and the rest all
    of it."""
    inputs, is_masked, index = _rows(1)
    functional = (inputs == SEP) | (inputs == CLS)
    targets = is_masked & ~functional
    sees = _visibility(index, targets, functional)
    half = np.arange(L) >= REUSE
    for b in range(len(inputs)):
        t = np.flatnonzero(targets[b])
        for i in t:
            assert not sees[b, i, i]
            for j in t[(t != i) & (half[t] == half[i])]:
                assert sees[b, i, j] != sees[b, j, i]
        plain = ~targets[b] & ~functional[b]
        for part in (~half, half):  # within a half: plain tokens see every plain one, no target
            assert not sees[b][np.ix_(plain & part, targets[b] & part)].any()
            assert sees[b][np.ix_(plain & part, plain & part)].all()
    assert not sees[:, :REUSE, REUSE:].any() and sees[:, REUSE:, :REUSE].all()


@pytest.mark.slow
def test_ranks_are_uniform_permutations_per_half_and_row():
    key = jax.random.key(3)
    draw = jax.jit(permutation.draw_ranks, static_argnums=(2, 3))
    draws = np.asarray(draw(key, jnp.arange(2000), L, REUSE))
    assert (np.sort(draws[:, :REUSE], axis=1) == np.arange(REUSE)).all()
    assert (np.sort(draws[:, REUSE:], axis=1) == np.arange(L - REUSE)).all()
    # Each position takes each rank about equally often, and i precedes j half the time.
    counts = np.stack([(draws[:, REUSE:] == r).sum(0) for r in range(L - REUSE)])
    expected = len(draws) / (L - REUSE)
    assert np.abs(counts - expected).max() < 5 * np.sqrt(expected)
    before = (draws[:, REUSE + 1] < draws[:, REUSE + 7]).mean()
    assert abs(before - 0.5) < 0.04
    # A row's order depends on its place in the global batch, not on the rows beside it.
    np.testing.assert_array_equal(draw(key, jnp.array([7]), L, REUSE)[0], draws[7])
