"""pretrain.train as a user runs it (its main() in this process, tests/cli_run.py): bad
inputs give one `error:` line, exit 2, and leave existing checkpoints untouched."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from data import synthetic
from pretrain import train
from tests import cli_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def run_setup(tmp_path_factory):
    """Synthetic shards, a tiny gin file for them, and a workdir holding a 2-step checkpoint."""
    base = tmp_path_factory.mktemp("cli")
    data_dir = synthetic.write_shards(
        str(base / "shards"),
        synthetic.make_documents(40, seed=1, max_len=8),
        synthetic.make_documents(6, seed=2, max_len=8, first_id=150),
    )
    gin_file = base / "tiny.gin"
    gin_file.write_text(f"""
include 'configs/models/bert_tiny.gin'
include 'configs/recipes/bert.gin'
run.data_dir = '{data_dir}'
EncoderConfig.vocab_size = {synthetic.VOCAB_SIZE}
PipelineConfig.max_seq_length = 32
PipelineConfig.max_predictions_per_seq = 5
PipelineConfig.document_shuffle_buffer = 10
PipelineConfig.instance_shuffle_buffer = 10
run.batch_size = 8
run.steps = 2
run.log_every = 1
run.eval_batches = 1
adamw.warmup_steps = 1
""")
    workdir = base / "work"
    return gin_file, workdir


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # gin includes are relative to the repository root


@pytest.fixture
def trained(run_setup, capsys):
    """The workdir with its 2-step checkpoint (trained by the first test that asks)."""
    gin_file, workdir = run_setup
    if not (workdir / "checkpoints").exists():
        result = cli_run.run(train.main, [f"--gin_file={gin_file}", f"--workdir={workdir}"], capsys)
        assert result.returncode == 0, result.stderr[-3000:]
    return gin_file, workdir


def _tree_hash(directory):
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(directory)):
        for name in sorted(files):
            digest.update(name.encode())
            digest.update(open(os.path.join(root, name), "rb").read())
    return digest.hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--gin_bindings=run.stepz=3"], "Configurable 'run' doesn't have a parameter named 'stepz'"),
        (["--gin_bindings=run.steps='ten'"], "run.steps must be an integer, got 'ten'"),
        (["--gin_bindings=EncoderConfig.hiden_size=8"], "doesn't have a parameter named 'hiden_size'"),
        (["--gin_bindings=EncoderConfig.vocab_size=999"], "model vocab_size=999 but the shards"),
        (["--gin_bindings=EncoderConfig.num_heads=3"], "divisible by num_heads"),
        (["--gin_bindings=run.batch_size=12"], "batch size 12 is not divisible by the data-parallel size 8"),
        (["--mesh=data:3"], "--mesh 'data:3' has 3 devices but 8 are available"),
        (["--gin_bindings=run.data_dir='/nonexistent'"], "no manifest.json in '/nonexistent'"),
    ],
)
def test_bad_input_is_one_error_line_and_checkpoints_stay(trained, capsys, extra, message):
    gin_file, workdir = trained
    before = _tree_hash(workdir / "checkpoints")
    result = cli_run.run(train.main, [f"--gin_file={gin_file}", f"--workdir={workdir}", *extra], capsys)
    errors = result.errors()
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(errors) == 1 and message in errors[0], errors or result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert _tree_hash(workdir / "checkpoints") == before


def test_missing_gin_file(tmp_path, capsys):
    result = cli_run.run(train.main, ["--gin_file=configs/runs/nope.gin", f"--workdir={tmp_path}"], capsys)
    assert result.returncode == 2 and "cannot read --gin_file configs/runs/nope.gin" in result.stderr


@pytest.mark.slow
def test_finished_run_started_again_resumes_and_stops(trained, capsys):
    """A finished run started again is evaluated, and its summary keeps the rates and times
    of the call that trained it."""
    gin_file, workdir = trained
    before = json.loads((workdir / "summary.json").read_text())
    result = cli_run.run(train.main, [f"--gin_file={gin_file}", f"--workdir={workdir}"], capsys)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from step 2" in result.stderr and "done: step 2" in result.stdout
    after = json.loads((workdir / "summary.json").read_text())
    kept = ("tokens_per_second", "train_seconds", "wall_seconds")
    assert [after[k] for k in kept] == [before[k] for k in kept] and after["resumed_from"] == 2
    assert before["wall_seconds"] > 0 and before["train_seconds"] > 0


@pytest.mark.slow
def test_the_vocabulary_size_comes_from_the_shards(trained, capsys):
    """Without a command-line binding, the shards' vocabulary size replaces the model gin
    file's (here bert_tiny.gin's published 30522): the run is the trained one, resumed."""
    gin_file, workdir = trained
    own = gin_file.parent / "no_vocab.gin"
    own.write_text(gin_file.read_text().replace(f"EncoderConfig.vocab_size = {synthetic.VOCAB_SIZE}\n", ""))
    result = cli_run.run(train.main, [f"--gin_file={own}", f"--workdir={workdir}"], capsys)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"EncoderConfig.vocab_size = {synthetic.VOCAB_SIZE}, the shards' tokenizer's" in result.stderr
    assert "the gin files say 30522" in result.stderr and "done: step 2" in result.stdout


def test_init_from_a_folder_without_a_model_writes_nothing(run_setup, tmp_path, capsys):
    gin_file, _ = run_setup
    empty, workdir = tmp_path / "empty", tmp_path / "new_run"
    empty.mkdir()
    args = [f"--gin_file={gin_file}", f"--workdir={workdir}", f"--gin_bindings=run.init_from='{empty}'"]
    result = cli_run.run(train.main, args, capsys)
    assert result.returncode == 2 and len(result.errors()) == 1, result.stderr[-3000:]
    assert result.errors()[0].startswith(f"error: run.init_from '{empty}': no finished checkpoint in")
    assert result.errors()[0].endswith("(it takes a workdir of pretrain.train or interop.convert import)")
    assert not workdir.exists() and os.listdir(empty) == []


def _copy(workdir, tmp_path):
    """The trained workdir's copy, for a test that trains in it further."""
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("compilation_cache"))
    return copy


