"""XLNet's prediction targets (data/plm_targets.py) against the statistics of the original's
`_sample_mask` at its pretraining settings (length 512, budget 85, alpha 6, beta 1)."""

import numpy as np
import pytest

from data import plm_targets

HALF, GOAL = 256, 43


def _segments(n, seed=0, start_rate=0.7):
    rs = np.random.RandomState(seed)
    return [rs.rand(HALF) < start_rate for _ in range(n)]


def test_the_budget_is_split_43_42_and_always_met():
    assert plm_targets.row_budget(85) == (43, 42)
    rng = np.random.default_rng(0)
    for is_start in _segments(50):
        for goal, reverse in ((43, False), (42, True)):
            assert plm_targets.sample_targets(is_start, rng, goal, reverse=reverse).sum() == goal


def test_ngrams_start_on_a_start_piece_never_touch_and_fill_about_85_percent():
    rng = np.random.default_rng(1)
    from_ngrams, lengths = [], []
    for is_start in _segments(400, seed=1):
        spans = plm_targets.ngram_spans(is_start, rng, GOAL)
        for (_, e0), (b1, _) in zip(spans, spans[1:]):
            assert e0 < b1  # at least the right context between them
        assert all(is_start[b] for b, _ in spans)
        from_ngrams.append(sum(e - b for b, e in spans) / GOAL)
        lengths += [e - b for b, e in spans[:-1]]  # the last may be cut to the budget
    # About 85% of a half's targets come from n-grams at these settings, the rest single tokens.
    assert 0.80 < np.mean(from_ngrams) < 0.90, np.mean(from_ngrams)
    # n-gram lengths follow p(n) ~ 1/n: [.44, .22, .15, .11, .09].
    _, expected = plm_targets.ngram_lengths()
    observed = np.bincount(lengths, minlength=6)[1:] / len(lengths)
    assert np.abs(observed - expected).max() < 0.02, (observed, expected)


def test_a_backward_row_lays_its_ngrams_out_from_the_end():
    """Reading backwards, the first n-gram is laid out from the segment's end: the mask of a
    reversed segment is the reversed mask of the segment read forwards, draw for draw."""
    is_start = _segments(1, seed=2)[0]
    forward = plm_targets.sample_targets(is_start[::-1], np.random.default_rng(5), GOAL)
    mask = plm_targets.sample_targets(is_start, np.random.default_rng(5), GOAL, reverse=True)
    np.testing.assert_array_equal(mask, forward[::-1])


def test_a_budget_over_the_segment_is_an_error():
    with pytest.raises(ValueError, match="50 targets asked of a segment of 10 tokens"):
        plm_targets.sample_targets(np.ones(10, bool), np.random.default_rng(0), 50)
