"""`python -m finetune.glue` end to end (its main() in this process, tests/cli_run.py) on
every task of a generated official-layout folder, with a tiny random "pretrained" workdir:
results, table, leaderboard files and zip; and its one-line errors."""

import json
import os
import zipfile

import flax.linen as nn
import jax
import pytest

from core import local_pod
from data import tokenizers
from finetune import glue, submission
from finetune.tasks import TASKS, parse_tasks, read_glue_dir
from interop import bundle
from models.encoder import EncoderConfig
from models.pretraining import BertPretrainingModel, example_batch
from tests import cli_run, jitted
from tests.glue_folders import write_glue_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = [
    "--gin_bindings=Grid.learning_rates = (1e-3,)",
    "--gin_bindings=Grid.batch_sizes = (8,)",
    "--gin_bindings=Grid.num_epochs = (1,)",
    "--gin_bindings=Grid.seeds = (0,)",
    "--gin_bindings=Grid.max_seq_length = 32",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    glue_dir = str(root / "glue")
    write_glue_dir(glue_dir, rows=9)
    texts = [[f"{w} row" for w in 'He said "hello and left it caf\u00e9 plain words here'.split()]] * 3
    tokenizer = tokenizers.train_wordpiece(texts, 200)
    config = EncoderConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32
    )
    params = jitted.init(
        BertPretrainingModel(config), jax.random.key(0), example_batch(1, 8, 2), deterministic=True
    )
    bundle.save_pretrained(
        str(root / "pretrained"), config, nn.meta.unbox(params["params"]), tokenizer, step=3
    )
    return root, glue_dir


