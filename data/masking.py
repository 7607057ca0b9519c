"""Masked-LM masking as a tf.data op (google-research/bert `create_masked_lm_predictions`).

For one formatted row (input_ids [L], input_mask [L]):

- candidates: every real token except [CLS] and [SEP] (and never padding);
- number to predict: min(max_predictions_per_seq, max(1, round(n * masked_lm_prob)))
  where n counts the real tokens *including* [CLS]/[SEP], exactly as the original;
- which candidates: `masking_unit="token"`: a uniformly random subset of that size
  (BERT's default); `"whole_word"`: BERT's whole-word masking, whole words in random
  order, a word skipped if it would overshoot the count (so the count is never
  exceeded and a word is never split); `"ngram"`: ALBERT's n-gram masking,
  google-research/albert `create_masked_lm_predictions`: in random order of start word,
  n ~ p(n) proportional to 1/n over n in 1..3 consecutive candidate words, cut short at the
  last candidate word (ALBERT draws n before slicing `cand_indexes[idx:idx+n]`), shortened
  while it overshoots the count, skipped if it still overshoots or overlaps an earlier n-gram;
- of the chosen: 80% become [MASK], 10% a random id, 10% unchanged (the original's two
  coin flips: p(mask)=0.8, then 0.5/0.5 keep vs random). The random id is uniform over
  [0, vocab_size) (BERT, ALBERT: `rng.randint(0, len(vocab_words) - 1)`) minus the
  tokenizer family's `random_exclude_ids` (byte-level BPE, RoBERTa: fairseq's <s> <pad>
  </s> <unk>);
- outputs are sorted by position and padded to max_predictions_per_seq.

The mask is a pure function of the row and a stateless seed. Static masking (the
original's `dupe_factor` copies written offline) uses a seed from (run seed, epoch copy
= epoch % dupe_factor, instance); dynamic masking (RoBERTa) uses the epoch itself, so
every pass draws a fresh mask. `data.pipeline` derives the seed; this op only uses it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

MASKING_UNITS = ("token", "whole_word", "ngram")
MAX_NGRAM = 3  # ALBERT's --ngram default


def random_exclude_ids(tokenizer_kind: str | None, special_ids: Mapping[str, int]) -> tuple[int, ...]:
    """Ids the 10% random replacement never draws, by tokenizer family (sorted).

    Byte-level BPE (RoBERTa): fairseq's MaskTokensDataset (fairseq/data/mask_tokens_dataset.py)
    sets `weights[: self.vocab.nspecial] = 0`; the dictionary's `nspecial` are <s> <pad> </s>
    <unk> (fairseq/data/dictionary.py), while <mask> is added after them by the masked_lm task
    (fairseq/tasks/masked_lm.py), so it stays drawable. WordPiece and SentencePiece (BERT,
    ALBERT create_pretraining_data.py): `vocab_words[rng.randint(0, len(vocab_words) - 1)]`,
    the whole vocab, specials included: nothing excluded.

    Args:
      tokenizer_kind: the tokenizer identity's "kind" ("wordpiece", "bpe", "sentencepiece");
        None (an old manifest) excludes nothing.
      special_ids: {"pad", "unk", "cls", "sep", ...} -> id, as in the shards' manifest.
    """
    if tokenizer_kind != "bpe":
        return ()
    return tuple(sorted({special_ids[name] for name in ("cls", "pad", "sep", "unk")}))


def mask_tokens(
    row: Mapping[str, tf.Tensor],
    *,
    seed: tf.Tensor,
    vocab_size: int,
    mask_id: int,
    never_mask_ids: Sequence[int],
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    masking_unit: str = "token",
    word_starts: tf.Tensor | None = None,
    random_exclude_ids: Sequence[int] = (),
) -> dict[str, tf.Tensor]:
    """Applies BERT MLM masking to one row.

    Args:
      row: input_ids [L] int32, input_mask [L] int32 (other keys pass through).
      seed: [2] int64 stateless seed for this row.
      vocab_size: random replacements are drawn uniformly from [0, vocab_size), less
        `random_exclude_ids`.
      mask_id: id of [MASK].
      never_mask_ids: ids that are never chosen ([CLS], [SEP]; padding is excluded
        through input_mask).
      masked_lm_prob: fraction of tokens to predict (0.15).
      max_predictions_per_seq: P, the cap and the padded length of the outputs.
      masking_unit: "token", "whole_word" or "ngram" (module docstring).
      word_starts: [vocab_size] bool, True for ids that begin a word (the tokenizer's
        `word_start_mask()`); required for "whole_word" and "ngram". A candidate that
        follows a non-candidate ([CLS], [SEP]) always begins a word.
      random_exclude_ids: ids a random replacement never takes (`random_exclude_ids()`: the
        tokenizer family decides). Empty: the whole vocab, the same draws as before.

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
    k = min(max_predictions_per_seq, length)
    if masking_unit == "token":
        scores = tf.random.stateless_uniform([length], seed=seeds[0])
        scores = tf.where(candidate, scores, -1.0)  # uniform scores are >= 0: candidates first
        _, top = tf.math.top_k(scores, k=k)
        is_prediction = tf.range(k) < num_to_predict
        # Sort the chosen positions ascending; unused slots sort to the end.
        key = tf.where(is_prediction, top, length + tf.range(k))
    elif masking_unit in ("whole_word", "ngram"):
        if word_starts is None:
            raise ValueError(
                f"masking_unit={masking_unit!r} needs word_starts (the tokenizer's word_start_mask())"
            )
        covered = _choose_words(
            input_ids,
            candidate,
            word_starts,
            num_to_predict,
            seeds[0],
            max_ngram=MAX_NGRAM if masking_unit == "ngram" else 1,
        )
        # covered holds at most num_to_predict <= k tokens; the first k sorted keys have them all.
        key = tf.sort(tf.where(covered, tf.range(length), length + tf.range(length)))[:k]
        is_prediction = key < length
    else:
        raise ValueError(f"masking_unit must be one of {MASKING_UNITS}, got {masking_unit!r}")
    positions = tf.sort(key)
    positions = tf.where(is_prediction, positions, 0)
    original = tf.gather(input_ids, positions)

    action = tf.random.stateless_uniform([k], seed=seeds[1])
    random_ids = _random_ids(seeds[2], k, vocab_size, random_exclude_ids)
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


