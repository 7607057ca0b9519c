"""Scale-out on 8 fake CPU devices: every mesh gives the single-device result, parameters are
sharded as the rules say, gradient accumulation and remat change nothing, hosts split the data."""

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from core import optim, sharding
from data import pipeline, shards, synthetic
from data.pipeline import PipelineConfig
from models.encoder import EncoderConfig
from pretrain import step
from pretrain.objectives import MaskedLM

# 8 heads and dims divisible by 8 so that tensor:8 is possible; no dropout so that every
# layout computes the same function.
TINY = EncoderConfig(
    vocab_size=256,
    hidden_size=32,
    num_layers=2,
    num_heads=8,
    intermediate_size=64,
    max_position_embeddings=32,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)
B, L, P = 16, 24, 4


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        mask = (np.arange(L)[None] < rng.integers(8, L + 1, size=(B, 1))).astype(np.int32)
        out.append(
            {
                "input_ids": (rng.integers(5, TINY.vocab_size, size=(B, L)) * mask).astype(np.int32),
                "input_mask": mask,
                "segment_ids": ((np.arange(L)[None] > 4) * mask).astype(np.int32),
                "positions": np.broadcast_to(np.arange(L, dtype=np.int32), (B, L)).copy(),
                "masked_lm_positions": np.sort(rng.choice(8, size=(B, P), replace=True), axis=1).astype(
                    np.int32
                ),
                "masked_lm_ids": rng.integers(5, TINY.vocab_size, size=(B, P)).astype(np.int32),
                "masked_lm_weights": (rng.random((B, P)) < 0.8).astype(np.float32),
                "sentence_label": rng.integers(0, 2, size=(B,)).astype(np.int32),
            }
        )
    return out


def _train(mesh, batches, config=TINY, microbatches=1, objective=None):
    """One step per batch of `objective` (default: MaskedLM on `config`) on `mesh`: (state, losses)."""
    # Adam's first steps are ~lr * sign(g): gradients that are rounding noise around 0 would
    # flip sign between layouts (reductions run in another order). A large eps makes the
    # update continuous in g, so the comparison tests the sharding, not the noise.
    optimizer, schedule = optim.adamw(total_steps=10, learning_rate=1e-2, warmup_steps=1, eps=1e-3)
    partitioner = sharding.Partitioner(mesh, sharding.logical_axis_rules())
    objective = objective or MaskedLM(config, PipelineConfig(max_seq_length=L, max_predictions_per_seq=P))
    steps = step.build(
        objective=objective,
        optimizer=optimizer,
        schedule=schedule,
        partitioner=partitioner,
        microbatches=microbatches,
    )
    state, losses = steps.states(jax.random.key(0)), []
    with partitioner:
        for batch in batches:
            state, metrics = steps.train_step(state, partitioner.global_batch(batch), jax.random.key(1))
            losses.append(float(metrics["loss"]))
    return state, losses


@pytest.fixture(scope="module")
def reference():
    batches = _batches(3)
    state, losses = _train(sharding.make_mesh(None, jax.devices()[:1]), batches)
    return batches, jax.device_get(state.params), losses


MESHES = ["data:8", "data:2,fsdp:4", "data:2,fsdp:2,tensor:2", "fsdp:8", "tensor:8"]


