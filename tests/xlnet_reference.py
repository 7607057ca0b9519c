"""NumPy transcriptions of the original's data code (zihangdai/xlnet `data_utils.py`), the
reference the TensorFlow stream (data/plm_targets.py, data/xlnet_stream.py) is tested against:
`_sample_mask` (`ngram_spans`, `sample_targets`) and `_split_a_and_b` (`split_a_and_b`).

`_sample_mask` is data/plm_targets.py's docstring's algorithm, drawn with NumPy's generator
in the original's order of draws; `split_a_and_b` is the original's function as it stands.
"""

from __future__ import annotations

import random

import numpy as np

from data.plm_targets import ngram_lengths


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


def split_a_and_b(data, sent_ids, begin_idx, tot_len, rng: random.Random):
    """`_split_a_and_b(data, sent_ids, begin_idx, tot_len, extend_target=False)`, line for
    line, with its `random` module calls on `rng`: (a, b, label, new_begin) or None."""
    data_len = data.shape[0]
    if begin_idx + tot_len >= data_len:
        return None
    end_idx = begin_idx + 1
    cut_points = []
    while end_idx < data_len:
        if sent_ids[end_idx] != sent_ids[end_idx - 1]:
            if end_idx - begin_idx >= tot_len:
                break
            cut_points.append(end_idx)
        end_idx += 1
    a_begin = begin_idx
    if len(cut_points) == 0 or rng.random() < 0.5:
        label = 0
        a_end = end_idx if len(cut_points) == 0 else rng.choice(cut_points)
        b_len = max(1, tot_len - (a_end - a_begin))
        b_begin = rng.randint(0, data_len - 1 - b_len)
        b_end = b_begin + b_len
        while b_begin > 0 and sent_ids[b_begin - 1] == sent_ids[b_begin]:
            b_begin -= 1
        while b_end < data_len - 1 and sent_ids[b_end - 1] == sent_ids[b_end]:
            b_end += 1
        new_begin = a_end
    else:
        label = 1
        a_end = rng.choice(cut_points)
        b_begin = a_end
        b_end = end_idx
        new_begin = b_end
    while a_end - a_begin + b_end - b_begin > tot_len:
        if a_end - a_begin > b_end - b_begin:
            a_end -= 1
        else:
            b_end -= 1
    return data[a_begin:a_end], data[b_begin:b_end], label, new_begin


def truncated_lengths(a: int, b: int, total: int) -> tuple[int, int]:
    """The lengths `_split_a_and_b`'s last loop leaves of sides of a and b tokens."""
    while a + b > total:
        if a > b:
            a -= 1
        else:
            b -= 1
    return a, b
