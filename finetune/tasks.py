"""The GLUE tasks and readers for the two forms users have them in.

1. The official TSV folders (as `download_glue_data.py` writes them; docs/recipes.md "GLUE"):

    CoLA/{train,dev}.tsv   no header: source, label, original label, sentence
    CoLA/test.tsv          index, sentence
    SST-2/{train,dev}.tsv  sentence, label                 test: index, sentence
    MRPC/{train,dev}.tsv   Quality, #1 ID, #2 ID, #1 String, #2 String   test: index + the same
    STS-B/{train,dev}.tsv  index, genre, ..., sentence1, sentence2, score (float 0-5)
    QQP/{train,dev}.tsv    id, qid1, qid2, question1, question2, is_duplicate   test: id, question1, question2
    MNLI/train.tsv, dev_matched.tsv, dev_mismatched.tsv   ..., sentence1, sentence2, ..., gold_label
    MNLI/test_matched.tsv, test_mismatched.tsv
    QNLI/*.tsv             index, question, sentence, label
    RTE/*.tsv, WNLI/*.tsv  index, sentence1, sentence2, label
    diagnostic/diagnostic.tsv (or AX.tsv)   index, sentence1, sentence2: test only, MNLI labels

   Fields are split on tabs with quoting disabled (the text has unbalanced quotes, so a
   csv reader with quoting would merge lines); every row must have as many fields as
   the header, and every train/dev row a known label: a row is never dropped, a bad one
   is a `GlueDataError` naming file and line.
2. TFDS `glue/<task>` (tensorflow_datasets; labels mapped by name onto the TSV labels).

Columns are found by header name (robust to the extra columns some GLUE versions have),
except in CoLA's header-less train/dev files.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Iterator

import tensorflow as tf

from core.errors import UserError

log = logging.getLogger("finetune")


class GlueDataError(UserError):
    """A missing file, unknown task or malformed row (one line naming file and line)."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One row of a task file.

    Attributes:
      where: "FILE:LINE" (TSV) or "glue/TASK[SPLIT]#I" (TFDS), for messages.
      index: the test-set id written to the submission (the row's `index`/`id` column;
        for train/dev rows the same, or the line number where the file has none).
      text_a, text_b: the sentence(s); text_b is None for single-sentence tasks.
      label: class index into `Task.labels`, a float score (STS-B), or None (test rows).
    """

    where: str
    index: str
    text_a: str
    text_b: str | None
    label: int | float | None


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the fields of one kind of file are.

    With `header=True` the first line names the columns and the `*_column` values are
    names; with `header=False` they are 0-based positions and `num_fields` is required.
    """

    text_a_column: str | int
    text_b_column: str | int | None
    label_column: str | int | None
    index_column: str | int | None
    header: bool = True
    num_fields: int | None = None


# The TSV stems of most tasks, and their TFDS splits.
_TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """A GLUE task.

    Attributes:
      name: registry key, e.g. "mnli".
      folder: the official folder name, e.g. "MNLI".
      labels: label names as written in the data (class i = labels[i]); None = regression.
      metrics: metric names (finetune/metrics.py) reported on dev; their mean is the task's
        GLUE score and the model-selection criterion.
      train_file, dev_files, test_files: file stems; dev_files[0] is the one used for model
        selection (MNLI: matched). Default: train, dev, test.
      submission_names: the leaderboard file for each test file (same order).
      train_layout, eval_layout, test_layout: column layouts.
      tfds_name, tfds_splits: the TFDS builder and split for each file stem (default: the
        three stems' train, validation, test).
      tfds_text: TFDS feature names of text_a, text_b.
      tfds_labels: TFDS class names in index order (to map onto `labels` by name), or
        None when TFDS's class i is the TSV's label str(i).
      in_all: part of `--tasks=all` (the demo task is not).
    """

    name: str
    folder: str
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    train_file: str | None = "train"
    dev_files: tuple[str, ...] = ("dev",)
    test_files: tuple[str, ...] = ("test",)
    submission_names: tuple[str, ...]
    train_layout: Layout | None
    eval_layout: Layout | None
    test_layout: Layout
    tfds_name: str | None
    tfds_splits: dict[str, str] = dataclasses.field(default_factory=lambda: dict(_TFDS_SPLITS))
    tfds_text: tuple[str, str | None]
    tfds_labels: tuple[str, ...] | None = None
    in_all: bool = True

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_outputs(self) -> int:
        return 1 if self.labels is None else len(self.labels)


_BINARY = ("0", "1")
_NLI = ("contradiction", "entailment", "neutral")  # google-research/bert MnliProcessor order
_ENTAILMENT = ("entailment", "not_entailment")


