"""ELECTRA's objective (pretrain/objectives/electra.py, models/electra.py): masking inside the
step, labels, the shared embedding block, gradient flow, microbatch / mesh equality,
exact resume, the pipeline's in-step rows, and the FLOPs counts."""

import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from core import flops
from core.errors import ConfigError
from data import pipeline, synthetic
from data.pipeline_config import PipelineConfig
from models.electra import generator_config
from models.encoder import EncoderConfig
from pretrain import step
from pretrain.objectives import ElectraRTD
from pretrain.objectives.electra import mask_counts, mask_rows, max_predictions
from tests import mesh_training

# 8 heads and widths divisible by 8 (tensor:8 meshes); no dropout, so that every layout and
# microbatching computes the same function.
DISC = EncoderConfig(
    vocab_size=256,
    hidden_size=64,
    num_layers=2,
    num_heads=8,
    intermediate_size=128,
    max_position_embeddings=64,
    embedding_size=32,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    pooler=False,
    classifier_head="electra",
)
L = 32
DATA = PipelineConfig(max_seq_length=L, masking="in_step", sentence_objective="none", short_seq_prob=0.05)
CLS, SEP, MASK, PAD = 2, 3, 4, 0


def _objective(config=DISC, data=DATA, **kwargs):
    return ElectraRTD(config, data, generator_hidden_ratio=0.25, **kwargs)