@pytest.mark.slow
@pytest.mark.extended(keep=["batch_finished", "model"])
@pytest.mark.parametrize(
    "extra, message",
    [
        # no steps left
        (
            ["run.batch_size = 16"],
            "run.batch_size = 16, but the checkpoints in {w} were trained with 8 ({w}/launches/NNNN.json): "
            "resume with run.batch_size = 8, or bind run.reset_data_iterator = True to go on",
        ),
        # steps left, and a change that is allowed beside the one that is not
        (
            ["run.steps = 4", "run.batch_size = 16"],
            "run.batch_size = 16, but the checkpoints in {w} were trained with 8",
        ),
        (["PipelineConfig.max_seq_length = 16"], "PipelineConfig.max_seq_length = 16, but the checkpoints"),
        (
            ["EncoderConfig.num_layers = 1", "PipelineConfig.masking = 'dynamic'"],
            "EncoderConfig.num_layers = 1, but the checkpoints in {w} were trained with 2 "
            "({w}/launches/NNNN.json): resume with EncoderConfig.num_layers = 2, or start a new --workdir "
            "(run.init_from = '{w}' begins it from these parameters)",
        ),
        (
            ["adamw.weight_decay = 0.1"],
            "adamw.weight_decay = 0.1, but the checkpoints in {w} were trained with 0.01",
        ),
    ],
    ids=["batch_finished", "batch_with_steps_left", "length", "model", "optimizer"],
)
def test_a_resume_that_changes_what_the_checkpoints_mean_is_refused_and_writes_nothing(
    trained, capsys, extra, message
):
    gin_file, workdir = trained
    before = _tree_hash(workdir)
    args = [f"--gin_file={gin_file}", f"--workdir={workdir}", *(f"--gin_bindings={b}" for b in extra)]
    result = cli_run.run(train.main, args, capsys)
    assert result.returncode == 2 and len(result.errors()) == 1, result.stderr[-3000:]
    # NNNN: the last launch's record (other tests of this file resume the run too)
    assert re.search(re.escape(message.format(w=workdir)).replace("NNNN", r"\d{4}"), result.errors()[0])
    assert "Traceback" not in result.stderr
    assert _tree_hash(workdir) == before


