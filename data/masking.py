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
- words: a token whose vocabulary entry starts a word ("##" rule) begins one, except where
  the shards carry a segmenter's words (Chinese: `data.preprocess --word_segmenter`,
  data/word_segmentation.py), whose continuing characters join the word before them;
- of the chosen: 80% become [MASK], 10% a random id, 10% unchanged (the original's two
  coin flips: p(mask)=0.8, then 0.5/0.5 keep vs random). The random id is uniform over
  [0, vocab_size) (BERT, ALBERT: `rng.randint(0, len(vocab_words) - 1)`) minus the
  tokenizer family's `random_exclude_ids` (byte-level BPE, RoBERTa: fairseq's <s> <pad>
  </s> <unk>);
- outputs are sorted by position and padded to max_predictions_per_seq.

`mask_spans` is SpanBERT's span masking (`masking_unit="span"`, facebookresearch/SpanBERT
pretraining/fairseq/data/masking.py `PairWithSpanMaskingScheme`): whole-word spans of
geometric length, one replacement decision per span, random tokens from the corpus's
unigram distribution, and the span-boundary (SBO) keys; see its docstring.

The mask is a pure function of the row and a stateless seed. Static masking (the
original's `dupe_factor` copies written offline) uses a seed from (run seed, epoch copy
= epoch % dupe_factor, instance); dynamic masking (RoBERTa) uses the epoch itself, so
every pass draws a fresh mask. `data.pipeline` derives the seed; this op only uses it.
"""

from __future__ import annotations

import functools
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from data.pipeline_config import MASKING_UNITS, REPLACEMENTS
from data.similar_words import SimilarWords, similar_at

# ALBERT's n-gram masking: P(n) proportional to 1/n for n = 1..3 (--ngram 3, the default).
ALBERT_NGRAMS = tuple(float(x) for x in (1 / np.arange(1, 4)) / (1 / np.arange(1, 4)).sum())
# A segmenter's words on the ids (`tag_words`, `untag_words`): bit 30 of a token's id marks a
# token that continues a word. Vocabularies are far smaller than 2**30 ids.
WORD_TAG = 1 << 30
WORD_CONTINUES = "word_continues"  # [L] bool: the row key `untag_words` adds and masking removes


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
    ngram_probabilities: Sequence[float] | None = None,
    replacement: str = "mask",
    similar_words: SimilarWords | None = None,
) -> dict[str, tf.Tensor]:
    """Applies BERT MLM masking to one row.

    Args:
      row: input_ids [L] int32, input_mask [L] int32, optionally WORD_CONTINUES [L] bool
        (see word_starts; not passed on); other keys pass through.
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
        follows a non-candidate ([CLS], [SEP]) always begins a word; a token that continues
        a segmenter's word (row[WORD_CONTINUES] [L] bool, `untag_words`; optional) never does.
      random_exclude_ids: ids a random replacement never takes (`random_exclude_ids()`: the
        tokenizer family decides). Empty: the whole vocab, the same draws as before.
      ngram_probabilities: "ngram"'s P(n) for n = 1, 2, ... (None: `ALBERT_NGRAMS`; MacBERT:
        0.4, 0.3, 0.2, 0.1).
      replacement: one of REPLACEMENTS: what a chosen token becomes ("random" and "similar"
        never draw `mask_id`). "similar" (word units only) decides once per word: 80% its
        similar word from `similar_words` (data/similar_words.py), token by token, or random
        tokens where the table has none; 10% random tokens; 10% kept.

    Returns:
      The row with input_ids replaced, plus masked_lm_positions [P] int32,
      masked_lm_ids [P] int32, masked_lm_weights [P] float32 (1.0 real, 0.0 padding).
    """
    input_ids = row["input_ids"]
    length = input_ids.shape[0]
    candidate = _candidates(row, never_mask_ids)

    # float64 and round-half-to-even, exactly Python's round() in the original.
    num_real = tf.reduce_sum(tf.cast(row["input_mask"], tf.float64))
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
        starts_word = _starts_word(row, word_starts)
        covered = _choose_words(
            candidate,
            starts_word,
            num_to_predict,
            seeds[0],
            ngram_probabilities=(ngram_probabilities or ALBERT_NGRAMS) if masking_unit == "ngram" else (1.0,),
        )
        # covered holds at most num_to_predict <= k tokens; the first k sorted keys have them all.
        key, is_prediction = _first_positions(covered, k)
    else:
        raise ValueError(f"masking_unit must be one of {MASKING_UNITS}, got {masking_unit!r}")
    positions = tf.sort(key)
    positions = tf.where(is_prediction, positions, 0)
    original = tf.gather(input_ids, positions)

    action = tf.random.stateless_uniform([k], seed=seeds[1])
    if replacement not in REPLACEMENTS:
        raise ValueError(f"replacement must be one of {REPLACEMENTS}, got {replacement!r}")
    # MacBERT's inputs never hold [MASK] (its point: none at fine-tuning either).
    exclude = random_exclude_ids if replacement == "mask" else (*random_exclude_ids, mask_id)
    random_ids = _random_ids(seeds[2], k, vocab_size, exclude)
    # Same two coin flips as the original: 80% [MASK] (MacBERT: a random id); of the rest, half
    # keep, half random.
    first = mask_id if replacement == "mask" else random_ids
    if replacement == "similar":
        if similar_words is None or masking_unit == "token":
            raise ValueError("replacement='similar' needs similar_words and a word masking unit")
        _, num_words, segment = _words(candidate, starts_word)
        # One draw per word: a word becomes its similar word, random tokens, or stays whole.
        word_action = tf.random.stateless_uniform([length + 1], seed=seeds[1])
        action = tf.gather(word_action, tf.gather(segment, positions))
        similar = tf.gather(similar_at(similar_words, input_ids, segment, num_words), positions)
        first = tf.where(similar >= 0, similar, random_ids)
    replaced = tf.where(action < 0.8, first, tf.where(action < 0.9, original, random_ids))
    valid_positions = tf.boolean_mask(positions, is_prediction)
    valid_replacement = tf.boolean_mask(replaced, is_prediction)
    masked_input = tf.tensor_scatter_nd_update(input_ids, valid_positions[:, None], valid_replacement)

    pad = max_predictions_per_seq - k
    out = {key: value for key, value in row.items() if key != WORD_CONTINUES}
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


def _candidates(row: Mapping[str, tf.Tensor], never_mask_ids: Sequence[int]) -> tf.Tensor:
    """[L] bool: the real tokens other than `never_mask_ids` (what masking may choose)."""
    candidate = tf.cast(row["input_mask"], tf.bool)
    for token in never_mask_ids:
        candidate = tf.logical_and(candidate, tf.not_equal(row["input_ids"], token))
    return candidate


def untag_words(row: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """The row's input_ids without `WORD_TAG`, and `word_continues` [L] bool: where it was.

    The tag is the segmenter's words riding on the ids (data/word_segmentation.py): set on
    each token that continues a word when the record is parsed (`tag_words`), it travels
    with its token through chunking, truncation, pairing and packing, which move ids and
    never read them, and comes off here, before masking reads the ids."""
    ids = row["input_ids"]
    return dict(
        row,
        input_ids=tf.bitwise.bitwise_and(ids, WORD_TAG - 1),
        **{WORD_CONTINUES: tf.not_equal(tf.bitwise.bitwise_and(ids, WORD_TAG), 0)},
    )


def tag_words(token_ids: tf.Tensor, word_continues: tf.Tensor) -> tf.Tensor:
    """token_ids [T] int32 with `WORD_TAG` set at the positions `word_continues` [C] int."""
    positions = tf.cast(word_continues, tf.int32)[:, None]
    tags = tf.scatter_nd(positions, tf.fill(tf.shape(positions)[:1], WORD_TAG), tf.shape(token_ids))
    return tf.bitwise.bitwise_or(token_ids, tags)


def _starts_word(row: Mapping[str, tf.Tensor], word_starts: tf.Tensor) -> tf.Tensor:
    """[L] bool: the row's tokens whose id begins a word (word_starts [vocab_size] bool, the
    vocabulary's rule) and that do not continue a segmenter's word (`WORD_CONTINUES`)."""
    starts = tf.gather(tf.cast(word_starts, tf.bool), row["input_ids"])
    if WORD_CONTINUES in row:
        starts = starts & ~row[WORD_CONTINUES]
    return starts


def _words(candidate: tf.Tensor, starts_word: tf.Tensor):
    """The candidates' words: (word_of [L] int32, the word index of each candidate token;
    num_words [] int32; segment [L] int32, word_of with non-candidates in a spare segment
    num_words). A word begins at a token that starts one (starts_word [L] bool) or at a
    candidate after a non-candidate."""
    prev_candidate = tf.concat([[False], candidate[:-1]], axis=0)
    starts = candidate & (starts_word | ~prev_candidate)
    word_of = tf.cumsum(tf.cast(starts, tf.int32)) - 1
    num_words = tf.reduce_sum(tf.cast(starts, tf.int32))
    return word_of, num_words, tf.where(candidate, word_of, num_words)


def _run_segments(mask: tf.Tensor) -> tf.Tensor:
    """[L] int32: the index of each True position's maximal run of consecutive Trues, and L
    (a spare segment) elsewhere, for the unsorted_segment_* ops."""
    previous = tf.concat([[False], mask[:-1]], axis=0)
    run_of = tf.cumsum(tf.cast(mask & ~previous, tf.int32)) - 1
    return tf.where(mask, run_of, mask.shape[0])


def _first_positions(covered: tf.Tensor, k: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The positions of `covered` [L] bool in ascending order, as k slots: (key [k] int32,
    a position in used slots and >= L in unused ones; is_prediction [k] bool)."""
    length = covered.shape[0]
    key = tf.sort(tf.where(covered, tf.range(length), length + tf.range(length)))[:k]
    return key, key < length


