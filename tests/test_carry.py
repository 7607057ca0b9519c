"""State an objective carries from step to step (XLNet's memories), in the platform: the
train state keeps it with the rows first, microbatches and the mesh split it with the rows
it belongs to, a skipped step restarts it, checkpoints keep it (or, when the run says so,
not), and a resume that would attach it to other rows is refused.

`RowMemoryMLM` is the smallest objective that carries something the way XLNet does: every
row's memory (a decayed mean of the row's input embeddings, computed without gradient) is
read by that row's loss at the next step, so a carry restored wrongly, split across the
wrong rows or dropped changes the parameters that training ends with.
"""

import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from core import axes, checkpointing, metrics_log, optim, sharding
from core.state import TrainState, params_sha256
from data.pipeline_config import PipelineConfig
from pretrain import step
from pretrain.objectives import MaskedLM
from tests import mesh_training, tiny

# How much the memory term weighs in the loss: enough to move the parameters visibly.
MEMORY_WEIGHT = 0.5


class RowMemoryMLM(MaskedLM):
    """MaskedLM + (MEMORY_WEIGHT / B) * sum_rows <memory_r, mean embedding of row r>; the new
    memory of row r is 0.5 * memory_r + that mean (no gradient)."""

    def init_carry(self, batch_size):
        zeros = jnp.zeros((batch_size, self.model_config.hidden_size), jnp.float32)
        return {"memory": nn.LogicallyPartitioned(zeros, names=(axes.BATCH, None))}

    def loss_with_carry(self, params, batch, carry, rngs, normalizers, *, train):
        loss, sums = self.loss(params, batch, rngs, normalizers, train=train)
        table = params["encoder"]["embeddings"]["word_embeddings"]["embedding"]
        mask = batch["input_mask"][..., None].astype(jnp.float32)
        rows = (table[batch["input_ids"]] * mask).sum(1) / jnp.maximum(mask.sum(1), 1.0)
        memory_sum = (carry["memory"] * rows).sum()
        loss = loss + MEMORY_WEIGHT * memory_sum / normalizers["sentence_count"]
        new_carry = {"memory": 0.5 * carry["memory"] + jax.lax.stop_gradient(rows)}
        return loss, dict(sums, memory_sum=memory_sum), new_carry

    def summarize(self, sums):
        return dict(super().summarize(sums), memory_term=sums["memory_sum"] / sums["sentence_count"])


MESH_PIPELINE = PipelineConfig(max_seq_length=mesh_training.L, max_predictions_per_seq=mesh_training.P)


def _mesh_objective():
    return RowMemoryMLM(mesh_training.SHARDABLE, MESH_PIPELINE)


@pytest.mark.slow
def test_mesh_and_microbatches_carry_each_rows_own_state():
    """Three steps on one device, and as 2 microbatches on a data x fsdp x tensor mesh: the
    same carry row by row (each microbatch returns its rows' new carry, put back in row
    order) and the same losses and parameters, which read it (that the parameters depend on
    the carry, test_resume_with_carried_state[left_out] shows)."""
    batches = mesh_training.mlm_batches(3)
    one, one_losses = mesh_training.train(
        sharding.make_mesh(None, jax.devices()[:1]), batches, _mesh_objective()
    )
    memory = np.asarray(one.carry["memory"])
    assert memory.shape == (mesh_training.B, mesh_training.SHARDABLE.hidden_size)
    # Every row's memory is its own, so a carry put back in another row order could not match.
    assert len({tuple(np.round(row, 5)) for row in memory}) == mesh_training.B
    spec, k = mesh_training.SHARDED_AND_MICROBATCHED
    split, split_losses = mesh_training.train(sharding.make_mesh(spec), batches, _mesh_objective(), k)
    np.testing.assert_allclose(np.asarray(split.carry["memory"]), memory, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(split_losses, one_losses, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        jax.device_get(split.params),
        jax.device_get(one.params),
    )


@pytest.mark.slow
def test_a_skipped_step_restarts_the_carry():
    """A non-finite memory makes the step non-finite: with skip_nonfinite the parameters stay
    and the carry restarts from its initial value (zeros), not the non-finite new one."""
    objective = _mesh_objective()
    optimizer, schedule = optim.adamw(total_steps=10, learning_rate=1e-2, warmup_steps=1)
    partitioner = sharding.Partitioner(
        sharding.make_mesh(None, jax.devices()[:1]), sharding.logical_axis_rules()
    )
    steps = step.build(
        objective=objective,
        optimizer=optimizer,
        schedule=schedule,
        partitioner=partitioner,
        batch_size=mesh_training.B,
        skip_nonfinite=True,
        donate=False,
    )
    state = steps.states(jax.random.key(0))
    state = state.replace(carry={"memory": state.carry["memory"].at[3].set(jnp.inf)})
    with partitioner:
        batch = partitioner.global_batch(mesh_training.mlm_batches(1)[0])
        new, metrics = steps.train_step(state, batch, jax.random.key(1))
    assert int(metrics["finite"]) == 0 and int(new.step) == 1
    assert params_sha256(new.params) == params_sha256(state.params)
    np.testing.assert_array_equal(np.asarray(new.carry["memory"]), 0.0)


# --- checkpoints ----------------------------------------------------------------------------


def _state(carry_rows=4, value=7.0):
    return TrainState(
        step=jnp.int32(2),
        params={"w": jnp.arange(3.0)},
        opt_state={"mu": jnp.ones(3)},
        carry={"memory": jnp.full((carry_rows, 2), value)} if carry_rows else None,
    )


def _abstract(state):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)


