"""XLNet's prediction targets for a row, in TensorFlow for the data stream (zihangdai/xlnet
`data_utils.py` `_sample_mask`, as `create_tfrecords` calls it): n-grams of 1 to 5 pieces,
each in a window of context, until a budget of targets is reached, then single random tokens
to fill it.

For each n-gram: n is drawn with p(n) proportional to 1/n; a context of
n * mask_alpha // mask_beta tokens (6n at the paper's alpha 6, beta 1) is split at random
into a left part, skipped before the n-gram, and a right part, skipped after it; the n-gram
starts at the first start piece (a word's first piece) at or after the left context and
takes n pieces from there. The original counts pieces here, not words: its loop tests the
n-gram's first piece where it meant the current one (`seg[beg]` for `seg[end]`), so every
piece counts, which its authors called unintended but harmless; we keep the original's
behaviour, so the statistics match its runs. When an n-gram would reach the end of the
segment, sampling stops; single random positions then fill the budget (a uniform draw
without replacement among the positions left, which is what the original's rejection loop
draws). A row's budget is split between its reused part (ceil) and the rest (floor): 43 and
42 of 85 at length 512. tests/xlnet_reference.py holds the NumPy transcription these are
tested against.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from data import instances


def ngram_lengths(max_gram: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """(n, p(n)): 1..max_gram with probabilities proportional to 1/n."""
    ngrams = np.arange(1, max_gram + 1)
    pvals = 1.0 / ngrams
    return ngrams, pvals / pvals.sum()


def row_budget(num_predict: int) -> tuple[int, int]:
    """(targets of the reused part, of the rest): 43 and 42 of 85."""
    rest = num_predict // 2
    return num_predict - rest, rest


def sample_targets(
    is_start: tf.Tensor,
    seed: tf.Tensor,
    goal: int,
    *,
    reverse: tf.Tensor,
    max_gram: int = 5,
    mask_alpha: int = 6,
    mask_beta: int = 1,
) -> tf.Tensor:
    """[n] bool: the `goal` targets of one segment, exactly `goal` of them: the n-grams
    (`ngram_targets`), then uniform positions among those left.

    is_start: [n] bool, each piece starts a word (XLNet's `_is_start_piece`), n >= goal.
    seed: [2] int64, stateless. goal: [] int32 (or an int). reverse: [] bool, the segment is
    read backwards (a row of a backward stream): the n-grams are laid out on the segment
    flipped back to reading order, as the original does.
    """
    is_start = tf.where(reverse, tf.reverse(is_start, [0]), is_start)
    mask = ngram_targets(is_start, seed, goal, max_gram=max_gram, mask_alpha=mask_alpha, mask_beta=mask_beta)
    length, left = tf.size(mask), goal - tf.reduce_sum(tf.cast(mask, tf.int32))
    scores = tf.random.stateless_uniform([length], instances.derive_seed(seed, -1))
    order = tf.argsort(tf.where(mask, 2.0, scores))
    mask = mask | tf.scatter_nd(order[:left, None], tf.ones([left], tf.bool), [length])
    return tf.where(reverse, tf.reverse(mask, [0]), mask)


def ngram_targets(
    is_start: tf.Tensor, seed: tf.Tensor, goal, *, max_gram: int = 5, mask_alpha: int = 6, mask_beta: int = 1
) -> tf.Tensor:
    """[n] bool: the n-gram targets of a segment in reading order (the first loop of
    `_sample_mask`), at most `goal` pieces in all; two n-grams never touch (a right context
    of at least one piece lies between). is_start: [n] bool; seed: [2] int64."""
    length = tf.size(is_start)
    positions = tf.range(length)
    logits = tf.math.log(tf.constant(ngram_lengths(max_gram)[1][None], tf.float32))

    def more(i, cursor, count, mask, stopped):
        return ~stopped & (cursor < length) & (count < goal)

    def ngram(i, cursor, count, mask, stopped):
        draw = instances.derive_seed(seed, i)
        n = tf.random.stateless_categorical(logits, 1, seed=instances.derive_seed(draw, 0), dtype=tf.int32)
        n = tf.minimum(n[0, 0] + 1, goal - count)
        context = n * mask_alpha // mask_beta
        left = tf.random.stateless_uniform(
            [], instances.derive_seed(draw, 1), minval=0, maxval=context, dtype=tf.int32
        )
        after = is_start & (positions >= cursor + left)
        begin = tf.where(tf.reduce_any(after), tf.argmax(after, output_type=tf.int32), length)
        end = begin + n
        stopped = end >= length  # the original stops when the n-gram would reach the end
        span = (positions >= begin) & (positions < end) & ~stopped
        count = count + tf.where(stopped, 0, n)
        return i + 1, end + context - left, count, mask | span, stopped

    start = (tf.constant(0, tf.int64), 0, 0, tf.zeros([length], tf.bool), False)
    return tf.while_loop(more, ngram, start)[3]
