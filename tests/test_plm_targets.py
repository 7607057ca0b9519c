"""XLNet's prediction targets (data/plm_targets.py, TensorFlow) against the NumPy
transcription of the original's `_sample_mask` (tests/xlnet_reference.py) and its statistics
at the pretraining settings (length 512, budget 85, alpha 6, beta 1)."""

import numpy as np
import tensorflow as tf

from data import plm_targets
from tests import xlnet_reference

HALF, GOAL = 256, 43


def _segments(n, seed=0, start_rate=0.7):
    rs = np.random.RandomState(seed)
    return [rs.rand(HALF) < start_rate for _ in range(n)]


@tf.function(reduce_retracing=True)
def _draw(is_start, seed, goal, reverse):
    seed = tf.stack([seed, tf.constant(0, tf.int64)])
    return (
        plm_targets.sample_targets(is_start, seed, goal, reverse=reverse),
        plm_targets.ngram_targets(is_start, seed, goal),
    )


def _ours(is_start, seed, goal=GOAL, reverse=False):
    """(sample_targets, ngram_targets) of one segment, as NumPy."""
    out = _draw(tf.constant(is_start), tf.constant(seed, tf.int64), tf.constant(goal), tf.constant(reverse))
    return tuple(t.numpy() for t in out)


def _runs(mask):
    """[begin, end) runs of True in reading order."""
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def test_the_budget_is_split_43_42_and_always_met():
    assert plm_targets.row_budget(85) == (43, 42)
    for k, is_start in enumerate(_segments(20)):
        for goal, reverse in ((43, False), (42, True)):
            targets, ngrams = _ours(is_start, k, goal, reverse)
            assert targets.sum() == goal and ngrams.sum() <= goal
            assert xlnet_reference.sample_targets(is_start, np.random.default_rng(k), goal).sum() == goal


def test_ngram_statistics_equal_the_originals():
    """400 halves with 70% start pieces, drawn by ours and by the transcription: every n-gram
    starts on a start piece; the share of the budget the n-grams fill (about 85%) and their
    lengths (p(n) ~ 1/n: .44 .22 .15 .11 .09) agree."""
    share, lengths = {"ours": [], "original": []}, {"ours": [], "original": []}
    rng = np.random.default_rng(1)
    for k, is_start in enumerate(_segments(400, seed=1)):
        spans = xlnet_reference.ngram_spans(is_start, rng, GOAL)
        ours = _runs(_ours(is_start, 10_000 + k)[1])
        assert all(is_start[b] for b, _ in ours)
        for name, found in (("original", spans), ("ours", ours)):
            share[name].append(sum(e - b for b, e in found) / GOAL)
            lengths[name] += [e - b for b, e in found[:-1]]  # the last may be cut to the budget
    _, expected = plm_targets.ngram_lengths()
    for name in share:
        assert 0.80 < np.mean(share[name]) < 0.90, (name, np.mean(share[name]))
        observed = np.bincount(lengths[name], minlength=6)[1:] / len(lengths[name])
        assert np.abs(observed - expected).max() < 0.025, (name, observed, expected)
    assert abs(np.mean(share["ours"]) - np.mean(share["original"])) < 0.01


def test_a_backward_row_lays_its_ngrams_out_from_the_end():
    """Reading backwards, the n-grams are laid out on the flipped segment: the targets of a
    backward segment are the flipped targets of the flipped segment read forwards, draw for
    draw (ours, and the transcription's)."""
    is_start = _segments(1, seed=2)[0]
    forward, _ = _ours(is_start[::-1].copy(), 5)
    backward, _ = _ours(is_start, 5, reverse=True)
    np.testing.assert_array_equal(backward, forward[::-1])
    forward = xlnet_reference.sample_targets(is_start[::-1], np.random.default_rng(5), GOAL)
    mask = xlnet_reference.sample_targets(is_start, np.random.default_rng(5), GOAL, reverse=True)
    np.testing.assert_array_equal(mask, forward[::-1])


def test_the_filler_draws_uniformly_among_the_positions_left():
    """With no start piece there are no n-grams: the whole budget is single positions, each
    position chosen with probability goal / n."""
    counts = np.zeros(HALF)
    for k in range(300):
        targets, ngrams = _ours(np.zeros(HALF, bool), k)
        assert not ngrams.any() and targets.sum() == GOAL
        counts += targets
    rate = counts / 300
    assert abs(rate.mean() - GOAL / HALF) < 1e-9 and rate.std() < 0.05, rate.std()