def _pair(a: str, b: str, label: str | None, index: str | None = "index") -> Layout:
    return Layout(a, b, label, index)


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            name="cola",
            folder="CoLA",
            labels=_BINARY,
            metrics=("mcc",),
            submission_names=("CoLA.tsv",),
            # train and dev have no header: source, label, original label, sentence
            train_layout=Layout(3, None, 1, None, header=False, num_fields=4),
            eval_layout=Layout(3, None, 1, None, header=False, num_fields=4),
            test_layout=Layout("sentence", None, None, "index"),
            tfds_name="glue/cola",
            tfds_text=("sentence", None),
        ),
        Task(
            name="sst2",
            folder="SST-2",
            labels=_BINARY,
            metrics=("accuracy",),
            submission_names=("SST-2.tsv",),
            train_layout=Layout("sentence", None, "label", None),
            eval_layout=Layout("sentence", None, "label", None),
            test_layout=Layout("sentence", None, None, "index"),
            tfds_name="glue/sst2",
            tfds_text=("sentence", None),
        ),
        Task(
            name="mrpc",
            folder="MRPC",
            labels=_BINARY,
            metrics=("f1", "accuracy"),
            submission_names=("MRPC.tsv",),
            train_layout=_pair("#1 String", "#2 String", "Quality", None),
            eval_layout=_pair("#1 String", "#2 String", "Quality", None),
            test_layout=_pair("#1 String", "#2 String", None),
            tfds_name="glue/mrpc",
            tfds_text=("sentence1", "sentence2"),
        ),
        Task(
            name="stsb",
            folder="STS-B",
            labels=None,
            metrics=("pearson", "spearman"),
            submission_names=("STS-B.tsv",),
            train_layout=_pair("sentence1", "sentence2", "score"),
            eval_layout=_pair("sentence1", "sentence2", "score"),
            test_layout=_pair("sentence1", "sentence2", None),
            tfds_name="glue/stsb",
            tfds_text=("sentence1", "sentence2"),
        ),
        Task(
            name="qqp",
            folder="QQP",
            labels=_BINARY,
            metrics=("f1", "accuracy"),
            submission_names=("QQP.tsv",),
            train_layout=_pair("question1", "question2", "is_duplicate", "id"),
            eval_layout=_pair("question1", "question2", "is_duplicate", "id"),
            test_layout=_pair("question1", "question2", None, "id"),
            tfds_name="glue/qqp",
            tfds_text=("question1", "question2"),
        ),
        Task(
            name="mnli",
            folder="MNLI",
            labels=_NLI,
            metrics=("accuracy",),
            dev_files=("dev_matched", "dev_mismatched"),
            test_files=("test_matched", "test_mismatched"),
            submission_names=("MNLI-m.tsv", "MNLI-mm.tsv"),
            train_layout=_pair("sentence1", "sentence2", "gold_label"),
            eval_layout=_pair("sentence1", "sentence2", "gold_label"),
            test_layout=_pair("sentence1", "sentence2", None),
            tfds_name="glue/mnli",
            tfds_splits={
                "train": "train",
                "dev_matched": "validation_matched",
                "dev_mismatched": "validation_mismatched",
                "test_matched": "test_matched",
                "test_mismatched": "test_mismatched",
            },
            tfds_text=("premise", "hypothesis"),
            tfds_labels=("entailment", "neutral", "contradiction"),
        ),
        Task(
            name="qnli",
            folder="QNLI",
            labels=_ENTAILMENT,
            metrics=("accuracy",),
            submission_names=("QNLI.tsv",),
            train_layout=_pair("question", "sentence", "label"),
            eval_layout=_pair("question", "sentence", "label"),
            test_layout=_pair("question", "sentence", None),
            tfds_name="glue/qnli",
            tfds_text=("question", "sentence"),
            tfds_labels=_ENTAILMENT,
        ),
        Task(
            name="rte",
            folder="RTE",
            labels=_ENTAILMENT,
            metrics=("accuracy",),
            submission_names=("RTE.tsv",),
            train_layout=_pair("sentence1", "sentence2", "label"),
            eval_layout=_pair("sentence1", "sentence2", "label"),
            test_layout=_pair("sentence1", "sentence2", None),
            tfds_name="glue/rte",
            tfds_text=("sentence1", "sentence2"),
            tfds_labels=_ENTAILMENT,
        ),
        Task(
            name="wnli",
            folder="WNLI",
            labels=_BINARY,
            metrics=("accuracy",),
            submission_names=("WNLI.tsv",),
            train_layout=_pair("sentence1", "sentence2", "label"),
            eval_layout=_pair("sentence1", "sentence2", "label"),
            test_layout=_pair("sentence1", "sentence2", None),
            tfds_name="glue/wnli",
            tfds_text=("sentence1", "sentence2"),
        ),
        # The diagnostic set: test only, predicted with the MNLI model (finetune/glue.py).
        Task(
            name="ax",
            folder="diagnostic",
            labels=_NLI,
            metrics=(),
            train_file=None,
            dev_files=(),
            test_files=("diagnostic",),
            submission_names=("AX.tsv",),
            train_layout=None,
            eval_layout=None,
            test_layout=_pair("sentence1", "sentence2", None),
            tfds_name="glue/ax",
            tfds_splits={"diagnostic": "test"},
            tfds_text=("premise", "hypothesis"),
        ),
        # The demo task (finetune/demo_task.py): is this sentence in its original word order?
        Task(
            name="word_order",
            folder="WordOrder",
            labels=_BINARY,
            metrics=("accuracy",),
            submission_names=("WordOrder.tsv",),
            train_layout=Layout("sentence", None, "label", None),
            eval_layout=Layout("sentence", None, "label", None),
            test_layout=Layout("sentence", None, None, "index"),
            tfds_name=None,
            tfds_splits={},
            tfds_text=("sentence", None),
            in_all=False,
        ),
    )
}
# Other names users write for the tasks (the leaderboard's and TFDS's spellings).
_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "diagnostic": "ax"}


