"""Optimizers: which parameters get weight decay, the warmup/linear-decay schedule,
ALBERT's LAMB (trust ratio, masked like the weight decay), and ELECTRA's warmup form and
layer-wise learning-rate decay (against google-research/electra's formulas)."""

import dataclasses
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from core import optim, sharding
from core.errors import ConfigError
from models.encoder import EncoderConfig
from models.pretraining import abstract_params

TINY = EncoderConfig(
    vocab_size=100,
    hidden_size=16,
    num_layers=2,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
)


def test_decay_mask_excludes_every_bias_and_layernorm():
    params = nn.meta.unbox(abstract_params(TINY))
    flat = traverse_util.flatten_dict(optim.decay_mask(params), sep="/")
    no_decay = sorted(path for path, decays in flat.items() if not decays)
    decayed = sorted(path for path, decays in flat.items() if decays)
    # The original excludes any variable whose name contains LayerNorm or bias.
    assert "mlm_head/output_bias" in no_decay
    assert all(p.endswith(("bias", "scale")) for p in no_decay)
    assert all(p.endswith(("kernel", "embedding")) for p in decayed), decayed
    assert "encoder/embeddings/layer_norm/scale" in no_decay
    assert "mlm_head/transform_layer_norm/scale" in no_decay
    assert "encoder/embeddings/word_embeddings/embedding" in decayed
    assert "mlm_head/transform/kernel" in decayed


def test_warmup_then_linear_decay_over_the_whole_run():
    schedule = optim.warmup_linear_decay(1e-4, warmup_steps=10, total_steps=100)
    values = np.array([float(schedule(s)) for s in (0, 5, 10, 55, 100, 120)])
    # Warmup is linear to the peak; after it lr = peak * (1 - step / total), as in BERT.
    np.testing.assert_allclose(values, [0.0, 5e-5, 9e-5, 4.5e-5, 0.0, 0.0], rtol=1e-6, atol=1e-12)


@pytest.mark.slow
def test_grid_adamw_takes_its_schedule_from_the_state():
    """Fine-tuning's AdamW: one compiled update serves every grid point, and each point's
    updates are optax.adamw's with BERT's schedule for that point."""
    make = optim.grid_adamw(b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, clip_norm=1.0)
    placeholder = make(learning_rate=0.0, warmup_steps=0, total_steps=1)
    update = jax.jit(placeholder.update)
    params = {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones(2)}}
    rs = np.random.RandomState(0)
    compiled = []
    for peak, warmup, total in [(3e-5, 3, 10), (1e-3, 1, 4)]:
        state = optim.set_hyperparams(
            placeholder.init(params), learning_rate=peak, warmup_steps=warmup, total_steps=total
        )
        reference = optim.adamw_chain(
            optim.warmup_linear_decay(peak, warmup, total),
            b1=0.9,
            b2=0.999,
            eps=1e-6,
            weight_decay=0.01,
            clip_norm=1.0,
        )
        expected_state, current = reference.init(params), params
        for _ in range(total + 1):
            grads = jax.tree.map(lambda p: jnp.asarray(rs.normal(size=p.shape), jnp.float32), params)
            updates, state = update(grads, state, current)
            expected, expected_state = reference.update(grads, expected_state, current)
            jax.tree.map(
                lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12), updates, expected
            )
            current = optax.apply_updates(current, updates)
        compiled.append(update._cache_size())
    assert compiled[1] == compiled[0]  # the second grid point reuses the first one's executables


# --- LAMB (ALBERT) ------------------------------------------------------------------------


def _lamb_setup(seed=0):
    rs = np.random.RandomState(seed)
    params = {
        "dense": {"kernel": jnp.asarray(rs.normal(size=(4, 3)), jnp.float32), "bias": jnp.full((3,), 0.5)},
        "layer_norm": {"scale": jnp.full((3,), 3.0), "bias": jnp.zeros((3,))},
        "word_embeddings": {"embedding": jnp.asarray(rs.normal(size=(5, 3)), jnp.float32)},
    }
    grads = [
        jax.tree.map(lambda p: jnp.asarray(rs.normal(size=p.shape), jnp.float32), params) for _ in range(3)
    ]
    return params, grads


