"""pretrain/launches.py on its own: which settings a resume may change, what is compared
with what, and which launch's record a checkpoint is compared with. (The trainer's use of
it, end to end: tests/test_train_cli.py.)"""

from __future__ import annotations

import json

import gin
import pytest

from core.errors import ConfigError
from pretrain import (
    launches,
    trainer,  # noqa: F401  (registers run, adamw, EncoderConfig, ... with gin)
)


@pytest.mark.parametrize(
    "setting, kind",
    [
        ("run.steps", "free"),
        ("run.eval_every", "free"),
        ("run.microbatches", "free"),
        ("run.batch_size", "stream"),
        ("run.data_dir", "stream"),
        ("PipelineConfig.max_seq_length", "stream"),
        ("phase2/PipelineConfig.masking", "stream"),
        ("EncoderConfig.dtype", "free"),
        ("EncoderConfig.remat_policy", "free"),
        ("models.encoder.EncoderConfig.attention_implementation", "free"),
        ("EncoderConfig.hidden_size", "fixed"),
        ("XLNetOptions.mem_len", "free"),
        ("XLNetOptions.reuse_len", "fixed"),
        ("adamw.learning_rate", "free"),
        ("lamb.warmup_steps", "free"),
        ("adamw.b2", "fixed"),
        ("make_objective.objective", "fixed"),
        ("logical_axis_rules.fsdp_embed", "free"),
        ("ElectraRTD.generator_size", "fixed"),
    ],
)
def test_each_setting_has_its_kind(setting, kind):
    assert launches.kind(setting) == kind


def _record(
    settings, config="", operative="", fingerprint="f1", resumed_from=None, where="W/launches/0001.json"
):
    return {
        "settings": settings,
        "config": config,
        "operative_config": operative or config,
        "data_fingerprint": fingerprint,
        "resumed_from": resumed_from,
        "where": where,
    }


@pytest.fixture
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_what_is_compared(clean_gin):
    view = {"run.steps": "400", "run.data_dir": "'/a'", "EncoderConfig.new_field": "0"}
    before = _record({"run.steps": "200", "run.data_dir": "'/a'"})
    # A field only one launch knows (another code version) is not compared.
    assert [(c.setting, c.was, c.now, c.kind) for c in launches.changes(before, view, "f1")] == [
        ("run.steps", "200", "400", "free")
    ]
    moved = {**view, "run.data_dir": "'gs://b/a'"}
    assert [c.kind for c in launches.changes(before, moved, "f1")] == ["free", "free"]  # same shards
    assert [c.kind for c in launches.changes(before, moved, "f2")] == ["stream", "free"]
    unknown = _record({"run.data_dir": "'/a'"}, fingerprint=None)
    assert [c.kind for c in launches.changes(unknown, {"run.data_dir": "'/b'"}, None)] == ["stream"]
    # shards written anew where the old ones were
    (anew,) = launches.changes(_record({"run.data_dir": "'/a'"}), {"run.data_dir": "'/a'"}, "f2")
    with pytest.raises(
        ConfigError, match="the shards in run.data_dir were written anew since the checkpoints"
    ):
        launches.check([anew], "W", before, reset_data_iterator=False)
    assert launches.check([anew], "W", before, reset_data_iterator=True)


def test_gin_bindings_of_other_configurables_are_compared_at_their_operative_value(clean_gin):
    before = _record(
        {}, config="adamw.b2 = 0.98\nSTEPS = 100\n", operative="adamw.b2 = 0.98\nadamw.eps = 1e-06\n"
    )
    gin.parse_config("adamw.eps = 1e-06\nadamw.b2 = 0.999\n")
    changed = launches.changes(before, {}, "f1")
    # eps: bound now, operative then with the same value; b2: another value; the macro: skipped
    assert [(c.setting, c.was, c.now, c.kind) for c in changed] == [("adamw.b2", "0.98", "0.999", "fixed")]
    with pytest.raises(ConfigError) as refused:
        launches.check(changed, "W", before, reset_data_iterator=True)
    assert str(refused.value) == (
        "adamw.b2 = 0.999, but the checkpoints in W were trained with 0.98 (W/launches/0001.json): resume "
        "with adamw.b2 = 0.98, or start a new --workdir (run.init_from = 'W' begins it from these parameters)"
    )


def test_a_checkpoint_is_compared_with_the_launch_that_wrote_it(tmp_path):
    """Launch 2 resumed from step 1000 with another batch and saved nothing (it failed): the
    checkpoint of step 1000 is still launch 1's, and so are the settings it is compared with."""
    records = tmp_path / launches.LAUNCHES_DIR
    records.mkdir()
    for number, resumed_from, batch in ((1, None, "32"), (2, 1000, "64")):
        record = _record({"run.batch_size": batch}, resumed_from=resumed_from)
        (records / f"{number:04d}.json").write_text(json.dumps(record))
    assert launches.previous(str(tmp_path), 1000)["settings"]["run.batch_size"] == "32"
    assert launches.previous(str(tmp_path), 1500)["settings"]["run.batch_size"] == "64"
    assert launches.previous(str(tmp_path / "none"), 1000) is None
