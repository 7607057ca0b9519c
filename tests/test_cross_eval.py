"""pretrain/cross_eval.py: every arm's model on every arm's held-out rows. Two tiny runs on
real English, one masking tokens and one whole words: the diagonal is each run's own
evaluation, and each column holds one set of rows."""

from __future__ import annotations

import dataclasses

import pytest

from data import shards
from pretrain import cross_eval
from tests import tiny


@pytest.mark.slow(20)
@pytest.mark.extended
def test_the_diagonal_is_each_arms_own_evaluation(text_shards, tmp_path):
    model = dataclasses.replace(tiny.TINY, vocab_size=shards.load_manifest(text_shards).vocab_size)
    arms, own = {}, {}
    for unit in ("token", "whole_word"):
        data = dataclasses.replace(tiny.DATA, masking_unit=unit, max_seq_length=32)
        summary = tiny.run(tmp_path / unit, text_shards, 10, model_config=model, pipeline_config=data)
        arms[unit] = cross_eval.Arm(str(tmp_path / unit), data, tiny.BATCH, 2)
        own[unit] = summary["eval"]["mlm_accuracy"]
    table = cross_eval.table(text_shards, arms)
    cells = {
        line.split(" | ")[0].strip("| "): [float(c) for c in line.strip(" |").split(" | ")[1:]]
        for line in table.splitlines()
        if line.startswith("| token") or line.startswith("| whole_word")
    }
    assert cells["token"][0] == pytest.approx(own["token"], abs=1e-3)
    assert cells["whole_word"][1] == pytest.approx(own["whole_word"], abs=1e-3)
    assert all(0 <= c <= 1 for row in cells.values() for c in row)


def test_an_arm_without_masked_lm_rows_is_one_line(tmp_path):
    gin_file = tmp_path / "electra.gin"
    gin_file.write_text(
        "run.batch_size = 8\nrun.eval_batches = 1\nPipelineConfig.masking = 'in_step'\n", encoding="utf-8"
    )
    with pytest.raises(cross_eval.CrossEvalError, match="masks in the step"):
        cross_eval.arm(str(tmp_path / "arm"), [str(gin_file)], [])
