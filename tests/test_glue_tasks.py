"""GLUE readers: every task's official layout read completely and correctly; clear errors."""

import logging
import os

import numpy as np
import pytest

from finetune import demo_task, submission
from finetune.tasks import TASKS, GlueDataError, _tfds_label, parse_tasks, read_glue_dir, read_tsv, task_file
from tests.glue_folders import write_glue_dir


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("glue"))
    return root, write_glue_dir(root)


@pytest.mark.parametrize("name", [n for n in TASKS if TASKS[n].tfds_name])  # the GLUE ones
def test_every_row_read_with_its_label(glue, name):
    root, expected = glue
    task = TASKS[name]
    data = read_glue_dir(root, task)
    files = {**({"train": data.train} if task.train_file else {}), **data.dev, **data.test}
    assert set(files) == {stem for (t, stem) in expected if t == name}
    for stem, examples in files.items():
        rows = expected[(name, stem)]
        assert len(examples) == len(rows), stem  # no row dropped or merged
        for example, row in zip(examples, rows):
            assert example.text_a == row["text_a"] and example.text_b == row["text_b"]
            if stem in task.test_files:
                assert example.label is None and example.index == row["index"]
            elif task.is_regression:
                assert example.label == pytest.approx(float(row["label"]))
            else:
                assert task.labels[example.label] == row["label"]
            assert example.where.startswith(os.path.join(root, task.folder))


def test_quotes_unicode_and_bom_survive(glue):
    root, _ = glue
    mrpc = read_glue_dir(root, TASKS["mrpc"])
    texts = [e.text_a for e in mrpc.train]
    assert any(t.startswith('He said "hello and left.') for t in texts)
    assert any("\u65e5\u672c\u8a9e" in t for t in texts)
    # CoLA train has no header: its first line is a row, not skipped.
    cola = read_glue_dir(root, TASKS["cola"])
    assert cola.train[0].where.endswith("train.tsv:1")


def test_mnli_splits_and_ax(glue):
    root, expected = glue
    mnli = read_glue_dir(root, TASKS["mnli"])
    assert set(mnli.dev) == {"dev_matched", "dev_mismatched"}
    assert set(mnli.test) == {"test_matched", "test_mismatched"}
    assert (
        len(mnli.dev["dev_mismatched"])
        == len(expected[("mnli", "dev_mismatched")])
        != len(mnli.dev["dev_matched"])
    )
    ax = read_glue_dir(root, TASKS["ax"])
    assert (
        ax.train == [] and ax.dev == {} and len(ax.test["diagnostic"]) == len(expected[("ax", "diagnostic")])
    )


def test_a_folder_without_test_files_gives_dev_results_only(tmp_path, caplog):
    """A user's own split often has train and dev files only: no test rows, no leaderboard
    file, and a log line that says so; AX, which is nothing but its test file, stays required."""
    write_glue_dir(str(tmp_path))
    os.remove(tmp_path / "RTE" / "test.tsv")
    with caplog.at_level(logging.INFO, logger="finetune"):
        data = read_glue_dir(str(tmp_path), TASKS["rte"])
    assert data.test == {} and data.train and data.dev["dev"]
    assert "rte: no RTE/test.tsv: dev results only, no leaderboard file" in caplog.text
    for path in (tmp_path / "diagnostic").glob("*.tsv"):
        os.remove(path)
    with pytest.raises(GlueDataError, match="missing "):
        read_glue_dir(str(tmp_path), TASKS["ax"])


def test_missing_file_names_it(tmp_path):
    write_glue_dir(str(tmp_path))
    os.remove(tmp_path / "RTE" / "dev.tsv")
    with pytest.raises(GlueDataError, match=r"missing .*RTE/dev\.tsv"):
        read_glue_dir(str(tmp_path), TASKS["rte"])