def parse_tasks(spec: str) -> list[Task]:
    """'all' or a comma-separated list ('cola,sst2', 'CoLA,STS-B') -> tasks in registry order."""
    if spec.strip().lower() == "all":
        return [t for t in TASKS.values() if t.in_all]
    names = []
    for part in spec.split(","):
        key = part.strip().lower()
        key = _ALIASES.get(key, key)
        if key not in TASKS:
            raise GlueDataError(
                f"unknown task {part.strip()!r} in --tasks: use 'all' or some of {', '.join(TASKS)}"
            )
        names.append(key)
    if "ax" in names and "mnli" not in names:
        raise GlueDataError("the AX diagnostic is predicted with the MNLI model: add mnli to --tasks")
    return [t for name, t in TASKS.items() if name in names]


# ----------------------------------------------------------------------------- TSV


def task_file(glue_dir: str, task: Task, stem: str) -> str:
    """The path of one split's file; raises GlueDataError naming the path when it is missing."""
    candidates = [os.path.join(glue_dir, task.folder, f"{stem}.tsv")]
    # download_glue_data.py writes diagnostic/diagnostic.tsv; the GLUE server calls it AX.tsv.
    if task.name == "ax":
        candidates += [os.path.join(glue_dir, "AX.tsv"), os.path.join(glue_dir, "AX", "test.tsv")]
    for path in candidates:
        if tf.io.gfile.exists(path):
            return path
    raise GlueDataError(
        f"missing {' or '.join(candidates)}: --glue_dir must hold the official GLUE folders "
        f"({task.folder}/...), e.g. as written by download_glue_data.py"
    )