@pytest.mark.slow(20)
@pytest.mark.parametrize("spec", MESHES)
def test_every_mesh_equals_single_device(reference, spec):
    batches, params, losses = reference
    state, mesh_losses = _train(sharding.make_mesh(spec), batches)
    np.testing.assert_allclose(mesh_losses, losses, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        jax.device_get(state.params),
        params,
    )
    # Parameters and optimizer state live where the rules put them.
    layer = state.params["encoder"]["layer_0"]
    assert layer["intermediate"]["kernel"].sharding.spec == PartitionSpec("fsdp", "tensor")
    assert layer["output"]["kernel"].sharding.spec == PartitionSpec("tensor", "fsdp")
    assert layer["attention"]["query"]["kernel"].sharding.spec == PartitionSpec("fsdp", "tensor", None)
    word = state.params["encoder"]["embeddings"]["word_embeddings"]["embedding"]
    assert word.sharding.spec == PartitionSpec("tensor", "fsdp")
    adam_mu = state.opt_state[1][0].mu["encoder"]["layer_0"]["intermediate"]["kernel"]
    assert adam_mu.sharding.spec == PartitionSpec("fsdp", "tensor")
    mesh = sharding.make_mesh(spec)
    shard_shape = layer["intermediate"]["kernel"].addressable_shards[0].data.shape
    assert shard_shape == (32 // mesh.shape["fsdp"], 64 // mesh.shape["tensor"])


@pytest.mark.slow(15)
def test_gradient_accumulation_equals_full_batch(reference):
    batches, params, losses = reference
    state, acc_losses = _train(sharding.make_mesh("data:4,fsdp:2"), batches, microbatches=4)
    np.testing.assert_allclose(acc_losses, losses, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        jax.device_get(state.params),
        params,
    )


@pytest.mark.slow(15)
@pytest.mark.parametrize("policy", ["full", "dots_saveable"])
def test_remat_changes_memory_not_results(reference, policy):
    batches, params, losses = reference
    config = dataclasses.replace(TINY, remat_policy=policy)
    state, remat_losses = _train(sharding.make_mesh("data:8"), batches, config=config)
    np.testing.assert_allclose(remat_losses, losses, rtol=1e-5)


def test_microbatches_must_divide_the_batch():
    mesh = sharding.make_mesh("data:8")
    assert sharding.check_batch_size(64, mesh, 1, microbatches=4) == 64
    with pytest.raises(sharding.MeshError, match="microbatches x data-parallel size = 4 x 8"):
        sharding.check_batch_size(48, mesh, 1, microbatches=4)


@pytest.mark.parametrize(
    "spec, expected",
    [
        (None, {"data": 8, "fsdp": 1, "tensor": 1}),
        ("data:2,fsdp:-1", {"data": 2, "fsdp": 4, "tensor": 1}),
        ("tensor:2,data:-1", {"data": 4, "fsdp": 1, "tensor": 2}),
    ],
)
def test_parse_mesh(spec, expected):
    assert sharding.parse_mesh(spec, 8) == expected


@pytest.mark.parametrize(
    "spec, message",
    [
        ("data:3", "has 3 devices but 8 are available"),
        ("data:-1,fsdp:-1", "at most one may be -1"),
        ("pipe:2", "bad --mesh entry 'pipe:2'"),
        ("data:3,fsdp:-1", "8 devices are not divisible by 3"),
    ],
)
def test_bad_mesh(spec, message):
    with pytest.raises(sharding.MeshError, match=message):
        sharding.parse_mesh(spec, 8)


def test_global_batch_is_the_local_rows_on_the_mesh():
    mesh = sharding.make_mesh("data:2,fsdp:4")
    batch = _batches(1)[0]
    arrays = sharding.global_batch(batch, mesh)
    for key, value in batch.items():
        np.testing.assert_array_equal(np.asarray(arrays[key]), value)
        assert arrays[key].sharding.spec == PartitionSpec(("data", "fsdp"))


@pytest.mark.parametrize("num_hosts", [2, 4])
def test_mocked_hosts_read_disjoint_data_covering_all(tmp_path, num_hosts):
    docs = synthetic.make_documents(40, seed=3, max_sentences=4, max_len=6)
    data_dir = synthetic.write_shards(
        str(tmp_path), docs, synthetic.make_documents(4, seed=4, first_id=150), num_shards=4
    )
    config = pipeline.PipelineConfig(max_seq_length=64, max_predictions_per_seq=4, dupe_factor=1)
    seen = []
    for host in range(num_hosts):
        files, by_document = pipeline.host_files(data_dir, "train", host, num_hosts)
        assert not by_document and len(files) == 4 // num_hosts
        vocab = shards.load_manifest(data_dir).vocab
        rows = pipeline.instance_stream(files, config, vocab, shuffle=False)
        ids = set()
        for row in rows.take(200).as_numpy_iterator():  # > one epoch of this host's documents
            tokens = row["input_ids"].copy()
            predicted = row["masked_lm_weights"] > 0
            tokens[row["masked_lm_positions"][predicted]] = row["masked_lm_ids"][predicted]
            ids |= {synthetic.doc_and_sentence(t)[0] for t in tokens[row["segment_ids"] == 0] if t >= 1000}
        seen.append(ids)
    for i in range(num_hosts):
        for j in range(i + 1, num_hosts):
            assert seen[i].isdisjoint(seen[j])
    assert set().union(*seen) == set(docs)


def test_distributed_initialises_only_on_a_pod(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda: calls.append(1))
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    assert not sharding.initialize_distributed("auto") and not calls
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5")
    assert sharding.initialize_distributed("auto") and calls == [1]
    assert not sharding.initialize_distributed("off") and calls == [1]
    with pytest.raises(sharding.MeshError, match="--distributed must be"):
        sharding.initialize_distributed("maybe")