@pytest.mark.slow
def test_a_resume_with_another_batch_and_reset_data_iterator_goes_on_and_is_recorded(
    trained, capsys, tmp_path
):
    """The documented way on with a new global batch: the model and optimizer state go on,
    the data stream restarts, the log and the launch history say so; the first launch's
    record still holds the config that trained the first checkpoints."""
    gin_file, workdir = trained
    copy = _copy(workdir, tmp_path)
    first = json.loads((copy / "launches" / "0001.json").read_text())
    bindings = ["run.steps = 4", "run.batch_size = 16", "run.reset_data_iterator = True"]
    args = [f"--gin_file={gin_file}", f"--workdir={copy}", *(f"--gin_bindings={b}" for b in bindings)]
    result = cli_run.run(train.main, args, capsys)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "this launch changes run.batch_size: 8 -> 16 (the checkpoints go on)" in result.stderr
    assert "this launch changes run.steps: 2 -> 4" in result.stderr
    assert (
        "the data stream restarts from its beginning (run.reset_data_iterator, and run.batch_size"
        in result.stderr
    )
    assert "resumed from step 2" in result.stderr and "done: step 4" in result.stdout
    records = sorted((copy / "launches").iterdir())
    last = json.loads(records[-1].read_text())
    assert json.loads(records[0].read_text()) == first and first["settings"]["run.batch_size"] == "8"
    assert "run.batch_size = 8" in first["config"]
    assert {c["setting"]: (c["was"], c["now"]) for c in last["changes"]} == {
        "run.batch_size": ("8", "16"),
        "run.reset_data_iterator": ("False", "True"),
        "run.steps": ("2", "4"),
    }
    assert last["resumed_from"] == 2 and last["settings"]["run.batch_size"] == "16"
    assert "run.batch_size = 16" in (copy / "config.gin").read_text()


@pytest.mark.slow(30)
@pytest.mark.extended
def test_a_second_launch_on_a_live_runs_workdir_is_refused_and_the_first_finishes(
    run_setup, tmp_path, capsys
):
    """The same command twice on one workdir (a scheduler relaunching a live job): the second
    exits at once with one line naming the first and writes nothing; the first finishes,
    with one metrics row per (split, step)."""
    gin_file, _ = run_setup
    workdir = tmp_path / "run"
    args = [f"--gin_file={gin_file}", f"--workdir={workdir}", "--gin_bindings=run.steps = 12"]
    first = subprocess.Popen(
        [sys.executable, "-m", "pretrain.train", *args],
        cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in first.stderr:  # until it has trained a step: the lease is long taken then
            lines.append(line)
            if "compilation included" in line:
                break
        else:
            pytest.fail("".join(lines[-30:]))
        from pretrain import trainer  # noqa: F401  (the imports' seconds are not the refusal's)

        start = time.monotonic()
        second = cli_run.run(train.main, args, capsys)
        refused_in = time.monotonic() - start
        rest = first.communicate(timeout=300)[1]
    finally:
        first.kill()
    assert first.returncode == 0, "".join(lines) + rest
    assert second.returncode == 2 and len(second.errors()) == 1 and "Traceback" not in second.stderr
    assert second.errors()[0].startswith(
        f"error: workdir '{workdir}' is in use by pretraining (pid {first.pid} on "
    )
    assert refused_in < 10, refused_in
    rows = [
        (r["split"], r["step"]) for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
    ]
    assert len(rows) == len(set(rows)) and ("train", 12) in rows
    assert len(list((workdir / "tensorboard").iterdir())) == 1
    assert len(list((workdir / "launches").iterdir())) == 1
    assert not (workdir / "lease.json").exists()