def _updates(optimizer, params, grads):
    state, out = optimizer.init(params), []
    for g in grads:
        update, state = optimizer.update(g, state, params)
        params = optax.apply_updates(params, update)
        out.append(update)
    return out


@pytest.mark.slow
def test_lamb_is_optax_lamb_on_decayed_parameters():
    params, grads = _lamb_setup()
    decayed = {"dense": {"kernel": params["dense"]["kernel"]}, "word_embeddings": params["word_embeddings"]}
    only = [
        {"dense": {"kernel": g["dense"]["kernel"]}, "word_embeddings": g["word_embeddings"]} for g in grads
    ]
    ours, schedule = optim.lamb(total_steps=10, learning_rate=1e-2, warmup_steps=2, clip_norm=None)
    reference = optax.lamb(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01)
    for a, b in zip(_updates(ours, decayed, only), _updates(reference, decayed, only)):
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), a, b)


@pytest.mark.slow
def test_lamb_trust_ratio_and_no_decay_mask():
    """Kernels: ||update|| = lr * ||w|| (LAMB's trust ratio). Biases and LayerNorm: a plain
    Adam step, no decay and no trust ratio, as ALBERT's exclude_from_layer_adaptation."""
    params, grads = _lamb_setup()
    lr = 1e-2
    optimizer, _ = optim.lamb(total_steps=100, learning_rate=lr, warmup_steps=0, clip_norm=None)
    first = _updates(optimizer, params, grads[:1])[0]
    schedule_lr = lr * (1 - 0 / 100)
    for path in (("dense", "kernel"), ("word_embeddings", "embedding")):
        w, u = params[path[0]][path[1]], first[path[0]][path[1]]
        np.testing.assert_allclose(np.linalg.norm(u), schedule_lr * np.linalg.norm(w), rtol=1e-5)
    # First Adam step with bias correction: g / (|g| + eps).
    for path in (("dense", "bias"), ("layer_norm", "scale"), ("layer_norm", "bias")):
        g = np.asarray(grads[0][path[0]][path[1]])
        np.testing.assert_allclose(first[path[0]][path[1]], -lr * g / (np.abs(g) + 1e-6), rtol=1e-5)
    # optax.lamb alone would rescale the LayerNorm scale (||w|| = 3 * sqrt(3)): the mask matters.
    plain = optax.lamb(lr, eps=1e-6, weight_decay=0.01, mask=optim.decay_mask)
    rescaled = _updates(plain, params, grads[:1])[0]["layer_norm"]["scale"]
    assert not np.allclose(rescaled, first["layer_norm"]["scale"])


@pytest.mark.slow
def test_lamb_clips_the_global_norm_first():
    """With clip_norm 1, gradients of global norm n > 1 act as gradients / n."""
    params, grads = _lamb_setup()
    norm = float(optax.global_norm(grads[0]))
    assert norm > 1
    # A large eps keeps Adam from normalising the gradient's scale away.
    kwargs = dict(total_steps=10, learning_rate=1e-2, warmup_steps=0, eps=1.0)
    clipped = _updates(optim.lamb(clip_norm=1.0, **kwargs)[0], params, grads[:1])[0]
    scaled = jax.tree.map(lambda g: g / norm, grads[0])
    expected = _updates(optim.lamb(clip_norm=None, **kwargs)[0], params, [scaled])[0]
    unclipped = _updates(optim.lamb(clip_norm=None, **kwargs)[0], params, grads[:1])[0]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), clipped, expected)
    assert not np.allclose(clipped["layer_norm"]["bias"], unclipped["layer_norm"]["bias"])


def _fairseq_polynomial_decay(num_updates: int, lr: float, warmup: int, total: int) -> float:
    """fairseq/optim/lr_scheduler/polynomial_decay_schedule.py `step_update`, power 1, end 0."""
    if warmup > 0 and num_updates <= warmup:
        return num_updates / float(warmup) * lr
    if num_updates >= total:
        return 0.0
    pct_remaining = 1 - (num_updates - warmup) / (total - warmup)
    return lr * pct_remaining