def _raw_lines(path: str, chunk_bytes: int = 1 << 22) -> Iterator[bytes]:
    r"""The file's lines as bytes, split on b"\n" only (GFile's own line iterator drops
    '\r', and universal newlines would split a row at a bare '\r' inside a field)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        pending = b""
        while chunk := f.read(chunk_bytes):
            *complete, pending = (pending + chunk).split(b"\n")
            yield from complete
        if pending:
            yield pending


def _lines(path: str) -> Iterator[tuple[int, str]]:
    r"""(1-based line number, text) of a UTF-8 file; a final '\r' (CRLF files) is removed."""
    for number, raw in enumerate(_raw_lines(path), 1):
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise GlueDataError(
                f"{path}:{number}: not valid UTF-8 ({e.reason}): re-encode the file as UTF-8"
            ) from None
        yield number, text.removesuffix("\r")


def _column(where: str, header: list[str], column: str | int | None) -> int | None:
    if column is None or isinstance(column, int):
        return column
    if column not in header:
        raise GlueDataError(
            f"{where}: header has no column {column!r} (columns: {', '.join(header)}): "
            "is this the file of another task or GLUE version?"
        )
    return header.index(column)


def _parse_label(task: Task, value: str, where: str) -> int | float:
    if task.labels is None:
        try:
            return float(value)
        except ValueError:
            raise GlueDataError(f"{where}: score {value!r} is not a number") from None
    if value not in task.labels:
        raise GlueDataError(f"{where}: label {value!r} is not one of {', '.join(task.labels)}")
    return task.labels.index(value)


def read_tsv(path: str, task: Task, layout: Layout, labeled: bool) -> list[Example]:
    """Every row of one GLUE TSV file as Examples (none dropped).

    Args:
      labeled: train/dev files (every row must carry a valid label) vs test files
        (any label column is ignored, the index column is required).
    Raises:
      GlueDataError: wrong field count, missing column or unknown label, naming file:line.
    """
    lines = _lines(path)
    if layout.header:
        first = next(lines, None)
        if first is None:
            raise GlueDataError(f"{path}: empty file, expected a header line")
        header = first[1].split("\t")
        num_fields = len(header)
        where = f"{path}:1"
        a, b = _column(where, header, layout.text_a_column), _column(where, header, layout.text_b_column)
        label = _column(where, header, layout.label_column) if labeled else None
        index = _column(where, header, layout.index_column) if layout.index_column is not None else None
    else:
        num_fields = layout.num_fields
        a, b, label, index = layout.text_a_column, layout.text_b_column, layout.label_column, None
    if not labeled and index is None and layout.header:
        raise GlueDataError(f"{path}:1: a test file needs an index column")
    examples = []
    for number, text in lines:
        where = f"{path}:{number}"
        fields = text.split("\t")
        if len(fields) != num_fields:
            raise GlueDataError(
                f"{where}: {len(fields)} tab-separated fields, expected {num_fields}: "
                "fix or remove the row (GLUE text has no tabs; is the file truncated or re-quoted?)"
            )
        examples.append(
            Example(
                where=where,
                index=fields[index] if index is not None else str(len(examples)),
                text_a=fields[a],
                text_b=fields[b] if b is not None else None,
                label=_parse_label(task, fields[label], where) if labeled else None,
            )
        )
    return examples


@dataclasses.dataclass
class TaskData:
    """The examples of one task: train, each dev file and each test file (by file stem)."""

    train: list[Example]
    dev: dict[str, list[Example]]
    test: dict[str, list[Example]]


def read_glue_dir(glue_dir: str, task: Task) -> TaskData:
    """All splits of `task` from an official GLUE folder."""

    def read(stem: str, layout: Layout, labeled: bool) -> list[Example]:
        return read_tsv(task_file(glue_dir, task, stem), task, layout, labeled)

    train = read(task.train_file, task.train_layout, True) if task.train_file else []
    dev = {stem: read(stem, task.eval_layout, True) for stem in task.dev_files}
    test = {}
    for stem in task.test_files:
        # A folder of one's own split often has no test file: the task then gets dev results
        # and no leaderboard file. AX is nothing but its test file, so it stays required.
        if task.name != "ax" and not tf.io.gfile.exists(os.path.join(glue_dir, task.folder, f"{stem}.tsv")):
            log.info("%s: no %s/%s.tsv: dev results only, no leaderboard file", task.name, task.folder, stem)
            continue
        test[stem] = read(stem, task.test_layout, False)
    return TaskData(train, dev, test)


# ----------------------------------------------------------------------------- TFDS


def _tfds_label(task: Task, names: list[str], value: int, where: str) -> int | float | None:
    if task.labels is None:
        return float(value)
    if value < 0:  # TFDS marks unlabeled (test) rows with -1
        return None
    name = names[value] if task.tfds_labels is not None else str(value)
    if name not in task.labels:
        raise GlueDataError(f"{where}: label {name!r} is not one of {', '.join(task.labels)}")
    return task.labels.index(name)


def read_tfds(task: Task, data_dir: str | None = None) -> TaskData:
    """All splits of `task` from TFDS `glue/<task>` (prepared or downloadable)."""
    import tensorflow_datasets as tfds

    if task.tfds_name is None:
        raise GlueDataError(f"task {task.name} has no TFDS dataset: use --glue_dir")
    try:
        builder = tfds.builder(task.tfds_name, data_dir=data_dir)
        builder.download_and_prepare()
    except Exception as e:  # noqa: BLE001 (TFDS raises many kinds; the user needs one line)
        raise GlueDataError(
            f"cannot prepare TFDS {task.tfds_name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    label_feature = builder.info.features["label"]
    names = list(getattr(label_feature, "names", []) or [])
    text_a, text_b = task.tfds_text

    def read(stem: str, labeled: bool) -> list[Example]:
        split = task.tfds_splits[stem]
        examples = []
        for i, row in enumerate(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))):
            where = f"{task.tfds_name}[{split}]#{i}"
            label = _tfds_label(task, names, row["label"], where) if labeled else None
            if labeled and label is None:
                raise GlueDataError(f"{where}: unlabeled row in a labeled split")
            examples.append(
                Example(
                    where=where,
                    index=str(int(row["idx"])),
                    text_a=row[text_a].decode("utf-8"),
                    text_b=row[text_b].decode("utf-8") if text_b else None,
                    label=label,
                )
            )
        return examples

    train = read(task.train_file, True) if task.train_file else []
    dev = {stem: read(stem, True) for stem in task.dev_files}
    test = {stem: read(stem, False) for stem in task.test_files}
    return TaskData(train, dev, test)