def _rows(batch_size, seed=0, length=L):
    """Rows as the pipeline writes them: [CLS] A [SEP] B [SEP] + padding, a few [MASK]s in the text."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch_size, length), np.int32)
    mask = np.zeros_like(ids)
    segments = np.zeros_like(ids)
    for b in range(batch_size):
        n = int(rng.integers(6, length + 1))
        split = int(rng.integers(2, n - 2))
        ids[b, :n] = rng.integers(5, DISC.vocab_size, size=n)
        ids[b, [0, split, n - 1]] = [CLS, SEP, SEP]
        ids[b, int(rng.integers(1, split))] = MASK  # a literal [MASK] in the text: never chosen
        mask[b, :n] = 1
        segments[b, split + 1 : n] = 1
    maskable = mask * ~np.isin(ids, [CLS, SEP, MASK, PAD])
    return {
        "input_ids": ids,
        "input_mask": mask,
        "segment_ids": segments,
        "positions": np.broadcast_to(np.arange(length, dtype=np.int32), ids.shape).copy(),
        "maskable": maskable.astype(np.int32),
        "mask_id": np.full((batch_size,), MASK, np.int32),
    }


def _params(objective, seed=0):
    # Jitted: op by op, init compiles every operation on its own.
    return flax.linen.meta.unbox(jax.jit(objective.init)(jax.random.key(seed)))


def _keys(seed=0):
    return step.stream_keys(jax.random.key(seed), ElectraRTD.rng_streams)


def _forward(objective, params, batch, keys):
    """objective.forward in evaluation mode, jitted (op-by-op it is several times slower)."""
    return jax.device_get(
        jax.jit(lambda p, b, k: objective.forward(p, b, k, train=False))(params, batch, keys)
    )


def _with_rows(batch):
    return {**batch, "row_index": np.arange(batch["input_ids"].shape[0], dtype=np.int32)}


@pytest.mark.slow
def test_masking_statistics():
    batch = _with_rows(_rows(512))
    p = max_predictions(0.15, L)
    out = jax.device_get(mask_rows(batch, jax.random.key(3), mask_prob=0.15, num_predictions=p))
    n = batch["input_mask"].sum(1)
    count = np.maximum(1, np.minimum(p, np.round(n * np.float32(0.15)).astype(int)))
    weights = out["masked_lm_weights"].astype(bool)
    np.testing.assert_array_equal(weights.sum(1), np.minimum(count, batch["maskable"].sum(1)))
    assert p == 4 and max_predictions(0.15, 128) == 19 and max_predictions(0.15, 512) == 79
    assert max_predictions(0.25, 512) == 130
    positions = out["masked_lm_positions"]
    for b in range(len(positions)):
        chosen = positions[b][weights[b]]
        assert len(set(chosen.tolist())) == len(chosen), "positions drawn without replacement"
        assert batch["maskable"][b, chosen].all(), "never [CLS], [SEP], [MASK] or padding"
    assert (positions[~weights] == 0).all()
    # 85% [MASK], 15% unchanged, no random token; nothing else changes.
    shown = out["generator_input_ids"]
    at = np.take_along_axis(shown, positions, 1)[weights]
    original = np.take_along_axis(batch["input_ids"], positions, 1)[weights]
    is_mask = at == MASK
    assert ((at == original) | is_mask).all(), "no random-token branch"
    share, total = is_mask.mean(), is_mask.size
    assert abs(share - 0.85) < 4 * np.sqrt(0.85 * 0.15 / total), (share, total)
    np.testing.assert_array_equal(is_mask, out["mask_token"][weights])
    untouched = np.ones_like(shown, bool)
    np.put_along_axis(untouched, positions, ~weights, 1)
    np.testing.assert_array_equal(shown[untouched], batch["input_ids"][untouched])
    # Positions are uniform over the candidates: every candidate slot index gets chosen.
    assert len(np.unique(positions[weights])) == L - 1 - 1  # all but [CLS] and the last [SEP] slot


@pytest.mark.slow
def test_mask_count_never_exceeds_the_candidates():
    input_mask = jnp.ones((1, 40), jnp.int32)
    maskable = jnp.zeros((1, 40), jnp.int32).at[0, 5:7].set(1)  # 2 candidates, round(6) wanted
    assert int(mask_counts(input_mask, maskable, 0.15, 6)[0]) == 2


@pytest.mark.slow
def test_labels_are_exactly_masked_and_sample_differs():
    objective = _objective()
    params = _params(objective)
    batch = _with_rows(_rows(64, seed=1))
    out = _forward(objective, params, batch, _keys(1))
    positions, weights = out["masked_lm_positions"], out["masked_lm_weights"].astype(bool)
    original = np.take_along_axis(batch["input_ids"], positions, 1)
    expected = np.zeros_like(batch["input_ids"], bool)
    for b in range(len(positions)):
        for j in np.flatnonzero(weights[b]):
            expected[b, positions[b, j]] = out["samples"][b, j] != original[b, j]
    np.testing.assert_array_equal(out["replaced"], expected)
    # A random generator rarely draws the original: most masked tokens are replaced.
    assert 0 < expected.sum() <= weights.sum()


@pytest.mark.slow
def test_a_generator_that_always_draws_the_original_replaces_nothing():
    objective = _objective()
    params = _params(objective)
    # A huge output bias on token t makes every sample t; rows made of t alone.
    params["generator_head"]["output_bias"] = params["generator_head"]["output_bias"].at[7].set(1e4)
    batch = _with_rows(_rows(8, seed=2))
    batch["input_ids"] = np.where(batch["maskable"] > 0, 7, batch["input_ids"]).astype(np.int32)
    out = _forward(objective, params, batch, _keys(2))
    assert (out["samples"] == 7).all() and not out["replaced"].any()


@pytest.mark.slow(15)
def test_embedding_block_is_shared_and_gets_both_gradients():
    objective = _objective()
    params = _params(objective)
    flat = traverse_util.flatten_dict(params)
    tables = [k for k in flat if "embeddings" in k and k[-1] == "embedding"]
    assert all(k[0] == "encoder" for k in tables) and len(tables) == 3, tables
    assert ("generator", "embedding_projection", "kernel") in flat, "the generator's own E -> H_g"
    assert flat[("generator", "embedding_projection", "kernel")].shape == (32, 16)
    assert ("encoder", "pooler", "kernel") not in flat

    batch = _with_rows(_rows(16, seed=3))
    keys = _keys(3)
    norms = objective.normalizers(batch)

    def part(name):
        def f(p):
            _, sums = objective.loss(p, batch, keys, norms, train=True)
            return sums[name]

        return jax.jit(jax.grad(f))(params)

    gen, disc = part("mlm_loss_sum"), part("disc_loss_sum")
    for grads in (gen, disc):
        for key in ("word_embeddings", "layer_norm"):
            leaf = jax.tree.leaves(grads["encoder"]["embeddings"][key])[0]
            assert float(jnp.abs(leaf).sum()) > 0, key
    # The discrete sample stops the discriminator's gradient at the generator.
    for name in ("generator", "generator_head"):
        assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(disc[name])), name
    # And the generator's loss does not reach the discriminator's layers or head.
    for name in ("discriminator_head",):
        assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(gen[name]))
    assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(gen["encoder"]["layer_0"]))


@pytest.mark.slow
def test_loss_is_mlm_plus_fifty_times_discriminator():
    objective = _objective()
    params = _params(objective)
    batch = _with_rows(_rows(16, seed=4))
    loss, sums = jax.jit(
        lambda p: objective.loss(p, batch, _keys(4), objective.normalizers(batch), train=False)
    )(params)
    means = objective.summarize({k: float(v) for k, v in sums.items()})
    assert means["loss"] == pytest.approx(means["mlm_loss"] + 50 * means["disc_loss"], rel=1e-6)
    assert float(loss) == pytest.approx(means["loss"], rel=1e-5)
    assert sums["disc_tokens"] == batch["input_mask"].sum()
    for name in ("disc_accuracy", "disc_precision", "disc_recall", "replaced_rate", "mlm_accuracy"):
        assert 0.0 <= means[name] <= 1.0


@pytest.mark.slow
@pytest.mark.extended
def test_packed_rows_attend_within_their_example():
    objective = _objective(data=dataclasses.replace(DATA, format="doc_sentences"))
    assert "example_ids" in objective.batch_spec(2, L, 4)
    params = _params(objective)
    batch = _with_rows(_rows(2, seed=5))
    batch["input_mask"][:] = 1
    batch["example_ids"] = np.where(np.arange(L) < L // 2, 1, 2)[None].repeat(2, 0).astype(np.int32)
    changed = {**batch, "input_ids": batch["input_ids"].copy()}
    changed["input_ids"][:, L // 2 + 1 :] = 9  # only the second example's tokens
    first = _forward(objective, params, batch, _keys(5))
    second = _forward(objective, params, changed, _keys(5))
    # The same positions are masked (same keys, same candidates) and, with the generator's
    # attention packed too, the first example's samples and scores do not move.
    np.testing.assert_array_equal(first["masked_lm_positions"], second["masked_lm_positions"])
    np.testing.assert_allclose(
        first["disc_logits"][:, : L // 2], second["disc_logits"][:, : L // 2], atol=1e-5
    )
    assert not np.allclose(first["disc_logits"][:, L // 2 + 1 :], second["disc_logits"][:, L // 2 + 1 :])


def test_recipe_misconfigurations_are_one_line_errors():
    with pytest.raises(ConfigError, match="PipelineConfig.masking = 'in_step'"):
        ElectraRTD(DISC, dataclasses.replace(DATA, masking="dynamic"))
    with pytest.raises(ConfigError, match="no pooler"):
        ElectraRTD(dataclasses.replace(DISC, pooler=True), DATA)
    with pytest.raises(ConfigError, match="sentence_objective"):
        ElectraRTD(DISC, dataclasses.replace(DATA, sentence_objective="nsp"))
    with pytest.raises(ConfigError, match="masking_unit"):
        PipelineConfig(masking="in_step", masking_unit="whole_word")


def test_generator_shapes_follow_the_papers_ratios():
    base = EncoderConfig(pooler=False)
    g = generator_config(base, 1 / 3)
    assert (g.hidden_size, g.num_heads, g.intermediate_size, g.embedding_width) == (256, 4, 1024, 768)
    small = EncoderConfig(
        hidden_size=256, num_heads=4, intermediate_size=1024, embedding_size=128, pooler=False
    )
    g = generator_config(small, 0.25)
    assert (g.hidden_size, g.num_heads, g.intermediate_size, g.embedding_width) == (64, 1, 256, 128)


@pytest.mark.slow(40)
@pytest.mark.parametrize("embedding_size", [32, None], ids=["small_shaped", "base_shaped"])
@pytest.mark.extended
def test_microbatched_and_sharded_steps_equal_the_single_device_step(embedding_size):
    # Small-shaped: E < H, both towers project; the generator's single head does not split
    # over tensor:2 (replicated). Base-shaped: E = H, only the generator projects.
    config = dataclasses.replace(DISC, embedding_size=embedding_size)
    mesh_training.assert_layouts_equal_one_device(
        lambda: _objective(config), [_rows(16, seed=s) for s in range(2)]
    )


@pytest.mark.slow
@pytest.mark.extended
def test_pipeline_rows_for_in_step_masking(synthetic_shards):
    ds = pipeline.make_dataset(synthetic_shards, "train", DATA, 32)
    batch = {k: v.numpy() for k, v in next(iter(ds)).items()}
    assert set(batch) == {"input_ids", "input_mask", "segment_ids", "positions", "maskable", "mask_id"}
    special = np.isin(batch["input_ids"], [synthetic.SPECIAL[k] for k in ("cls", "sep", "mask", "pad")])
    np.testing.assert_array_equal(batch["maskable"], batch["input_mask"] * ~special)
    assert (batch["mask_id"] == synthetic.SPECIAL["mask"]).all()
    assert batch["maskable"].sum() > 0.5 * batch["input_mask"].sum()


def test_flops_are_generator_plus_discriminator():
    objective = _objective()
    d, g = DISC, objective.generator_config
    s, p = 128, 19
    generator = flops.bert_pretraining(
        hidden=g.hidden_size,
        layers=g.num_layers,
        intermediate=g.intermediate_size,
        vocab=d.vocab_size,
        seq=s,
        predictions=p,
        embedding=32,
    )
    by_hand = 3 * (
        d.num_layers * (2 * s * (4 * 64 * 64 + 2 * 64 * 128) + 4 * s * s * 64)  # layers
        + 2 * s * 32 * 64  # E -> H
        + 2 * s * (64 * 64 + 64)  # discriminator head
    )
    assert objective.flops_per_row(s, 20) == pytest.approx(generator + by_hand)


def test_paper_flops_count_matches_flops_computation_py():
    # google-research/electra flops_computation.py MODEL_FLOPS, as that script prints them.
    electra_small = flops.paper_electra_train(
        hidden=256, layers=12, generator_hidden=64, generator_layers=12, seq=128, embedding=128
    )
    assert electra_small * 128 * 1e6 == pytest.approx(1.293743798272e18, rel=1e-12)
    electra_base = flops.paper_electra_train(
        hidden=768, layers=12, generator_hidden=256, generator_layers=12, seq=512
    )
    assert electra_base * 256 * 766000 == pytest.approx(6.424541834277683e19, rel=1e-12)
    bert_small = flops.paper_train(hidden=256, layers=12, seq=128, embedding=128)
    assert bert_small * 128 * 1.45e6 == pytest.approx(1.4187399146496e18, rel=1e-12)
    assert flops.paper_train(hidden=768, layers=12, seq=512) * 256 * 1e6 == pytest.approx(
        6.428335104e19, rel=1e-12
    )
