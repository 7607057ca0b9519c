"""Masked-LM masking as a tf.data op (google-research/bert `create_masked_lm_predictions`).

For one formatted row (input_ids [L], input_mask [L]):

- candidates: every real token except [CLS] and [SEP] (and never padding);
- number to predict: min(max_predictions_per_seq, max(1, round(n * masked_lm_prob)))
  where n counts the real tokens *including* [CLS]/[SEP], exactly as the original;
- a uniformly random subset of that size of the candidates is chosen;
- of the chosen: 80% become [MASK], 10% a random id in [0, vocab_size), 10% unchanged
  (the original's two coin flips: p(mask)=0.8, then 0.5/0.5 keep vs random);
- outputs are sorted by position and padded to max_predictions_per_seq.

The mask is a pure function of the row and a stateless seed. Static masking (the
original's `dupe_factor` copies written offline) uses a seed from (run seed, epoch copy
= epoch % dupe_factor, instance); dynamic masking (RoBERTa) uses the epoch itself, so
every pass draws a fresh mask. `data.pipeline` derives the seed; this op only uses it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import tensorflow as tf


def mask_tokens(
    row: Mapping[str, tf.Tensor],
    *,
    seed: tf.Tensor,
    vocab_size: int,
    mask_id: int,
    never_mask_ids: Sequence[int],
    masked_lm_prob: float,
    max_predictions_per_seq: int,
) -> dict[str, tf.Tensor]:
    """Applies BERT MLM masking to one row.

    Args:
      row: input_ids [L] int32, input_mask [L] int32 (other keys pass through).
      seed: [2] int64 stateless seed for this row.
      vocab_size: random replacements are drawn uniformly from [0, vocab_size).
      mask_id: id of [MASK].
      never_mask_ids: ids that are never chosen ([CLS], [SEP]; padding is excluded
        through input_mask).
      masked_lm_prob: fraction of tokens to predict (0.15).
      max_predictions_per_seq: P, the cap and the padded length of the outputs.

    Returns:
      The row with input_ids replaced, plus masked_lm_positions [P] int32,
      masked_lm_ids [P] int32, masked_lm_weights [P] float32 (1.0 real, 0.0 padding).
    """
    input_ids = row["input_ids"]
    length = input_ids.shape[0]
    real = tf.cast(row["input_mask"], tf.bool)
    candidate = real
    for token in never_mask_ids:
        candidate = tf.logical_and(candidate, tf.not_equal(input_ids, token))

    # float64 and round-half-to-even, exactly Python's round() in the original.
    num_real = tf.reduce_sum(tf.cast(real, tf.float64))
    num_to_predict = tf.minimum(
        max_predictions_per_seq, tf.maximum(1, tf.cast(tf.round(num_real * masked_lm_prob), tf.int32))
    )
    num_to_predict = tf.minimum(num_to_predict, tf.reduce_sum(tf.cast(candidate, tf.int32)))

    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=3)
    scores = tf.random.stateless_uniform([length], seed=seeds[0])
    scores = tf.where(candidate, scores, -1.0)  # uniform scores are >= 0: candidates first
    k = min(max_predictions_per_seq, length)
    _, top = tf.math.top_k(scores, k=k)
    is_prediction = tf.range(k) < num_to_predict
    # Sort the chosen positions ascending; unused slots sort to the end.
    key = tf.where(is_prediction, top, length + tf.range(k))
    positions = tf.sort(key)
    positions = tf.where(tf.range(k) < num_to_predict, positions, 0)
    original = tf.gather(input_ids, positions)

    action = tf.random.stateless_uniform([k], seed=seeds[1])
    random_ids = tf.random.stateless_uniform([k], seed=seeds[2], maxval=vocab_size, dtype=tf.int32)
    # Same two coin flips as the original: 80% [MASK]; of the rest, half keep, half random.
    replacement = tf.where(action < 0.8, mask_id, tf.where(action < 0.9, original, random_ids))
    valid_positions = tf.boolean_mask(positions, is_prediction)
    valid_replacement = tf.boolean_mask(replacement, is_prediction)
    masked_input = tf.tensor_scatter_nd_update(input_ids, valid_positions[:, None], valid_replacement)

    pad = max_predictions_per_seq - k
    out = dict(row)
    out["input_ids"] = masked_input
    out["masked_lm_positions"] = tf.pad(positions, [[0, pad]])
    out["masked_lm_ids"] = tf.pad(tf.where(is_prediction, original, 0), [[0, pad]])
    out["masked_lm_weights"] = tf.pad(tf.cast(is_prediction, tf.float32), [[0, pad]])
    return out