def test_fairseq_schedule_decays_from_the_peak_at_the_end_of_warmup():
    schedule = optim.warmup_linear_decay(6e-4, 24, 500, "fairseq")
    bert = optim.warmup_linear_decay(6e-4, 24, 500)
    for step in range(0, 510):
        expected = _fairseq_polynomial_decay(step, 6e-4, 24, 500)
        np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-5, atol=1e-12, err_msg=str(step))
    # BERT's form is below it through the whole decay: 24/500 = 4.8% at the end of warmup.
    np.testing.assert_allclose(float(bert(24)), 6e-4 * (1 - 24 / 500), rtol=1e-6)
    # Injected (fine-tuning grids): the same values from traced arguments.
    make = optim.grid_adamw(b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.1, clip_norm=None, schedule="fairseq")
    state = make(6e-4, 24, 500).init({"w": jnp.zeros(2)})
    assert float(state.hyperparams["learning_rate"]) == np.float32(6e-4)


def test_roberta_recipes_bind_fairseqs_schedule_and_decay(tmp_path):
    """configs/recipes/roberta.gin and configs/glue/roberta.gin choose fairseq's schedule form
    and weight decay on every parameter; BERT's keep theirs."""
    import gin

    from finetune.sweep import Grid

    for files, expected in (
        (["configs/models/roberta_base.gin", "configs/recipes/roberta.gin"], ("fairseq", True)),
        (["configs/models/bert_base.gin", "configs/recipes/bert.gin"], ("bert", False)),
    ):
        gin.clear_config()
        gin.parse_config_files_and_bindings(files, [], skip_unknown=True)
        assert gin.get_bindings("adamw").get("decay_all_parameters", False) == expected[1]
        _, schedule = optim.adamw(total_steps=500_000)
        peak = gin.query_parameter("adamw.learning_rate")
        warmup = gin.query_parameter("adamw.warmup_steps")
        at_warmup_end = float(schedule(warmup))
        if expected[0] == "fairseq":
            np.testing.assert_allclose(at_warmup_end, peak, rtol=1e-6)
        else:
            np.testing.assert_allclose(at_warmup_end, peak * (1 - warmup / 500_000), rtol=1e-6)
    gin.clear_config()
    gin.parse_config_files_and_bindings(["configs/glue/roberta.gin"], [], skip_unknown=True)
    grid = Grid()
    assert (grid.optimizer.schedule, grid.optimizer.decay_all_parameters) == ("fairseq", True)
    gin.clear_config()


def test_decay_all_parameters_decays_layernorm_and_biases():
    params = {"layer_norm": {"scale": jnp.ones(3), "bias": jnp.ones(3)}, "dense": {"kernel": jnp.ones(3)}}
    zeros = jax.tree.map(jnp.zeros_like, params)
    for decay_all, decayed in ((False, {"kernel"}), (True, {"kernel", "scale", "bias"})):
        optimizer = optim.adamw_chain(
            0.1, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.5, clip_norm=None, decay_all_parameters=decay_all
        )
        updates, _ = optimizer.update(zeros, optimizer.init(params), params)
        moved = {path[-1] for path, u in traverse_util.flatten_dict(updates).items() if np.any(np.asarray(u))}
        assert moved == decayed


# --- ELECTRA: warmup form and layer-wise learning-rate decay -------------------------------


def _electra_lr(step: int, peak: float, warmup: float, total: int) -> float:
    """google-research/electra model/optimization.py `create_optimizer`: polynomial_decay
    (power 1, end 0) times min(1, step / warmup_steps)."""
    decayed = peak * (1 - min(step, total) / total)
    return decayed * min(1.0, step / warmup)


@pytest.mark.slow
def test_electra_schedule_multiplies_the_decay_by_the_warmup_ramp():
    schedule = optim.warmup_linear_decay(1e-4, 10, 100, "electra")
    steps = np.arange(110)
    expected = [_electra_lr(step, 1e-4, 10, 100) for step in steps]
    np.testing.assert_allclose(np.asarray(schedule(steps)), expected, rtol=1e-5, atol=1e-12)
    # Warmup ends at peak * (1 - W / T), where BERT's form reaches the peak; then they agree.
    bert = optim.warmup_linear_decay(1e-4, 10, 100)
    np.testing.assert_allclose(float(schedule(9)), 1e-4 * 0.9 * 0.91, rtol=1e-6)
    np.testing.assert_allclose(float(bert(9)), 1e-4 * 0.9, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(40)), float(bert(40)), rtol=1e-6)
    assert float(optim.warmup_linear_decay(1e-4, 0, 100, "electra")(0)) == np.float32(1e-4)