def test_checkpoints_keep_the_carry_unless_told_not_to(tmp_path):
    state = _state()
    ckpt = checkpointing.Checkpointer(str(tmp_path / "kept"))
    ckpt.save(2, state, None)
    ckpt.close()
    restored, step = checkpointing.Checkpointer(str(tmp_path / "kept")).restore_latest(
        _abstract(state), lambda s: None
    )
    assert step == 2
    np.testing.assert_array_equal(np.asarray(restored.carry["memory"]), 7.0)
    # Not saved: the checkpoint holds no carry and the restored state's carry is None (the
    # trainer then starts it from its initial value).
    ckpt = checkpointing.Checkpointer(str(tmp_path / "left_out"), save_carry=False)
    ckpt.save(2, state, None)
    ckpt.close()
    assert (
        checkpointing.saved_tree(str(tmp_path / "left_out" / "checkpoints" / "2" / "state"))["carry"] is None
    )
    restored, step = checkpointing.Checkpointer(str(tmp_path / "left_out")).restore_latest(
        _abstract(state), lambda s: None
    )
    assert step == 2 and restored.carry is None
    np.testing.assert_array_equal(np.asarray(restored.params["w"]), [0.0, 1.0, 2.0])


def test_a_checkpoint_from_before_carried_state_restores(tmp_path):
    """A train state saved by a version without `TrainState.carry` (its tree has no such key)."""
    old = {"step": jnp.int32(5), "params": {"w": jnp.arange(3.0)}, "opt_state": {"mu": jnp.ones(3)}}
    ocp.PyTreeCheckpointer().save(str(tmp_path / "checkpoints" / "5" / "state"), old)
    restored, step = checkpointing.Checkpointer(str(tmp_path)).restore_latest(
        _abstract(_state(carry_rows=0)), lambda s: None
    )
    assert step == 5 and restored.carry is None and int(restored.step) == 5
    # And into an objective that carries state: the carry is left to the caller.
    restored, _ = checkpointing.Checkpointer(str(tmp_path)).restore_latest(
        _abstract(_state()), lambda s: None
    )
    assert restored.carry is None
    np.testing.assert_array_equal(np.asarray(restored.opt_state["mu"]), 1.0)


