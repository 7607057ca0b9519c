"""pretrain/cross_eval.py: every arm's model on every arm's held-out rows. Two tiny runs on
real English, one masking tokens and one whole words: the diagonal is each run's own
evaluation, and each column holds one set of rows."""

from __future__ import annotations

import dataclasses

import pytest

from data import shards
from pretrain import cross_eval
from tests import tiny


def _diagonal_is_own(shards_dir: str, configs: dict, workdir, model) -> None:
    """Trains each config a few steps; each arm's model on its own rows gives its own
    evaluation (the same rows, so the same loss to float rounding), and the table has a cell
    for every model and rows."""
    arms, own = {}, {}
    for name, data in configs.items():
        summary = tiny.run(workdir / name, shards_dir, 10, model_config=model, pipeline_config=data)
        arms[name] = cross_eval.Arm(str(workdir / name), data, tiny.BATCH, 2)
        own[name] = summary["eval"]["mlm_accuracy"], summary["eval"]["mlm_loss"]
    for name, arm in arms.items():
        accuracy, loss = cross_eval.mlm_metrics(arm.workdir)(cross_eval.rows(shards_dir, arm))
        assert accuracy == pytest.approx(own[name][0], abs=1e-6), (name, accuracy, own)
        assert loss == pytest.approx(own[name][1], rel=1e-5), (name, loss, own)
    table = cross_eval.table(shards_dir, arms)
    for name in configs:
        (line,) = [line for line in table.splitlines() if line.startswith(f"| {name} |")]
        assert len(line.split(" | ")) == 1 + len(configs)


@pytest.mark.slow(20)
@pytest.mark.extended
def test_the_diagonal_is_each_arms_own_evaluation(text_shards, tmp_path):
    model = dataclasses.replace(tiny.TINY, vocab_size=shards.load_manifest(text_shards).vocab_size)
    configs = {
        "token": dataclasses.replace(tiny.DATA, max_seq_length=32),
        "whole_word": dataclasses.replace(tiny.DATA, masking_unit="whole_word", max_seq_length=32),
    }
    _diagonal_is_own(text_shards, configs, tmp_path, model)


@pytest.mark.slow
def test_packed_rows_are_evaluated_as_in_training(synthetic_shards, tmp_path):
    """DOC-SENTENCES packs the synthetic documents' short rows: each example's positions and
    ids must reach the model, or attention crosses the examples of a row."""
    packed = dataclasses.replace(tiny.DATA, format="doc_sentences", sentence_objective="none")
    first = cross_eval.rows(synthetic_shards, cross_eval.Arm("", packed, tiny.BATCH, 1))[0]
    assert first["example_ids"].max() > 1  # rows of several examples: the case this is about
    _diagonal_is_own(synthetic_shards, {"token": tiny.DATA, "packed": packed}, tmp_path, tiny.TINY)


def test_an_arms_settings_default_as_the_trainers(tmp_path):
    gin_file = tmp_path / "arm.gin"
    gin_file.write_text("PipelineConfig.masking_unit = 'whole_word'\n", encoding="utf-8")
    arm = cross_eval.arm(str(tmp_path / "arm"), [str(gin_file)], [])
    assert (arm.batch_size, arm.eval_batches, arm.pipeline_config.masking_unit) == (256, 20, "whole_word")
    gin_file.write_text("run.phase2_start = 10\n", encoding="utf-8")
    with pytest.raises(cross_eval.CrossEvalError, match="trains two"):
        cross_eval.arm(str(tmp_path / "arm"), [str(gin_file)], [])


def test_an_arm_without_masked_lm_rows_is_one_line(tmp_path):
    gin_file = tmp_path / "electra.gin"
    gin_file.write_text(
        "run.batch_size = 8\nrun.eval_batches = 1\nPipelineConfig.masking = 'in_step'\n", encoding="utf-8"
    )
    with pytest.raises(cross_eval.CrossEvalError, match="masks in the step"):
        cross_eval.arm(str(tmp_path / "arm"), [str(gin_file)], [])
