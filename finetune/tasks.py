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
import os
from typing import Iterator

import tensorflow as tf

from core.errors import UserError


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


@dataclasses.dataclass(frozen=True)
class Task:
    """A GLUE task.

    Attributes:
      name: registry key, e.g. "mnli".
      folder: the official folder name, e.g. "MNLI".
      labels: label names as written in the data (class i = labels[i]); None = regression.
      metrics: metric names (finetune/metrics.py) reported on dev; their mean is the task's
        GLUE score and the model-selection criterion.
      train_file, dev_files, test_files: file stems; dev_files[0] is the one used for model
        selection (MNLI: matched).
      submission_names: the leaderboard file for each test file (same order).
      train_layout, eval_layout, test_layout: column layouts.
      tfds_name, tfds_splits: the TFDS builder and split for each file stem.
      tfds_text: TFDS feature names of text_a, text_b.
      tfds_labels: TFDS class names in index order (to map onto `labels` by name), or
        None when TFDS's class i is the TSV's label str(i).
      in_all: part of `--tasks=all` (the demo task is not).
    """

    name: str
    folder: str
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    train_file: str | None
    dev_files: tuple[str, ...]
    test_files: tuple[str, ...]
    submission_names: tuple[str, ...]
    train_layout: Layout | None
    eval_layout: Layout | None
    test_layout: Layout
    tfds_name: str | None
    tfds_splits: dict[str, str]
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
            "cola",
            "CoLA",
            _BINARY,
            ("mcc",),
            "train",
            ("dev",),
            ("test",),
            ("CoLA.tsv",),
            Layout(3, None, 1, None, header=False, num_fields=4),
            Layout(3, None, 1, None, header=False, num_fields=4),
            Layout("sentence", None, None, "index"),
            "glue/cola",
            {"train": "train", "dev": "validation", "test": "test"},
            ("sentence", None),
        ),
        Task(
            "sst2",
            "SST-2",
            _BINARY,
            ("accuracy",),
            "train",
            ("dev",),
            ("test",),
            ("SST-2.tsv",),
            Layout("sentence", None, "label", None),
            Layout("sentence", None, "label", None),
            Layout("sentence", None, None, "index"),
            "glue/sst2",
            {"train": "train", "dev": "validation", "test": "test"},
            ("sentence", None),
        ),
        Task(
            "mrpc",
            "MRPC",
            _BINARY,
            ("f1", "accuracy"),
            "train",
            ("dev",),
            ("test",),
            ("MRPC.tsv",),
            _pair("#1 String", "#2 String", "Quality", None),
            _pair("#1 String", "#2 String", "Quality", None),
            _pair("#1 String", "#2 String", None),
            "glue/mrpc",
            {"train": "train", "dev": "validation", "test": "test"},
            ("sentence1", "sentence2"),
        ),
        Task(
            "stsb",
            "STS-B",
            None,
            ("pearson", "spearman"),
            "train",
            ("dev",),
            ("test",),
            ("STS-B.tsv",),
            _pair("sentence1", "sentence2", "score"),
            _pair("sentence1", "sentence2", "score"),
            _pair("sentence1", "sentence2", None),
            "glue/stsb",
            {"train": "train", "dev": "validation", "test": "test"},
            ("sentence1", "sentence2"),
        ),
        Task(
            "qqp",
            "QQP",
            _BINARY,
            ("f1", "accuracy"),
            "train",
            ("dev",),
            ("test",),
            ("QQP.tsv",),
            _pair("question1", "question2", "is_duplicate", "id"),
            _pair("question1", "question2", "is_duplicate", "id"),
            _pair("question1", "question2", None, "id"),
            "glue/qqp",
            {"train": "train", "dev": "validation", "test": "test"},
            ("question1", "question2"),
        ),
        Task(
            "mnli",
            "MNLI",
            _NLI,
            ("accuracy",),
            "train",
            ("dev_matched", "dev_mismatched"),
            ("test_matched", "test_mismatched"),
            ("MNLI-m.tsv", "MNLI-mm.tsv"),
            _pair("sentence1", "sentence2", "gold_label"),
            _pair("sentence1", "sentence2", "gold_label"),
            _pair("sentence1", "sentence2", None),
            "glue/mnli",
            {
                "train": "train",
                "dev_matched": "validation_matched",
                "dev_mismatched": "validation_mismatched",
                "test_matched": "test_matched",
                "test_mismatched": "test_mismatched",
            },
            ("premise", "hypothesis"),
            tfds_labels=("entailment", "neutral", "contradiction"),
        ),
        Task(
            "qnli",
            "QNLI",
            _ENTAILMENT,
            ("accuracy",),
            "train",
            ("dev",),
            ("test",),
            ("QNLI.tsv",),
            _pair("question", "sentence", "label"),
            _pair("question", "sentence", "label"),
            _pair("question", "sentence", None),
            "glue/qnli",
            {"train": "train", "dev": "validation", "test": "test"},
            ("question", "sentence"),
            tfds_labels=_ENTAILMENT,
        ),
        Task(
            "rte",
            "RTE",
            _ENTAILMENT,
            ("accuracy",),
            "train",
            ("dev",),
            ("test",),
            ("RTE.tsv",),
            _pair("sentence1", "sentence2", "label"),
            _pair("sentence1", "sentence2", "label"),
            _pair("sentence1", "sentence2", None),
            "glue/rte",
            {"train": "train", "dev": "validation", "test": "test"},
            ("sentence1", "sentence2"),
            tfds_labels=_ENTAILMENT,
        ),
        Task(
            "wnli",
            "WNLI",
            _BINARY,
            ("accuracy",),
            "train",
            ("dev",),
            ("test",),
            ("WNLI.tsv",),
            _pair("sentence1", "sentence2", "label"),
            _pair("sentence1", "sentence2", "label"),
            _pair("sentence1", "sentence2", None),
            "glue/wnli",
            {"train": "train", "dev": "validation", "test": "test"},
            ("sentence1", "sentence2"),
        ),
        # The diagnostic set: test only, predicted with the MNLI model (finetune/glue.py).
        Task(
            "ax",
            "diagnostic",
            _NLI,
            (),
            None,
            (),
            ("diagnostic",),
            ("AX.tsv",),
            None,
            None,
            _pair("sentence1", "sentence2", None),
            "glue/ax",
            {"diagnostic": "test"},
            ("premise", "hypothesis"),
        ),
        # The demo task (finetune/demo_task.py): is this sentence in its original word order?
        Task(
            "word_order",
            "WordOrder",
            _BINARY,
            ("accuracy",),
            "train",
            ("dev",),
            ("test",),
            ("WordOrder.tsv",),
            Layout("sentence", None, "label", None),
            Layout("sentence", None, "label", None),
            Layout("sentence", None, None, "index"),
            None,
            {},
            ("sentence", None),
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
    """The file's lines as bytes, split on b"\\n" only (GFile's own line iterator drops
    '\\r', and universal newlines would split a row at a bare '\\r' inside a field)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        pending = b""
        while chunk := f.read(chunk_bytes):
            *complete, pending = (pending + chunk).split(b"\n")
            yield from complete
        if pending:
            yield pending


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of a UTF-8 file; a final '\\r' (CRLF files) is removed."""
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
    test = {stem: read(stem, task.test_layout, False) for stem in task.test_files}
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
