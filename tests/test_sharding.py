"""Scale-out on 8 fake CPU devices: every mesh gives the single-device result, parameters are
sharded as the rules say, gradient accumulation and remat change nothing, hosts split the data."""

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from core import sharding
from data import pipeline, shards, synthetic
from data.pipeline_config import PipelineConfig
from pretrain.objectives import MaskedLM
from tests import mesh_training

TINY, B, L, P = mesh_training.SHARDABLE, mesh_training.B, mesh_training.L, mesh_training.P


def _train(mesh, batches, config=TINY, microbatches=1):
    """MaskedLM on `config`, one step per batch on `mesh`: (state, losses)."""
    objective = MaskedLM(config, PipelineConfig(max_seq_length=L, max_predictions_per_seq=P))
    return mesh_training.train(mesh, batches, objective, microbatches)


@pytest.fixture(scope="module")
def reference():
    batches = mesh_training.mlm_batches(3)
    state, losses = _train(sharding.make_mesh(None, jax.devices()[:1]), batches)
    return batches, jax.device_get(state.params), losses


MESHES = ["data:8", "data:2,fsdp:4", "data:2,fsdp:2,tensor:2", "fsdp:8", "tensor:8"]


@pytest.mark.slow(20)
@pytest.mark.parametrize("spec", MESHES)
@pytest.mark.extended(keep=["data:2,fsdp:2,tensor:2"])
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
@pytest.mark.extended  # make test proves it on a data x fsdp x tensor mesh: tests/test_carry.py
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
@pytest.mark.extended
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
    batch = mesh_training.mlm_batches(1)[0]
    arrays = sharding.global_batch(batch, mesh)
    for key, value in batch.items():
        np.testing.assert_array_equal(np.asarray(arrays[key]), value)
        assert arrays[key].sharding.spec == PartitionSpec(("data", "fsdp"))


@pytest.mark.slow
@pytest.mark.parametrize("num_hosts", [2, 4])
@pytest.mark.extended
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