def _choose_words(
    candidate: tf.Tensor,
    starts_word: tf.Tensor,
    num_to_predict: tf.Tensor,
    seed: tf.Tensor,
    *,
    ngram_probabilities: Sequence[float],
) -> tf.Tensor:
    """Whole-word (ngram_probabilities (1,)) or n-gram selection (P(n) for n = 1, 2, ...;
    ALBERT's `ALBERT_NGRAMS`) -> covered [L] bool.

    A sequential loop over the words in random order, because each decision depends on
    how many tokens are already covered (as in the originals); it stops once the count
    is reached, so it runs about as many iterations as words get masked.
    """
    word_of, num_words, segment = _words(candidate, starts_word)
    word_len = tf.math.unsorted_segment_sum(tf.cast(candidate, tf.int32), segment, num_words + 1)[:num_words]
    seeds = tf.random.experimental.stateless_split(seed, num=2)
    order = tf.argsort(tf.random.stateless_uniform(tf.reshape(num_words, [1]), seed=seeds[0]))
    n_draws = tf.random.stateless_uniform(tf.reshape(num_words, [1]), seed=seeds[1])
    max_ngram = len(ngram_probabilities)
    p = np.asarray(ngram_probabilities, np.float64)
    cdf = tf.constant((np.cumsum(p) / p.sum())[:-1], tf.float32)  # P(n <= 1 .. max_ngram - 1)

    def body(j, covered_words, count):
        w = order[j]
        # n ~ P(n) over all of 1..max_ngram, then cut at the last candidate word: ALBERT draws
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
    maskable = _candidates(row, (*never_mask_ids, mask_id))
    return dict(row, maskable=tf.cast(maskable, tf.int32), mask_id=tf.constant(mask_id, tf.int32))