@pytest.mark.parametrize(
    "task,file,line,bad,message",
    [
        (
            "rte",
            "RTE/train.tsv",
            3,
            "7\tonly two fields",
            r"RTE/train\.tsv:3: 2 tab-separated fields, expected 4",
        ),
        ("rte", "RTE/dev.tsv", 2, "7\ta\tb\tmaybe", r"RTE/dev\.tsv:2: label 'maybe' is not one of"),
        (
            "stsb",
            "STS-B/train.tsv",
            4,
            "1\tg\tf\ty\to\ts\ts\ta\tb\tfive",
            r"STS-B/train\.tsv:4: score 'five'",
        ),
        (
            "cola",
            "CoLA/train.tsv",
            1,
            "src\t1\ttoo few",
            r"CoLA/train\.tsv:1: 3 tab-separated fields, expected 4",
        ),
        ("sst2", "SST-2/train.tsv", 1, "text\tlabel", r"SST-2/train\.tsv:1: header has no column 'sentence'"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, task, file, line, bad, message):
    write_glue_dir(str(tmp_path))
    path = tmp_path / file
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[line - 1] = bad
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(GlueDataError, match=message):
        read_glue_dir(str(tmp_path), TASKS[task])


def test_bare_carriage_return_stays_inside_a_field(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_bytes(b"sentence\tlabel\nfirst\rhalf\t1\nsecond\t0\n")
    rows = read_tsv(str(path), TASKS["sst2"], TASKS["sst2"].train_layout, labeled=True)
    assert [r.text_a for r in rows] == ["first\rhalf", "second"] and [r.label for r in rows] == [1, 0]


def test_parse_tasks():
    assert [t.name for t in parse_tasks("all")] == [
        "cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "ax",
    ]  # fmt: skip
    assert [t.name for t in parse_tasks("STS-B, CoLA")] == ["cola", "stsb"]
    with pytest.raises(GlueDataError, match="unknown task 'squad'"):
        parse_tasks("cola,squad")
    with pytest.raises(GlueDataError, match="add mnli"):
        parse_tasks("ax")


def test_submission_files_one_line_per_test_row(glue, tmp_path):
    root, _ = glue
    rng = np.random.default_rng(0)
    written = []
    for name in [t.name for t in parse_tasks("all")]:
        task = TASKS[name]
        data = read_glue_dir(root, task)
        for stem, out in zip(task.test_files, task.submission_names):
            logits = rng.normal(size=(len(data.test[stem]), task.num_outputs)) * 3
            labels = submission.prediction_labels(task, logits)
            submission.write_predictions(str(tmp_path / out), data.test[stem], labels)
            lines = (tmp_path / out).read_text().splitlines()
            assert lines[0] == "index\tprediction" and len(lines) == len(data.test[stem]) + 1
            for line, example in zip(lines[1:], data.test[stem]):
                index, prediction = line.split("\t")
                assert index == example.index
                if task.is_regression:
                    assert 0.0 <= float(prediction) <= 5.0
                else:
                    assert prediction in task.labels
            written.append(out)
    assert sorted(written) == sorted(submission.SUBMISSION_FILES)


@pytest.mark.slow
def test_demo_task_layout(tmp_path):
    folder = demo_task.make_task(str(tmp_path), train=40, dev=10, test=6)
    data = read_glue_dir(str(tmp_path), TASKS["word_order"])
    assert (len(data.train), len(data.dev["dev"]), len(data.test["test"])) == (40, 10, 6)
    assert sum(e.label for e in data.train) == 20  # balanced
    texts = [e.text_a for e in data.train + data.dev["dev"] + data.test["test"]]
    # A shuffled sentence keeps its words; originals appear in one split only.
    assert len({" ".join(sorted(t.split())) for t in texts}) == len(texts)
    assert task_file(str(tmp_path), TASKS["word_order"], "train") == os.path.join(folder, "train.tsv")


@pytest.mark.slow
def test_tfds_reader_reads_every_split_and_maps_labels_by_name():
    import tensorflow_datasets as tfds

    from finetune.tasks import read_tfds

    with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
        for task in parse_tasks("all"):
            data = read_tfds(task)
            assert set(data.dev) == set(task.dev_files) and set(data.test) == set(task.test_files)
            assert len(data.train) == (4 if task.train_file else 0)
            rows = data.train + [e for split in data.dev.values() for e in split]
            for example in rows:
                assert (example.text_b is None) == (task.tfds_text[1] is None)
                if task.is_regression:
                    assert isinstance(example.label, float)
                else:
                    assert 0 <= example.label < len(task.labels)
            assert all(e.label is None and e.index.isdigit() for split in data.test.values() for e in split)
    # TFDS's MNLI classes are (entailment, neutral, contradiction); ours follow the TSV names.
    mnli, rte = TASKS["mnli"], TASKS["rte"]
    names = ["entailment", "neutral", "contradiction"]
    assert [mnli.labels[_tfds_label(mnli, names, i, "x")] for i in range(3)] == names
    assert rte.labels[_tfds_label(rte, ["entailment", "not_entailment"], 1, "x")] == "not_entailment"
    # Binary GLUE tasks: TFDS class i is the TSV's label "i" (CoLA 1 = acceptable).
    cola = TASKS["cola"]
    assert cola.labels[_tfds_label(cola, ["unacceptable", "acceptable"], 1, "x")] == "1"