def test_a_carry_of_other_rows_is_refused_in_one_line_or_restarted(tmp_path, caplog):
    ckpt = checkpointing.Checkpointer(str(tmp_path))
    ckpt.save(2, _state(carry_rows=4), None)
    ckpt.close()
    wider = _abstract(_state(carry_rows=8))
    with pytest.raises(checkpointing.CheckpointError) as e:
        checkpointing.Checkpointer(str(tmp_path)).restore_latest(wider, lambda s: None)
    assert str(e.value) == (
        f"checkpoint step 2 in {tmp_path}/checkpoints carries state for global batches of 4 rows, "
        "this run's have 8: resume with run.batch_size = 4, or bind run.reset_data_iterator = True "
        "to keep the model and optimizer state and restart the data stream and the carried state"
    )
    assert os.listdir(tmp_path / "checkpoints") == ["2"]  # not damage: nothing moved
    restored, step = checkpointing.Checkpointer(str(tmp_path)).restore_latest(
        wider, lambda s: None, reset_iterator=True
    )
    assert step == 2 and restored.carry is None
    np.testing.assert_array_equal(np.asarray(restored.params["w"]), [0.0, 1.0, 2.0])
    assert "any carried state from its initial value" in caplog.text


def test_a_carry_of_another_shape_restarts_and_nothing_is_moved(tmp_path, caplog):
    """The same rows but another shape (another memory length): the step is restored, the
    carry left to restart from its initial value, and the checkpoint is not taken for damage."""
    ckpt = checkpointing.Checkpointer(str(tmp_path))
    ckpt.save(2, _state(carry_rows=4), None)
    ckpt.close()
    longer = _abstract(_state(carry_rows=4))
    longer = longer.replace(
        carry={"memory": jax.ShapeDtypeStruct((4, 3), jnp.float32, sharding=longer.carry["memory"].sharding)}
    )
    restored, step = checkpointing.Checkpointer(str(tmp_path)).restore_latest(longer, lambda s: None)
    assert step == 2 and restored.carry is None and os.listdir(tmp_path / "checkpoints") == ["2"]
    assert "its carried state has shapes" in caplog.text and "restarts from its initial value" in caplog.text


# --- the loop -------------------------------------------------------------------------------


def _carry_of(workdir, step):
    saved = ocp.PyTreeCheckpointer().restore(os.path.join(workdir, "checkpoints", str(step), "state"))
    return saved["carry"]


@pytest.mark.slow(30)
@pytest.mark.parametrize("checkpoint_carry", [True, False], ids=["saved", "left_out"])
@pytest.mark.extended  # two training runs per case; make test proves the checkpoints' part above
def test_resume_with_carried_state(checkpoint_carry, synthetic_shards, tmp_path):
    """Stopped after step 5 and resumed: with the carry in the checkpoint, the same parameters
    and carry as the run that never stopped; without it the carry restarts from zeros, and
    the parameters (which read it) end elsewhere."""
    settings = dict(objective=RowMemoryMLM, checkpoint_carry=checkpoint_carry)
    full = tiny.run(tmp_path, synthetic_shards, steps=10, **settings)
    carry = _carry_of(tmp_path, 10)
    shutil.rmtree(tmp_path / "checkpoints" / "10")  # what a preemption after step 9 leaves
    resumed = tiny.run(tmp_path, synthetic_shards, steps=10, **settings)
    assert resumed["resumed_from"] == 5
    assert "memory_term" in resumed["eval"]
    if checkpoint_carry:
        assert resumed["params_sha256"] == full["params_sha256"]
        np.testing.assert_array_equal(_carry_of(tmp_path, 10)["memory"], carry["memory"])
        assert resumed["eval"] == full["eval"]
    else:
        assert carry is None and _carry_of(tmp_path, 5) is None
        assert resumed["params_sha256"] != full["params_sha256"]


@pytest.mark.slow(20)
def test_the_second_phase_starts_its_carry_from_zeros(synthetic_shards, tmp_path):
    """A two-phase run: the first step of phase 2 reads zero memories (its rows belong to a
    new stream), the steps around it the memories their stream built."""
    tiny.run(
        tmp_path,
        synthetic_shards,
        steps=4,
        objective=RowMemoryMLM,
        phase2_start=2,
        phase2_pipeline_config=tiny.DATA,
        log_every=1,
    )
    memory_term = {r["step"]: r["memory_term"] for r in metrics_log.read(str(tmp_path), "train")}
    assert memory_term[3] == 0.0
    assert memory_term[2] != 0.0 and memory_term[4] != 0.0