def _random_ids(seed: tf.Tensor, k: int, vocab_size: int, exclude: Sequence[int]) -> tf.Tensor:
    """[k] int32 ids uniform over [0, vocab_size) without `exclude`: a uniform index into the
    allowed ids, moved past every excluded id at or below it (ascending, so each step sees
    the index already moved past the smaller ones)."""
    exclude = sorted(set(int(i) for i in exclude))
    ids = tf.random.stateless_uniform([k], seed=seed, maxval=vocab_size - len(exclude), dtype=tf.int32)
    for excluded in exclude:
        ids += tf.cast(ids >= excluded, tf.int32)
    return ids


def _choose_words(
    input_ids: tf.Tensor,
    candidate: tf.Tensor,
    word_starts: tf.Tensor,
    num_to_predict: tf.Tensor,
    seed: tf.Tensor,
    *,
    max_ngram: int,
) -> tf.Tensor:
    """Whole-word (max_ngram=1) or n-gram (max_ngram=3) selection -> covered [L] bool.

    A sequential loop over the words in random order, because each decision depends on
    how many tokens are already covered (as in the originals); it stops once the count
    is reached, so it runs about as many iterations as words get masked.
    """
    prev_candidate = tf.concat([[False], candidate[:-1]], axis=0)
    starts = candidate & (tf.gather(tf.cast(word_starts, tf.bool), input_ids) | ~prev_candidate)
    word_of = tf.cumsum(tf.cast(starts, tf.int32)) - 1  # word index of each candidate token
    num_words = tf.reduce_sum(tf.cast(starts, tf.int32))
    segment = tf.where(candidate, word_of, num_words)  # non-candidates into a spare segment
    word_len = tf.math.unsorted_segment_sum(tf.cast(candidate, tf.int32), segment, num_words + 1)[:num_words]
    seeds = tf.random.experimental.stateless_split(seed, num=2)
    order = tf.argsort(tf.random.stateless_uniform(tf.reshape(num_words, [1]), seed=seeds[0]))
    n_draws = tf.random.stateless_uniform(tf.reshape(num_words, [1]), seed=seeds[1])
    inv = 1.0 / np.arange(1, max_ngram + 1)
    cdf = tf.constant((np.cumsum(inv) / inv.sum())[:-1], tf.float32)  # P(n <= 1 .. max_ngram - 1)

    def body(j, covered_words, count):
        w = order[j]
        # n ~ 1/n over all of 1..max_ngram, then cut at the last candidate word: ALBERT draws
        # from `ngrams[:len(cand_index_set)]` (always all of them: one slice per n) and takes
        # `cand_indexes[idx:idx+n]`, which stops at the end of the list.
        n_max = tf.minimum(max_ngram, num_words - w)
        n = 1 + tf.reduce_sum(tf.cast(cdf < n_draws[j], tf.int32))
        n = tf.minimum(n, n_max)
        span_len = tf.cumsum(tf.gather(word_len, w + tf.range(n_max)))  # tokens of the 1..n_max-gram
        # Shorten while it overshoots the count; skip if even one word does, or it overlaps.
        fits = tf.range(n_max) < n
        fits &= count + span_len <= num_to_predict
        n_fit = tf.reduce_sum(tf.cast(fits, tf.int32))
        overlap = tf.reduce_any(tf.gather(covered_words, w + tf.range(n_fit)))
        take = (n_fit > 0) & ~overlap
        word = tf.range(num_words)
        new = take & (word >= w) & (word < w + n_fit)
        added = tf.where(take, span_len[tf.maximum(n_fit - 1, 0)], 0)
        return j + 1, covered_words | new, count + added

    _, covered_words, _ = tf.while_loop(
        lambda j, _, count: (j < num_words) & (count < num_to_predict),
        body,
        (tf.constant(0), tf.zeros(tf.reshape(num_words, [1]), tf.bool), tf.constant(0)),
    )
    return candidate & tf.gather(tf.concat([covered_words, [False]], 0), segment)


def mark_maskable(
    row: Mapping[str, tf.Tensor], *, mask_id: int, never_mask_ids: Sequence[int]
) -> dict[str, tf.Tensor]:
    """For masking inside the train step (ELECTRA, PipelineConfig.masking = "in_step"): the
    row unmasked, plus what the step needs to know of the tokenizer.

    Adds maskable [L] int32 (1 = a real token other than `never_mask_ids` and [MASK]:
    google-research/electra pretrain_helpers.py `_get_candidates_mask` excludes [CLS],
    [SEP] and [MASK] and padding) and mask_id [] int32.
    """
    ids = row["input_ids"]
    excluded = tf.reduce_any(
        ids[:, None] == tf.constant([*never_mask_ids, mask_id], ids.dtype)[None, :], axis=1
    )
    maskable = tf.logical_and(tf.cast(row["input_mask"], tf.bool), tf.logical_not(excluded))
    return dict(row, maskable=tf.cast(maskable, tf.int32), mask_id=tf.constant(mask_id, tf.int32))