ELECTRA_TINY = EncoderConfig(
    vocab_size=100,
    hidden_size=16,
    num_layers=11,  # layer_1 and layer_10: the original's keys end in "/" so as not to mix them
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
    embedding_size=8,  # != hidden_size: an embedding_projection, at depth 0
    pooler=False,
    classifier_head="electra",
)


def _electra_finetuning_params(config=ELECTRA_TINY) -> dict:
    """The fine-tuning tree of ClassifierModel (3 classes), abstract and unboxed."""
    from models.classifier import ClassifierModel

    inputs = {k: jnp.zeros((1, 8), jnp.int32) for k in ("input_ids", "input_mask", "segment_ids")}
    model = ClassifierModel(config, 3)
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), inputs, deterministic=True)["params"])
    return nn.meta.unbox(boxed)


def _original_layer_lrs(learning_rate: float, layer_decay: float, n_layers: int) -> dict[str, float]:
    """google-research/electra model/optimization.py `_get_layer_lrs`, verbatim."""
    key_to_depths = {"/embeddings/": 0, "/embeddings_project/": 0, "task_specific/": n_layers + 2}
    for layer in range(n_layers):
        key_to_depths["encoder/layer_" + str(layer) + "/"] = layer + 1
    return {
        key: learning_rate * (layer_decay ** (n_layers + 2 - depth)) for key, depth in key_to_depths.items()
    }


def _original_name(path: tuple[str, ...]) -> str:
    """Our fine-tuning path -> the variable name in ELECTRA's graph (run_finetuning.py)."""
    if path[0] != "encoder":
        return "task_specific/rte/dense/" + "/".join(path[1:])
    if path[1] == "embedding_projection":
        return "electra/embeddings_project/" + "/".join(path[2:])
    if path[1] == "embeddings":
        return "electra/embeddings/" + "/".join(path[2:])
    return "electra/encoder/" + "/".join(path[1:])


def test_layerwise_factors_are_electras_get_layer_lrs():
    params = _electra_finetuning_params()
    n, decay = ELECTRA_TINY.num_layers, 0.8
    factors = traverse_util.flatten_dict(optim.layerwise_lr_factors(params, decay, n))
    original = _original_layer_lrs(1.0, decay, n)
    assert set(factors) == set(traverse_util.flatten_dict(params))
    for path, factor in factors.items():
        # AdamWeightDecayOptimizer.apply_gradients: the learning rate of every key in the name.
        matched = [lr for key, lr in original.items() if key in _original_name(path)]
        assert matched == [factor], path
    flat = {"/".join(p): f for p, f in factors.items()}
    assert flat["encoder/embeddings/word_embeddings/embedding"] == decay**13  # deepest
    assert flat["encoder/embedding_projection/kernel"] == decay**13
    assert flat["encoder/layer_0/attention/query/kernel"] == decay**12
    assert flat["encoder/layer_10/output/bias"] == decay**2  # the top layer: decay^2, not decay
    assert flat["classifier/kernel"] == flat["classifier/bias"] == 1.0
    assert not any(name.startswith("encoder/pooler") for name in flat)


