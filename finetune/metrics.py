"""GLUE metrics in NumPy (tested against scikit-learn and scipy) and the GLUE score.

All functions take 1-D arrays of equal length: `predictions` and `labels` are int class
ids for classification (positive class 1 for F1 and Matthews correlation), floats for
the correlations. Values are fractions in [0, 1] (correlations in [-1, 1]); reports
multiply by 100 as the papers do.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.asarray(predictions) == np.asarray(labels)))


def f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Binary F1 of class 1 (MRPC, QQP); 0 when there is no true or predicted positive."""
    p, y = np.asarray(predictions) == 1, np.asarray(labels) == 1
    tp = float(np.sum(p & y))
    denominator = float(np.sum(p) + np.sum(y))
    return 2.0 * tp / denominator if denominator else 0.0


def matthews_corrcoef(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation (CoLA), multi-class form as sklearn; 0 when undefined."""
    p, y = np.asarray(predictions), np.asarray(labels)
    classes = np.union1d(p, y)
    confusion = np.zeros((len(classes), len(classes)), np.float64)
    np.add.at(confusion, (np.searchsorted(classes, y), np.searchsorted(classes, p)), 1.0)
    t, q = confusion.sum(axis=1), confusion.sum(axis=0)  # true and predicted counts per class
    n, correct = confusion.sum(), np.trace(confusion)
    denominator = np.sqrt((n * n - q @ q) * (n * n - t @ t))
    return float((correct * n - t @ q) / denominator) if denominator else 0.0


def pearson(predictions: np.ndarray, labels: np.ndarray) -> float:
    x = np.asarray(predictions, np.float64) - np.mean(predictions)
    y = np.asarray(labels, np.float64) - np.mean(labels)
    denominator = np.sqrt(np.sum(x * x) * np.sum(y * y))
    return float(np.sum(x * y) / denominator) if denominator else 0.0


def _ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank (scipy.stats.rankdata 'average')."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Start of each run of equal values, and the average rank of its members.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    average = (starts + ends + 1) / 2.0
    ranks = np.empty(len(values), np.float64)
    ranks[order] = np.repeat(average, ends - starts)
    return ranks


def spearman(predictions: np.ndarray, labels: np.ndarray) -> float:
    return pearson(_ranks(predictions), _ranks(labels))


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def compute(names: Sequence[str], predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """{name: value} for the named metrics."""
    return {name: METRICS[name](predictions, labels) for name in names}


def task_score(values: Mapping[str, float], names: Sequence[str]) -> float:
    """A task's single score: the mean of its metrics (MRPC/QQP F1 and accuracy, STS-B
    Pearson and Spearman), used for model selection and in the GLUE score."""
    return float(np.mean([values[name] for name in names]))


def glue_score(task_scores: Mapping[str, float]) -> float:
    """The GLUE score: the mean over tasks of each task's score (`task_score`)."""
    if not task_scores:
        raise ValueError("glue_score needs at least one task score")
    return float(np.mean(list(task_scores.values())))
