"""MLM masking statistics over many rows: rate, cap, 80/10/10, never special tokens."""

import numpy as np
import pytest
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


# ---- whole-word and n-gram masking ------------------------------------------------------

WORD_VOCAB = 400
# Ids 100..399: even ids begin a word, odd ids continue one ("##" pieces), so rows built
# from them have words of one or more pieces.
WORD_STARTS = np.arange(WORD_VOCAB) % 2 == 0


def _word_row(rng, length, continue_prob=0.5):
    ids = []
    for _ in range(length - 2):
        start = not ids or rng.random() > continue_prob
        ids.append(int(rng.integers(50, 200)) * 2 + (0 if start else 1))
    tokens = [CLS, *ids, SEP]
    return {
        "input_ids": tf.constant(tokens + [PAD] * (L - len(tokens)), tf.int32),
        "input_mask": tf.constant([1] * len(tokens) + [0] * (L - len(tokens)), tf.int32),
    }


def _word_mask(row, seed, unit, prob=0.15, cap=P, starts=WORD_STARTS):
    return masking.mask_tokens(
        row,
        seed=tf.stack([tf.cast(seed, tf.int64), tf.constant(5, tf.int64)]),
        vocab_size=WORD_VOCAB,
        mask_id=MASK,
        never_mask_ids=(CLS, SEP),
        masked_lm_prob=prob,
        max_predictions_per_seq=cap,
        masking_unit=unit,
        word_starts=tf.constant(starts),
    )


def _words(ids, real):
    """Word index of every real non-special position (-1 elsewhere), from WORD_STARTS."""
    word, out = -1, np.full(len(ids), -1)
    for i, (t, r) in enumerate(zip(ids, real)):
        if not r or t in (CLS, SEP):
            continue
        if WORD_STARTS[t] or i == 0 or out[i - 1] == -1:
            word += 1
        out[i] = word
    return out


@pytest.mark.parametrize("unit", ["whole_word", "ngram"])
def test_word_units_never_split_a_word_and_respect_the_count(unit):
    rng = np.random.default_rng(5)
    chosen = total = 0
    for seed in range(80):
        length = int(rng.integers(10, L + 1))
        row = _word_row(rng, length)
        out = _word_mask(row, seed, unit)
        original = row["input_ids"].numpy()
        weights = out["masked_lm_weights"].numpy()
        n = int(weights.sum())
        pos = out["masked_lm_positions"].numpy()[:n]
        words = _words(original, row["input_mask"].numpy())
        assert n <= min(P, max(1, round(length * 0.15))), "never more than the token count"
        assert (np.diff(pos) > 0).all() and (words[pos] >= 0).all(), "sorted, never special tokens"
        for w in set(words[pos]):
            assert set(np.flatnonzero(words == w)) <= set(pos), "a word is masked whole or not at all"
        np.testing.assert_array_equal(out["masked_lm_ids"].numpy()[:n], original[pos])
        untouched = np.setdiff1d(np.arange(L), pos)
        np.testing.assert_array_equal(out["input_ids"].numpy()[untouched], original[untouched])
        chosen += n
        total += round(length * 0.15)
    # Words that would overshoot are skipped, so the count is sometimes not reached.
    assert 0.8 < chosen / total <= 1.0


def test_ngram_lengths_are_roughly_proportional_to_one_over_n():
    # One-token words, a long row and a low rate: n-grams seldom touch, so runs of masked
    # positions are the sampled n-grams.
    starts = np.ones(WORD_VOCAB, bool)
    rng = np.random.default_rng(6)
    counts = np.zeros(4)
    length = 256
    for seed in range(120):
        ids = [CLS, *rng.integers(100, WORD_VOCAB, size=length - 2), SEP]
        row = {"input_ids": tf.constant(ids, tf.int32), "input_mask": tf.ones([length], tf.int32)}
        out = _word_mask(row, seed, "ngram", prob=0.04, cap=16, starts=starts)
        n = int(out["masked_lm_weights"].numpy().sum())
        pos = out["masked_lm_positions"].numpy()[:n]
        runs = np.split(pos, np.flatnonzero(np.diff(pos) > 1) + 1)
        for run in runs:
            counts[min(len(run), 3)] += 1
    frequencies = counts[1:] / counts[1:].sum()
    expected = np.array([1, 1 / 2, 1 / 3]) / (11 / 6)  # 0.545, 0.273, 0.182
    np.testing.assert_allclose(frequencies, expected, atol=0.07)


def test_word_units_need_a_word_start_table():
    with pytest.raises(ValueError, match="word_starts"):
        masking.mask_tokens(
            _row(np.random.default_rng(0), 20),
            seed=tf.constant([0, 0], tf.int64),
            vocab_size=VOCAB,
            mask_id=MASK,
            never_mask_ids=(CLS, SEP),
            masked_lm_prob=0.15,
            max_predictions_per_seq=P,
            masking_unit="whole_word",
        )


def test_word_units_inside_tf_data_match_eager():
    rows = [_word_row(np.random.default_rng(i), 30) for i in range(4)]
    eager = [_word_mask(r, i, "ngram")["input_ids"].numpy() for i, r in enumerate(rows)]
    ds = tf.data.Dataset.from_tensor_slices({k: tf.stack([r[k] for r in rows]) for k in rows[0]})
    graph = ds.enumerate().map(lambda i, r: _word_mask(r, i, "ngram")["input_ids"])
    for x, y in zip(graph.as_numpy_iterator(), eager):
        np.testing.assert_array_equal(x, y)