def span_length_probabilities(geometric_p: float, max_words: int) -> np.ndarray:
    """[max_words] float64: P(span of l words), l = 1..max_words: p (1 - p)^(l - 1) renormalised
    (SpanBERT's `len_distrib`; p 0.2, 10 words: mean 3.8 words)."""
    probs = geometric_p * (1 - geometric_p) ** np.arange(max_words, dtype=np.float64)
    return probs / probs.sum()


def mask_spans(
    row: Mapping[str, tf.Tensor],
    *,
    seed: tf.Tensor,
    mask_id: int,
    never_mask_ids: Sequence[int],
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    word_starts: tf.Tensor,
    unigram_counts: tf.Tensor,
    geometric_p: float = 0.2,
    max_span_words: int = 10,
    max_pair_targets: int = 15,
) -> dict[str, tf.Tensor]:
    """SpanBERT's span masking of one row, with the span boundary objective's keys.

    As `PairWithSpanMaskingScheme.mask` + `span_masking` (facebookresearch/SpanBERT
    pretraining/fairseq/data/masking.py), on the row's candidates (real tokens other than
    `never_mask_ids`; the original masks the block between [CLS] and [SEP]), in four steps:

    - `_span_budget`: ceil(masked_lm_prob x candidates) tokens, capped at max_predictions_per_seq;
    - `_choose_spans`: spans of whole words, of geometric length, until the budget is met;
      a span never crosses a non-candidate ([SEP] between segments, [CLS] of a packed
      example): the original's block has none, its spans stop at the block's end;
    - `_merged_spans` and `_replace_spans`: spans that overlap or touch are merged (so the
      masked tokens' maximal runs are the spans and a span's boundary tokens are never
      masked), then one 80/10/10 draw per merged span, random tokens from `unigram_counts`;
    - `_boundary_pairs`: SBO targets, the first `max_pair_targets` tokens of each span
      whose two neighbours are candidates.

    The SBO keys are laid out per prediction slot, beside masked_lm_positions: the target of
    slot j is masked_lm_ids[j] (the token SBO predicts is the one MLM predicts), so no second
    [spans x targets] array is needed.

    Args:
      row: input_ids [L] int32, input_mask [L] int32, optionally WORD_CONTINUES [L] bool
        (`mask_tokens`; not passed on); other keys pass through.
      seed: [2] int64 stateless seed for this row.
      mask_id: id of [MASK]. never_mask_ids: [CLS], [SEP] (padding is excluded by input_mask).
      masked_lm_prob: 0.15. max_predictions_per_seq: P, the padded length of the outputs.
      word_starts: [vocab_size] bool, True for ids that begin a word; a candidate after a
        non-candidate always begins one.
      unigram_counts: [vocab_size] int64 token counts of the training corpus (the shards'
        manifest), the distribution of random replacements; must not all be zero.
      geometric_p, max_span_words: the span length distribution (0.2, 10).
      max_pair_targets: SBO targets per span (15).

    Returns:
      The row with input_ids replaced, plus masked_lm_positions [P] int32 (ascending),
      masked_lm_ids [P] int32, masked_lm_weights [P] float32, and per slot sbo_left,
      sbo_right [P] int32 (the span's boundary positions), sbo_offset [P] int32 (0-based place
      in the span) and sbo_weights [P] float32 (1.0 = an SBO target).
    """
    input_ids = row["input_ids"]
    k = min(max_predictions_per_seq, input_ids.shape[0])
    seed = tf.cast(seed, tf.int64)
    candidate = _candidates(row, never_mask_ids)
    covered = _choose_spans(
        candidate,
        _starts_word(row, word_starts),
        _span_budget(candidate, masked_lm_prob, k),
        tf.random.experimental.stateless_fold_in(seed, 0),
        geometric_p=geometric_p,
        max_span_words=max_span_words,
    )
    first, last, span = _merged_spans(covered)
    left, right, offset, is_target = _boundary_pairs(candidate, covered, first, last, max_pair_targets)

    key, is_prediction = _first_positions(covered, k)  # unused slots sort to the end
    positions = tf.where(is_prediction, key, 0)
    slots = functools.partial(
        _at_slots, positions=positions, is_prediction=is_prediction, size=max_predictions_per_seq
    )
    out = {key: value for key, value in row.items() if key != WORD_CONTINUES}
    out["input_ids"] = _replace_spans(input_ids, covered, span, seed, mask_id, unigram_counts)
    out["masked_lm_positions"] = tf.pad(positions, [[0, max_predictions_per_seq - k]])
    out["masked_lm_ids"] = slots(input_ids, tf.int32)
    out["masked_lm_weights"] = tf.pad(tf.cast(is_prediction, tf.float32), [[0, max_predictions_per_seq - k]])
    out["sbo_left"] = slots(left, tf.int32)
    out["sbo_right"] = slots(right, tf.int32)
    out["sbo_offset"] = slots(offset, tf.int32)
    out["sbo_weights"] = slots(is_target, tf.float32)
    return out


