"""pretrain.ablate: every arm trains on the same data and budget, finished arms are skipped,
the results table and curves are written, unequal token budgets are refused."""

import os
import subprocess
import sys

import pytest

from tests import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("ablate")
    data_dir = synthetic.write_shards(
        str(base / "shards"),
        synthetic.make_documents(40, seed=1, max_len=8),
        synthetic.make_documents(6, seed=2, max_len=8, first_id=150),
    )
    base_gin = base / "base.gin"
    base_gin.write_text("""
include 'configs/recipes/bert.gin'
EncoderConfig.hidden_size = 32
EncoderConfig.num_layers = 1
EncoderConfig.num_heads = 2
EncoderConfig.intermediate_size = 64
PipelineConfig.max_seq_length = 32
PipelineConfig.max_predictions_per_seq = 5
PipelineConfig.document_shuffle_buffer = 10
PipelineConfig.instance_shuffle_buffer = 10
run.batch_size = 8
run.steps = 1000
run.log_every = 2
run.eval_every = 2
run.eval_batches = 1
""")
    grid = base / "grid"
    grid.mkdir()
    (grid / "nsp.gin").write_text("PipelineConfig.sentence_objective = 'nsp'\n")
    (grid / "none.gin").write_text("PipelineConfig.sentence_objective = 'none'\n")
    return data_dir, base_gin, grid


def _ablate(grid, workdir, data_dir, base_gin, *extra):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain.ablate",
            str(grid),
            f"--workdir={workdir}",
            f"--data_dir={data_dir}",
            f"--gin_file={base_gin}",
            "--steps=4",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.mark.slow(60)  # seconds on the 2-core CI machine
def test_grid_runs_every_arm_then_skips_them(setup, tmp_path):
    data_dir, base_gin, grid = setup
    result = _ablate(grid, tmp_path, data_dir, base_gin)
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "results.md").read_text()
    rows = [l for l in table.splitlines() if l.startswith("| n")]
    assert [r.split("|")[1].strip() for r in rows] == ["none", "nsp"]
    assert rows[0].split("|")[4].strip() == "-"  # no sentence head, no sentence accuracy
    assert float(rows[1].split("|")[4]) > 0
    assert (tmp_path / "eval_curves.png").stat().st_size > 0
    for arm in ("none", "nsp"):
        assert '"step": 4' in (tmp_path / arm / "summary.json").read_text()

    again = _ablate(grid, tmp_path, data_dir, base_gin)
    assert again.returncode == 0
    assert again.stdout.count("finished before, skipped") == 2


def test_unequal_token_budgets_are_refused(setup, tmp_path):
    data_dir, base_gin, grid = setup
    uneven = tmp_path / "uneven"
    uneven.mkdir()
    (uneven / "short.gin").write_text("PipelineConfig.max_seq_length = 16\n")
    (uneven / "long.gin").write_text("PipelineConfig.max_seq_length = 32\n")
    result = _ablate(uneven, tmp_path / "w", data_dir, base_gin)
    errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "different numbers of training tokens" in errors[0]
