"""MLM masking statistics over many rows: rate, cap, 80/10/10, never special tokens."""

import numpy as np
import tensorflow as tf

from data import masking

CLS, SEP, PAD, MASK = 2, 3, 0, 4
VOCAB = 5000
L, P = 64, 12


def _row(rng, length):
    ids = rng.integers(100, VOCAB, size=length)
    a = int(rng.integers(1, length - 2))
    tokens = [CLS, *ids[:a], SEP, *ids[a : length - 3], SEP]
    return {
        "input_ids": tf.constant(tokens + [PAD] * (L - len(tokens)), tf.int32),
        "input_mask": tf.constant([1] * len(tokens) + [0] * (L - len(tokens)), tf.int32),
    }


def _mask(row, seed, prob=0.15, cap=P):
    return masking.mask_tokens(
        row,
        seed=tf.stack([tf.cast(seed, tf.int64), tf.constant(7, tf.int64)]),
        vocab_size=VOCAB,
        mask_id=MASK,
        never_mask_ids=(CLS, SEP),
        masked_lm_prob=prob,
        max_predictions_per_seq=cap,
    )


def test_masking_statistics():
    rng = np.random.default_rng(0)
    chosen = total_real = masked = kept = replaced = 0
    for seed in range(600):
        length = int(rng.integers(8, L + 1))
        row = _row(rng, length)
        out = _mask(row, seed)
        original = row["input_ids"].numpy()
        ids = out["input_ids"].numpy()
        pos = out["masked_lm_positions"].numpy()
        weights = out["masked_lm_weights"].numpy()
        n = int(weights.sum())
        # The original's count: round(15% of all real tokens incl. [CLS]/[SEP]), >= 1, capped.
        assert n == min(P, max(1, int(round(length * 0.15))))
        assert (weights[:n] == 1).all() and (weights[n:] == 0).all()
        real_pos = pos[:n]
        assert (np.diff(real_pos) > 0).all(), "sorted, distinct"
        assert (pos[n:] == 0).all() and (out["masked_lm_ids"].numpy()[n:] == 0).all()
        assert not np.isin(original[real_pos], [CLS, SEP, PAD]).any(), "never special tokens or padding"
        np.testing.assert_array_equal(out["masked_lm_ids"].numpy()[:n], original[real_pos])
        untouched = np.setdiff1d(np.arange(L), real_pos)
        np.testing.assert_array_equal(ids[untouched], original[untouched])
        chosen += n
        total_real += length
        masked += int((ids[real_pos] == MASK).sum())
        kept += int((ids[real_pos] == original[real_pos]).sum())
        replaced += int(((ids[real_pos] != MASK) & (ids[real_pos] != original[real_pos])).sum())
    assert 0.13 < chosen / total_real < 0.17
    assert abs(masked / chosen - 0.8) < 0.03
    assert abs(kept / chosen - 0.1) < 0.025
    assert abs(replaced / chosen - 0.1) < 0.025


def test_cap_is_respected_for_long_rows():
    rng = np.random.default_rng(1)
    out = _mask(_row(rng, L), seed=3, prob=0.5, cap=5)
    assert out["masked_lm_positions"].shape == (5,)
    assert out["masked_lm_weights"].numpy().sum() == 5
    assert (out["input_ids"].numpy() != _row(np.random.default_rng(1), L)["input_ids"].numpy()).sum() <= 5


def test_same_seed_same_mask_other_seed_other_mask():
    row = _row(np.random.default_rng(2), L)
    a, b, c = _mask(row, 1), _mask(row, 1), _mask(row, 2)
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    assert not np.array_equal(a["masked_lm_positions"], c["masked_lm_positions"])


def test_inside_tf_data_matches_eager():
    rows = [_row(np.random.default_rng(i), 40) for i in range(5)]
    eager = [_mask(r, i)["input_ids"].numpy() for i, r in enumerate(rows)]
    ds = tf.data.Dataset.from_tensor_slices({k: tf.stack([r[k] for r in rows]) for k in rows[0]})
    graph = list(ds.enumerate().map(lambda i, r: _mask(r, i)["input_ids"]).as_numpy_iterator())
    for x, y in zip(graph, eager):
        np.testing.assert_array_equal(x, y)