def _span_budget(candidate: tf.Tensor, masked_lm_prob: float, k: int) -> tf.Tensor:
    """[] int32: how many tokens span masking masks, ceil(masked_lm_prob x candidates) capped at k
    (candidate: [L] bool)."""
    num_candidates = tf.reduce_sum(tf.cast(candidate, tf.int32))
    # math.ceil(sent_length * mask_ratio) in float64: 100 x 0.15 = 15.000000000000002 -> 16, as there.
    budget = tf.cast(tf.math.ceil(tf.cast(num_candidates, tf.float64) * masked_lm_prob), tf.int32)
    return tf.minimum(budget, k)


def _merged_spans(covered: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The merged spans of covered [L] bool: its maximal runs, so spans that overlap or touch
    are one. Returns (first [L] int32, last [L] int32: the first and last position of each
    covered position's span; span [L] int32: the span's index, L at uncovered positions)."""
    length = covered.shape[0]
    position = tf.range(length)
    span = _run_segments(covered)
    first = tf.gather(tf.math.unsorted_segment_min(position, span, length + 1), span)
    last = tf.gather(tf.math.unsorted_segment_max(position, span, length + 1), span)
    return first, last, span


def _replace_spans(
    input_ids: tf.Tensor,
    covered: tf.Tensor,
    span: tf.Tensor,
    seed: tf.Tensor,
    mask_id: int,
    unigram_counts: tf.Tensor,
) -> tf.Tensor:
    """input_ids [L] with the covered tokens replaced, one draw per merged span (SpanBERT's
    --replacement-method span): < 0.8 every token [MASK], < 0.9 each a random token drawn from
    `unigram_counts` (the original takes a random token of the corpus buffer), else kept.

    span: [L] int32 from `_merged_spans`. seed: [2] int64, the row's.
    """
    length = input_ids.shape[0]
    # Splits 1 and 2 of the row's seed (the span selection folds in 0; split 0 is unused):
    # another split would change every mask.
    seeds = tf.random.experimental.stateless_split(seed, num=3)
    span_draw = tf.gather(tf.random.stateless_uniform([length + 1], seed=seeds[1]), span)
    random_ids = _unigram_ids(seeds[2], length, unigram_counts)
    replacement = tf.where(span_draw < 0.8, mask_id, tf.where(span_draw < 0.9, random_ids, input_ids))
    return tf.where(covered, tf.cast(replacement, input_ids.dtype), input_ids)


def _boundary_pairs(
    candidate: tf.Tensor, covered: tf.Tensor, first: tf.Tensor, last: tf.Tensor, max_pair_targets: int
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """The span boundary objective, per position (all [L]): left, right int32 (the span's
    boundary positions, start - 1 and end + 1), offset int32 (place in the span, capped at
    max_pair_targets - 1) and is_target bool: a covered position among the first
    `max_pair_targets` of a span whose two boundary tokens are candidates (the original:
    start > 0 and end < last of the block).

    candidate, covered: [L] bool. first, last: [L] int32 from `_merged_spans`.
    """
    length = candidate.shape[0]
    left = tf.maximum(first - 1, 0)
    right = tf.minimum(last + 1, length - 1)
    has_pair = (first > 0) & (last < length - 1) & tf.gather(candidate, left) & tf.gather(candidate, right)
    offset = tf.range(length) - first
    is_target = covered & has_pair & (offset < max_pair_targets)
    return left, right, tf.minimum(offset, max_pair_targets - 1), is_target


def _at_slots(
    values: tf.Tensor, dtype: tf.DType, *, positions: tf.Tensor, is_prediction: tf.Tensor, size: int
) -> tf.Tensor:
    """[L] values -> [size] dtype, the values at the prediction slots' positions ([k] int32,
    k <= size), 0 in unused slots (is_prediction [k] bool False) and in the padding."""
    picked = tf.where(is_prediction, tf.cast(tf.gather(values, positions), dtype), 0)
    return tf.pad(picked, [[0, size - positions.shape[0]]])


def _unigram_ids(seed: tf.Tensor, n: int, counts: tf.Tensor) -> tf.Tensor:
    """[n] int32 ids drawn from the distribution `counts` [V] int64 (inverse CDF: an integer
    r uniform in [0, total), the id whose cumulative count first exceeds r)."""
    cumulative = tf.cumsum(tf.cast(counts, tf.int64))
    r = tf.random.stateless_uniform([n], seed=seed, minval=0, maxval=cumulative[-1], dtype=tf.int64)
    return tf.cast(tf.searchsorted(cumulative, r, side="right"), tf.int32)


def _choose_spans(
    candidate: tf.Tensor,
    starts_word: tf.Tensor,
    budget: tf.Tensor,
    seed: tf.Tensor,
    *,
    geometric_p: float,
    max_span_words: int,
) -> tf.Tensor:
    """SpanBERT's span selection loop (`mask_spans`) -> covered [L] bool.

    Until `budget` tokens are covered: a length l in words ~ `span_length_probabilities`, an
    anchor uniform over the candidates (drawn again if already masked), moved back to its
    word's start; the span covers that word and the next l - 1 words of the anchor's run of
    candidates, each token added only while under budget (so the last span may end inside a
    word). One iteration per drawn span, each with its own stateless draws (seed folded with the
    iteration), so the loop is a pure function of (row, seed).
    """
    length = candidate.shape[0]
    position = tf.range(length)
    word_of, num_words, segment = _words(candidate, starts_word)
    run_segment = _run_segments(candidate)  # runs of consecutive candidates: one segment each
    word_first = tf.math.unsorted_segment_min(position, segment, num_words + 1)[:num_words]
    word_end = tf.math.unsorted_segment_max(position, segment, num_words + 1)[:num_words] + 1
    # The last word of each word's run: spans stop there.
    run_last_word = tf.math.unsorted_segment_max(word_of, run_segment, length + 1)
    last_word_of_run = tf.gather(run_last_word, tf.gather(run_segment, word_first))
    candidate_positions = tf.boolean_mask(position, candidate)
    num_candidates = tf.shape(candidate_positions)[0]
    cdf = tf.constant(np.cumsum(span_length_probabilities(geometric_p, max_span_words))[:-1], tf.float64)

    def body(j, covered, count):
        u = tf.random.stateless_uniform(
            [2], seed=tf.random.experimental.stateless_fold_in(seed, j), dtype=tf.float64
        )
        span_words = 1 + tf.reduce_sum(tf.cast(cdf < u[0], tf.int32))
        draw = tf.minimum(tf.cast(u[1] * tf.cast(num_candidates, tf.float64), tf.int32), num_candidates - 1)
        anchor = candidate_positions[draw]

        def grow():
            w = word_of[anchor]
            last_word = tf.minimum(w + span_words - 1, last_word_of_run[w])
            in_span = (position >= word_first[w]) & (position < word_end[last_word])
            new = in_span & ~covered
            before = tf.cumsum(tf.cast(new, tf.int32), exclusive=True)
            added = new & (count + before < budget)  # each token only while under budget
            return covered | added, count + tf.reduce_sum(tf.cast(added, tf.int32))

        covered, count = tf.cond(covered[anchor], lambda: (covered, count), grow)
        return j + 1, covered, count

    # Every iteration whose anchor is unmasked adds >= 1 token, and at most 15% are masked,
    # so the cap (against an endless loop on a malformed row) is never near.
    _, covered, _ = tf.while_loop(
        lambda j, _, count: (count < budget) & (j < 16 * length),
        body,
        (tf.constant(0), tf.zeros([length], tf.bool), tf.constant(0)),
    )
    return covered
