"""GLUE metrics against scikit-learn and scipy; the GLUE score; the host-side lr schedule."""

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from finetune import metrics


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 300))
    labels = rng.integers(0, 2, n)
    predictions = np.where(rng.random(n) < 0.7, labels, 1 - labels)
    assert metrics.accuracy(predictions, labels) == pytest.approx(
        sklearn.metrics.accuracy_score(labels, predictions)
    )
    assert metrics.f1(predictions, labels) == pytest.approx(sklearn.metrics.f1_score(labels, predictions))
    assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(
        sklearn.metrics.matthews_corrcoef(labels, predictions)
    )
    three = rng.integers(0, 3, n)  # the multi-class form (MNLI-sized label sets)
    guess = np.where(rng.random(n) < 0.5, three, rng.integers(0, 3, n))
    assert metrics.matthews_corrcoef(guess, three) == pytest.approx(
        sklearn.metrics.matthews_corrcoef(three, guess)
    )


def test_degenerate_cases_match_sklearn():
    ones, zeros = np.ones(10, int), np.zeros(10, int)
    for p, y in ((ones, ones), (zeros, zeros), (ones, zeros), (zeros, ones)):
        assert metrics.matthews_corrcoef(p, y) == sklearn.metrics.matthews_corrcoef(y, p)
        assert metrics.f1(p, y) == sklearn.metrics.f1_score(y, p, zero_division=0.0)


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 26, 200) / 5.0  # STS-B-like scores with many ties
    predictions = labels + rng.normal(0, 1.0, 200)
    predictions[:20] = np.round(predictions[:20])  # ties in the predictions too
    assert metrics.pearson(predictions, labels) == pytest.approx(scipy.stats.pearsonr(predictions, labels)[0])
    assert metrics.spearman(predictions, labels) == pytest.approx(
        scipy.stats.spearmanr(predictions, labels)[0]
    )


def test_task_and_glue_score():
    assert metrics.task_score(
        {"f1": 0.9, "accuracy": 0.8, "extra": 0.0}, ("f1", "accuracy")
    ) == pytest.approx(0.85)
    assert metrics.glue_score({"mrpc": 0.85, "cola": 0.55}) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        metrics.glue_score({})
