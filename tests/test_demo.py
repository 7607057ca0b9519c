"""`make demo` end to end at a tiny scale: every stage runs and the report is complete.

The full demo (2 CPU cores, ~5 minutes of training) is measured in docs/demo.md; here the
same code runs with a small vocabulary and a few dozen steps.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _demo(workdir, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"  # one CPU device, as `make demo`
    return subprocess.run(
        [sys.executable, "-m", "pretrain.demo", f"--workdir={workdir}", "--vocab_size=2000", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.mark.slow(90)  # seconds on the 2-core CI machine
@pytest.mark.extended
def test_demo_runs_every_stage_and_reports(tmp_path):
    result = _demo(
        tmp_path,
        "--gin_bindings=run.steps=20",
        "--gin_bindings=run.batch_size=8",
        "--gin_bindings=run.eval_every=10",
        "--gin_bindings=run.eval_batches=2",
        "--gin_bindings=run.log_every=10",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = (tmp_path / "report.txt").read_text()
    for expected in (
        "mlm_accuracy",
        "(DebertaMLM)",
        "unigram baseline",
        "tokens/s",
        "fill-mask",
        "answer:",
        "over all",
    ):
        assert expected in report
    assert report.count("answer:") == 6
    assert (tmp_path / "run" / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["step"] == 20 and 0 < summary["unigram_baseline"] < 1
    assert 0 <= summary["fill_mask_top1"] <= summary["fill_mask_top5"] <= 1
    assert summary["initial_eval"]["loss"] > summary["loss"]
    # Run again: every stage is found done, the run resumes at its last step and only reports.
    again = _demo(
        tmp_path,
        "--gin_bindings=run.steps=20",
        "--gin_bindings=run.batch_size=8",
        "--gin_bindings=run.eval_batches=2",
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{tmp_path}/tokenizer is kept (2000 wordpieces" in again.stdout
    assert f"{tmp_path}/data is up to date" in again.stdout
    reported = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert reported["resumed_from"] == 20
    # The report and the summary keep the times of the call that trained.
    kept = ("wall_seconds", "demo_wall_seconds", "tokens_per_second")
    assert [reported[k] for k in kept] == [summary[k] for k in kept]
    assert "this call found the run trained and reported in" in (tmp_path / "report.txt").read_text()
    # The same workdir with another demo model (e.g. a `make demo` from before its model
    # changed): one error line before anything is written, the run's files as they were.
    described = (tmp_path / "run" / "model_config.json").read_text()
    other = _demo(tmp_path, "--gin_file=configs/runs/demo.gin", "--gin_bindings=run.steps=20")
    assert other.returncode != 0
    last = other.stderr.splitlines()[-1]
    assert "holds a run of another model than configs/runs/demo.gin's (EncoderConfig differs in " in last
    assert "disentangled" in last and "make clean-demo" in last
    assert (tmp_path / "run" / "model_config.json").read_text() == described


@pytest.mark.slow(40)
@pytest.mark.extended
def test_bert_demo_reports_nsp(tmp_path):
    """`make demo DEMO_GIN=configs/runs/demo.gin`: BERT-Tiny with MLM + NSP."""
    result = _demo(
        tmp_path,
        "--gin_file=configs/runs/demo.gin",
        "--gin_bindings=run.steps=10",
        "--gin_bindings=run.batch_size=8",
        "--gin_bindings=run.eval_every=10",
        "--gin_bindings=run.eval_batches=1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = (tmp_path / "report.txt").read_text()
    assert "(MaskedLM)" in report and "sentence_accuracy" in report and "(chance 50%)" in report
    assert "configs/runs/demo.gin" in result.stdout


@pytest.mark.slow(40)
@pytest.mark.extended
def test_a_demo_stopped_by_a_signal_says_how_to_resume(tmp_path, capsys, monkeypatch):
    """Ctrl-C or SIGTERM during the demo's training: the checkpoint is written and one line
    says to run the demo again, instead of a report of a run that did not finish."""
    from core import preemption
    from pretrain import demo
    from tests import cli_run

    def sigterm_at_step_3(watcher, step):
        if step == 3:
            watcher.signal_name = "SIGTERM"
        return watcher.signal_name is not None

    monkeypatch.setattr(preemption.StopWatcher, "should_stop", sigterm_at_step_3)
    args = [f"--workdir={tmp_path}", "--vocab_size=2000", "--gin_bindings=run.steps=20"]
    args += ["--gin_bindings=run.batch_size=8", "--gin_bindings=run.eval_batches=1"]
    result = cli_run.run(demo.main, args, capsys)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stopped by SIGTERM at step 3: run `make demo` again to resume" in result.stdout
    assert "[4/4]" not in result.stdout and "Traceback" not in result.stderr
    assert (tmp_path / "run" / "checkpoints" / "3").is_dir()
