"""XLNet's prediction targets for a row (zihangdai/xlnet `data_utils.py` `_sample_mask`, as
`create_tfrecords` calls it): n-grams of 1 to 5 pieces, each in a window of context, until a
budget of targets is reached, then single random tokens to fill it.

For each n-gram: n is drawn with p(n) proportional to 1/n; a context of
n * mask_alpha / mask_beta tokens (6n at the paper's alpha 6, beta 1) is split at random
into a left part, skipped before the n-gram, and a right part, skipped after it; the n-gram
starts at the first start piece (a word's first piece) at or after the left context and
takes n pieces from there. The original counts pieces here, not words: its loop tests the
n-gram's first piece where it meant the current one (`seg[beg]` for `seg[end]`), so every
piece counts, which its authors called unintended but harmless; we keep the original's
behaviour, so the statistics match its runs. When an n-gram would reach the end of the
segment, sampling stops; single random positions then fill the budget. A row's budget is
split between its reused half (ceil) and the rest (floor): 43 and 42 of 85 at length 512.
The caller drops targets that land on <sep> or <cls> (as `_local_perm` does), so a row may
end with fewer.
"""

from __future__ import annotations

import numpy as np


def ngram_lengths(max_gram: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """(n, p(n)): 1..max_gram with probabilities proportional to 1/n."""
    ngrams = np.arange(1, max_gram + 1)
    pvals = 1.0 / ngrams
    return ngrams, pvals / pvals.sum()


def ngram_spans(
    is_start: np.ndarray,
    rng: np.random.Generator,
    goal: int,
    *,
    max_gram: int = 5,
    mask_alpha: int = 6,
    mask_beta: int = 1,
) -> list[tuple[int, int]]:
    """The n-gram targets of a segment, as [begin, end) spans in reading order (the first
    loop of `_sample_mask`): at most `goal` pieces in all. is_start: [n] bool, each piece
    starts a word (XLNet's `_is_start_piece`)."""
    length = len(is_start)
    ngrams, pvals = ngram_lengths(max_gram)
    spans: list[tuple[int, int]] = []
    count, cursor = 0, 0
    while cursor < length and count < goal:
        n = min(int(rng.choice(ngrams, p=pvals)), goal - count)
        context = (n * mask_alpha) // mask_beta
        left = int(rng.integers(context))
        begin = cursor + left
        while begin < length and not is_start[begin]:
            begin += 1
        end = begin + n
        if end >= length:  # the original stops when the n-gram would reach the end
            break
        spans.append((begin, end))
        count += n
        cursor = end + context - left
    return spans


def sample_targets(
    is_start: np.ndarray, rng: np.random.Generator, goal: int, *, reverse: bool = False, **options
) -> np.ndarray:
    """[n] bool: the `goal` targets of one segment (`_sample_mask`): the n-gram spans
    (`ngram_spans`, options max_gram, mask_alpha, mask_beta), then single random positions
    until the budget is full. reverse: the segment is read backwards (a row of a backward
    stream): the n-grams are laid out from its end, as the original does."""
    length = len(is_start)
    if goal > length:
        raise ValueError(f"{goal} targets asked of a segment of {length} tokens")
    mask = np.zeros(length, bool)
    for begin, end in ngram_spans(is_start[::-1] if reverse else is_start, rng, goal, **options):
        mask[begin:end] = True
    count = int(mask.sum())
    while count < goal:
        i = int(rng.integers(length))
        if not mask[i]:
            mask[i] = True
            count += 1
    return mask[::-1] if reverse else mask


def row_budget(num_predict: int) -> tuple[int, int]:
    """(targets of the reused half, of the rest): 43 and 42 of 85."""
    rest = num_predict // 2
    return num_predict - rest, rest
