"""Leaderboard files, submission.zip and the markdown results table.

The GLUE server takes one TSV per test set, `index<TAB>prediction` with a header line,
predictions as label names exactly as in the training data (`entailment`, `0`, ...) and
STS-B scores as numbers; all eleven files zipped at the top level of submission.zip.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from finetune.tasks import TASKS, Example, Task

# Published dev-set numbers (docs/recipes.md "GLUE"): BERT-base from the HF Flax examples
# (mean of 5 runs; MRPC is F1), RoBERTa-base from the fairseq README. Percent.
PUBLISHED_DEV = {
    "BERT-base": {
        "mnli": 83.8,
        "qnli": 90.8,
        "qqp": 90.8,
        "rte": 64.8,
        "sst2": 92.2,
        "mrpc": 89.0,
        "cola": 59.0,
        "stsb": 88.9,
    },
    "RoBERTa-base": {
        "mnli": 87.6,
        "qnli": 92.8,
        "qqp": 91.9,
        "rte": 78.7,
        "sst2": 94.8,
        "mrpc": 90.2,
        "cola": 63.6,
        "stsb": 91.2,
    },
}
# The GLUE leaderboard's order of the eleven files.
SUBMISSION_FILES = (
    "CoLA.tsv",
    "SST-2.tsv",
    "MRPC.tsv",
    "STS-B.tsv",
    "QQP.tsv",
    "MNLI-m.tsv",
    "MNLI-mm.tsv",
    "QNLI.tsv",
    "RTE.tsv",
    "WNLI.tsv",
    "AX.tsv",
)


def prediction_labels(task: Task, logits: np.ndarray) -> list[str]:
    """[N, C] logits -> label names as in the data; STS-B scores clipped to the 0-5 scale."""
    if task.is_regression:
        return [f"{score:.3f}" for score in np.clip(logits[:, 0], 0.0, 5.0)]
    return [task.labels[i] for i in np.argmax(logits, axis=-1)]


def write_predictions(path: str, examples: Sequence[Example], labels: Sequence[str]) -> None:
    """One `index<TAB>prediction` line per test row, after the header."""
    if len(examples) != len(labels):
        raise ValueError(f"{path}: {len(examples)} test rows but {len(labels)} predictions")
    with tf.io.gfile.GFile(path, "w") as f:
        f.write("index\tprediction\n")
        for example, label in zip(examples, labels):
            f.write(f"{example.index}\t{label}\n")


def zip_submission(directory: str, names: Sequence[str]) -> str:
    """submission.zip in `directory` with the given files at its top level; returns its path."""
    path = os.path.join(directory, "submission.zip")
    local = path if "://" not in path else os.path.join("/tmp", "submission.zip")
    with zipfile.ZipFile(local, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in names:
            with tf.io.gfile.GFile(os.path.join(directory, name), "rb") as f:
                archive.writestr(name, f.read())
    if local != path:
        tf.io.gfile.copy(local, path, overwrite=True)
    return path


def _percent(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def markdown_table(results: Mapping[str, Any]) -> str:
    """The dev results beside the published BERT-base and RoBERTa-base numbers.

    results: results.json's content ({"tasks": {name: {...}}, "glue_score": ...}).
    Our numbers are the chosen configuration's medians over seeds; the GLUE score is over
    the tasks run here, and the published averages over the same tasks (WNLI and AX have
    no published dev numbers here).
    """
    tasks = results["tasks"]
    lines = [
        "| task | dev metrics (median over seeds) | task score: median | mean "
        "| BERT-base | RoBERTa-base | chosen configuration |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in tasks.items():
        task = TASKS[name]
        chosen = entry["chosen"]
        metrics = "; ".join(
            (f"{file}: " if len(chosen["dev_median"]) > 1 else "")
            + ", ".join(f"{m} {_percent(v)}" for m, v in values.items())
            for file, values in chosen["dev_median"].items()
        )
        lines.append(
            f"| {task.folder} | {metrics} | {_percent(chosen['glue_score_median'])} | "
            f"{_percent(chosen['glue_score_mean'])} | "
            f"{PUBLISHED_DEV['BERT-base'].get(name, '')} | {PUBLISHED_DEV['RoBERTa-base'].get(name, '')} | "
            f"lr {chosen['learning_rate']:g}, batch {chosen['batch_size']}, "
            f"{chosen['num_epochs']} epochs, {len(chosen['seeds'])} seeds |"
        )
    published = {
        system: [values[n] for n in tasks if n in values] for system, values in PUBLISHED_DEV.items()
    }
    covered = [n for n in tasks if n in PUBLISHED_DEV["BERT-base"]]
    lines.append(
        f"| **GLUE score** | mean of task scores | {_percent(results['glue_score'])} | | "
        + " | ".join(
            f"{np.mean(v):.1f}" + ("" if len(covered) == len(tasks) else f" ({len(v)} tasks)") if v else ""
            for v in published.values()
        )
        + " | |"
    )
    return "\n".join(lines) + "\n"