@pytest.mark.slow
def test_layerwise_decay_scales_the_whole_adamw_update():
    """One step with decay 0.8 = the step without it times each parameter's factor, the
    decoupled weight decay included (ELECTRA: lr_layer * (adam + wd * param)); clipping
    sees the raw gradients."""
    rs = np.random.RandomState(0)
    shapes = _electra_finetuning_params(dataclasses.replace(ELECTRA_TINY, num_layers=2))
    # NumPy outside the one jitted function: every eager jnp op would be compiled on its own.
    params = jax.tree.map(lambda s: rs.normal(size=s.shape).astype(np.float32), shapes)
    grads = jax.tree.map(lambda p: rs.normal(size=p.shape).astype(np.float32), params)
    assert np.sqrt(sum(np.sum(g**2) for g in jax.tree.leaves(grads))) > 1.0  # clipping is active
    kwargs = dict(
        b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.1, clip_norm=1.0, schedule="electra", num_layers=2
    )
    schedule = dict(learning_rate=1e-3, warmup_steps=0, total_steps=10)
    plain = optim.grid_adamw(**kwargs)(**schedule)
    decayed = optim.grid_adamw(**kwargs, layerwise_lr_decay=0.8)(**schedule)
    factors = traverse_util.flatten_dict(optim.layerwise_lr_factors(params, 0.8, 2))

    @jax.jit
    def first_steps(g, params):
        expected, _ = plain.update(g, plain.init(params), params)
        got, state = decayed.update(g, decayed.init(params), params)
        return expected, got, state.hyperparams["learning_rate"]

    for g in (grads, jax.tree.map(np.zeros_like, grads)):
        expected, got, learning_rate = jax.device_get(first_steps(g, params))
        expected, got = traverse_util.flatten_dict(expected), traverse_util.flatten_dict(got)
        for path, factor in factors.items():
            np.testing.assert_allclose(got[path], expected[path] * factor, rtol=1e-6, err_msg=str(path))
    # With zero gradients only the weight decay moves a kernel: -lr * wd * param * factor.
    kernel = ("encoder", "layer_0", "intermediate", "kernel")
    param = traverse_util.flatten_dict(params)[kernel]
    np.testing.assert_allclose(got[kernel], -1e-3 * 0.1 * param * 0.8**3, rtol=1e-5)
    assert learning_rate == np.float32(1e-3)  # the state's lr is the head's, unscaled


def test_layerwise_decay_refuses_shared_layers_and_bad_values():
    from finetune.sweep import Grid
    from finetune.tasks import TASKS
    from finetune.trainer import OptimizerConfig, TaskSteps

    albert = dataclasses.replace(
        ELECTRA_TINY, num_layers=2, sharing="all", classifier_head="pooler", pooler=True
    )
    partitioner = sharding.Partitioner.create(None)
    with pytest.raises(ConfigError, match="encoder/shared_layer/.* shared by every layer"):
        TaskSteps(albert, TASKS["rte"], OptimizerConfig(layerwise_lr_decay=0.8), 8, partitioner)
    TaskSteps(albert, TASKS["rte"], OptimizerConfig(layerwise_lr_decay=1.0), 8, partitioner)  # 1.0 = off
    for bad in (0.0, 1.5, -0.8):
        with pytest.raises(ConfigError, match="layerwise_lr_decay must be in"):
            optim.grid_adamw(
                b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0, clip_norm=None, layerwise_lr_decay=bad
            )
        with pytest.raises(ConfigError, match="layerwise_lr_decay must be in"):
            Grid(layerwise_lr_decay=bad)  # before any data is read
    # BERT's pooler reads the top layer and feeds the head: the depth between them.
    bert = {"encoder": {"pooler": {"kernel": 0}, "layer_1": {"kernel": 0}}, "classifier": {"kernel": 0}}
    factors = optim.layerwise_lr_factors(bert, 0.5, 2)
    assert (factors["encoder"]["layer_1"]["kernel"], factors["encoder"]["pooler"]["kernel"]) == (0.25, 0.5)


def test_a_run_shorter_than_its_warmup_warns_in_one_line(caplog):
    """BERT's recipe (10,000 warm-up steps) with run.steps = 40 trains at 0.4% of the peak
    throughout: one warning names both numbers and the binding to change."""
    with caplog.at_level(logging.WARNING, logger="core.optim"):
        optim.adamw(total_steps=40)
        optim.lamb(total_steps=100_000)  # ALBERT's 3,125 warm-up steps: nothing to say
    assert [r.getMessage() for r in caplog.records] == [
        "run.steps = 40 ends inside adamw.warmup_steps = 10000: the learning rate never gets past 4e-07 "
        "(0.4% of adamw.learning_rate = 0.0001); bind adamw.warmup_steps below 40 (a tenth of the run: 4)"
    ]