@pytest.fixture
def _run(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # --gin_file's default is relative to the repository root
    return lambda *args: cli_run.run(glue.main, args, capsys)


@pytest.mark.slow(25)
@pytest.mark.extended
def test_all_tasks_give_results_and_a_full_submission(setup, _run):
    root, glue_dir = setup
    out = root / "out"
    result = _run(
        f"--init_from={root / 'pretrained'}",
        "--tasks=all",
        f"--glue_dir={glue_dir}",
        f"--workdir={out}",
        "--mesh=data:4,fsdp:2",
        *FAST,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "GLUE score" in result.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["submission_complete"] and results["pretrained_step"] == 3
    assert set(results["tasks"]) == {t.name for t in parse_tasks("all")} - {"ax"}
    for name, entry in results["tasks"].items():
        data = read_glue_dir(glue_dir, TASKS[name])
        assert entry["train_examples"] == len(data.train)
        assert entry["dev_examples"] == {stem: len(rows) for stem, rows in data.dev.items()}
        expected_test = {stem: len(rows) for stem, rows in data.test.items()}
        if name == "mnli":  # AX is predicted with the MNLI model
            expected_test["diagnostic"] = len(read_glue_dir(glue_dir, TASKS["ax"]).test["diagnostic"])
        assert entry["test_examples"] == expected_test
        assert entry["chosen"]["per_seed"][0]["seed"] == 0 and entry["runs_trained"] == 1
        assert set(entry["metrics"]) == set(data.dev)
    assert -1.0 <= results["glue_score"] <= 1.0  # MCC and the correlations may be negative
    table = (out / "results.md").read_text()
    assert "GLUE score" in table and "83.8" in table and "87.6" in table  # published MNLI beside ours

    with zipfile.ZipFile(out / "submission.zip") as archive:
        assert sorted(archive.namelist()) == sorted(submission.SUBMISSION_FILES)
        ax = archive.read("AX.tsv").decode().splitlines()
    assert len(ax) == 1 + len(read_glue_dir(glue_dir, TASKS["ax"]).test["diagnostic"])
    assert {line.split("\t")[1] for line in ax[1:]} <= set(TASKS["mnli"].labels)
    mm = (out / "MNLI-mm.tsv").read_text().splitlines()
    assert len(mm) == 1 + len(read_glue_dir(glue_dir, TASKS["mnli"]).test["test_mismatched"])

    # Started again: every run is read back, nothing is trained.
    again = _run(
        f"--init_from={root / 'pretrained'}",
        "--tasks=rte",
        f"--glue_dir={glue_dir}",
        f"--workdir={out}",
        *FAST,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    rte = json.loads((out / "results.json").read_text())["tasks"]["rte"]
    assert (rte["runs_trained"], rte["runs_reused"]) == (0, 1)
    assert rte["metrics"] == results["tasks"]["rte"]["metrics"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tasks=rte"], "pass exactly one of --glue_dir"),
        (["--tasks=rte", "--glue_dir=GLUE", "--tfds"], "pass exactly one of --glue_dir"),
        (["--tasks=squad", "--glue_dir=GLUE"], "unknown task 'squad'"),
        (["--tasks=rte", "--glue_dir=NOWHERE"], "missing NOWHERE/RTE/train.tsv"),
        (["--tasks=rte", "--glue_dir=GLUE", "--mesh=data:3"], "--mesh 'data:3' has 3 devices"),
        (
            ["--tasks=rte", "--glue_dir=GLUE", "--gin_bindings=Grid.seeds = ()"],
            "Grid.seeds must not be empty",
        ),
        (["--tasks=rte", "--glue_dir=GLUE", "--gin_bindings=Grid.max_seq_length = 1024"], "max_position"),
    ],
)
def test_user_errors_are_one_line(setup, _run, args, message):
    root, glue_dir = setup
    args = [a.replace("GLUE", glue_dir) for a in args]
    result = _run(f"--init_from={root / 'pretrained'}", f"--workdir={root / 'err'}", *args)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_not_a_pretrained_workdir(setup, _run, tmp_path):
    _, glue_dir = setup
    result = _run(
        f"--init_from={tmp_path}", "--tasks=rte", f"--glue_dir={glue_dir}", f"--workdir={tmp_path}/o"
    )
    assert result.returncode == 2 and "error: no model_config.json" in result.stderr


@pytest.mark.slow(100)
@pytest.mark.extended
def test_two_processes_fine_tune_as_one_process(setup, tmp_path):
    """finetune.glue as a local pod of 2 processes x 4 devices (core/local_pod.py) against a
    1-process cluster of 8 devices with the same mesh: every host builds the same global
    batches and feeds its rows, so the dev metrics and the test predictions are identical;
    process 0 alone writes the results and the leaderboard files, complete. (A plain process
    sums gradients with XLA's in-process collectives, not gloo's: its results differ in the
    last bits, which fine-tuning grows to the 4th digit of STS-B's Pearson.)"""
    root, glue_dir = setup
    args = [
        f"--init_from={root / 'pretrained'}",
        "--tasks=rte,stsb",
        f"--glue_dir={glue_dir}",
        "--mesh=data:4,fsdp:2",
        *FAST,
    ]
    for processes, workdir in ((1, "one"), (2, "pod")):
        pod = local_pod.run_pod(
            ["finetune.glue", *args, f"--workdir={tmp_path / workdir}"],
            processes,
            8 // processes,
            str(tmp_path / "logs" / workdir),
            timeout=300,
        )
        assert all(r.returncode == 0 for r in pod), [r.output()[-3000:] for r in pod]
        assert all("done: GLUE score" in r.output() for r in pod)
    expected, got = (json.loads((tmp_path / w / "results.json").read_text()) for w in ("one", "pod"))
    for task in ("rte", "stsb"):
        assert got["tasks"][task]["metrics"] == expected["tasks"][task]["metrics"], task
        assert got["tasks"][task]["test_examples"] == expected["tasks"][task]["test_examples"]
    assert (tmp_path / "pod" / "RTE.tsv").read_text() == (tmp_path / "one" / "RTE.tsv").read_text()
    assert (tmp_path / "pod" / "STS-B.tsv").read_text() == (tmp_path / "one" / "STS-B.tsv").read_text()
    assert sorted(p.name for p in (tmp_path / "pod").iterdir()) == sorted(
        p.name for p in (tmp_path / "one").iterdir()
    )
