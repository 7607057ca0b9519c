"""The benchmarks run and print their JSON line (functional only: timings are not tested),
and the speed work changes no result: masked-position decoding, vocab padding and packing
leave the loss (and each example's MLM loss) unchanged."""

import dataclasses
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

from bench import input_pipeline, report, suite, suite_members
from bench.pretrain import OPTIMISATIONS
from core import optim
from data.pipeline_config import PipelineConfig
from models.encoder import EncoderConfig
from models.pretraining import resize_vocab_rows
from pretrain.objectives import MaskedLM
from pretrain.objectives.masked_lm import mlm_loss_and_metrics
from tests import cli_run, jitted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _json_line(*args, without_tensorflow=False):
    # One CPU device, as users run the benchmarks; conftest's fast compilation kept.
    env = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    # tests/no_tensorflow.py: as on an accelerator host with only JAX installed.
    python = [sys.executable, "-m"] + (["tests.no_tensorflow"] if without_tensorflow else [])
    result = subprocess.run([*python, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow(30)
@pytest.mark.extended
def test_pretrain_benchmark_runs_electra(tmp_path):
    """The gin files choose the objective: ELECTRA's step masks inside the step."""
    result = _json_line(
        "bench.pretrain",
        "--gin_file=configs/models/electra_small.gin",
        "--gin_file=configs/recipes/electra.gin",
        "--gin_bindings=EncoderConfig.num_layers=1",
        "--gin_bindings=EncoderConfig.vocab_size=2048",
        "--batch_size=4",
        "--seq_len=32",
        "--steps=1",
    )
    assert result["objective"] == "ElectraRTD" and result["tokens_per_second"] > 0
    assert result["config"]["pooler"] is False


@pytest.mark.slow
@pytest.mark.extended
def test_pretrain_benchmark_prints_its_result(tmp_path):
    """With TensorFlow's import blocked: the model, objective, step, state and optimizer, and
    so the benchmark, need only JAX (TensorFlow is the input pipeline's). A recipe's run.*
    settings, the trainer's, are left unread."""
    result = _json_line(
        "bench.pretrain",
        "--gin_file=configs/models/bert_tiny.gin",
        "--gin_file=configs/recipes/bert.gin",
        "--gin_bindings=EncoderConfig.vocab_size=2048",
        "--batch_size=4",
        "--seq_len=32",
        "--steps=2",
        f"--profile_dir={tmp_path}",
        without_tensorflow=True,
    )
    assert result["name"] == "ours" and result["batch"] == 4 and result["seq"] == 32
    assert result["predictions"] == 5  # 20 per 128 tokens
    assert result["tokens_per_second"] > 0 and result["compile_seconds"] > 0
    # 4 rows of 32 real tokens per step.
    assert (
        abs(result["tokens_per_second"] - 128 * result["steps_per_second"])
        < 1e-3 * result["tokens_per_second"]
    )
    assert 0 < result["mfu"] < 1 and result["peak_memory_bytes"] > 0
    assert result["config"]["vocab_size"] == 2048
    # --profile_dir: a jax.profiler trace on disk, summarised by XLA operation, largest first.
    assert list(tmp_path.glob("**/*.trace.json.gz"))
    profile = result["profile"]
    assert profile and all(row["ms_per_step"] > 0 for row in profile)
    assert [row["share"] for row in profile] == sorted((row["share"] for row in profile), reverse=True)
    assert 0 < sum(row["share"] for row in profile) <= 1.0001
    # The step is mostly matmuls and fusions, not host-side runtime events.
    assert any("fusion" in row["op"] or "dot" in row["op"] for row in profile[:3])
    assert result["profile_seconds"] > 0  # kept out of the suite's overhead column


def test_compiling_only_needs_a_cache_to_fill(capsys):
    """`bench.pretrain --compile_only` compiles into the persistent cache and runs nothing:
    without a cache it would do nothing useful, so it says so in one line."""
    import jax

    from bench import pretrain

    directory = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        result = cli_run.run(
            pretrain.main, ["--gin_file=configs/models/bert_tiny.gin", "--compile_only"], capsys
        )
    finally:
        jax.config.update("jax_compilation_cache_dir", directory)
    assert result.returncode == 2 and result.errors() == [
        "error: --compile_only: no compilation cache to fill: set JAX_COMPILATION_CACHE_DIR "
        "(bench.suite --compile_workers does)"
    ]


@pytest.mark.slow(20)
@pytest.mark.extended
def test_pretrain_benchmark_turns_each_optimisation_off():
    result = _json_line(
        "bench.pretrain",
        "--gin_file=configs/models/bert_tiny.gin",
        "--gin_bindings=EncoderConfig.vocab_size=2000",
        "--batch_size=4",
        "--seq_len=32",
        "--steps=2",
        f"--without={','.join(OPTIMISATIONS)}",
        "--fused_attention",
        "--dropout_prng=rbg",
        "--scan_layers",
        "--dtype=bfloat16",
        "--paired",
    )
    assert result["without"] == sorted(OPTIMISATIONS)
    assert result["config"]["matmul_accumulation"] == "compute" and result["dropout_prng"] == "rbg"
    assert result["config"]["dropout_bits"] == 32
    assert result["config"]["scan_layers"] and result["default_compile_seconds"] > 0
    # --paired: the default step was timed too, alternating with the variant.
    assert result["default_seconds_per_step"] > 0
    assert (
        abs(result["variant_over_default"] - result["seconds_per_step"] / result["default_seconds_per_step"])
        < 0.01
    )
    assert result["config"]["vocab_pad_multiple"] == 1 and result["config"]["attention_dropout_rate"] == 0.0
    assert result["predictions"] == 5 and result["tokens_per_second"] > 0


# A 2-layer encoder small enough to compare outputs exactly.
TINY = EncoderConfig(
    vocab_size=300,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    max_position_embeddings=32,
)


def _objective(config, sentence_objective="nsp"):
    return MaskedLM(config, PipelineConfig(max_seq_length=24, sentence_objective=sentence_objective))


def _tiny_model_and_batch(vocab_pad_multiple=1):
    config = dataclasses.replace(TINY, vocab_pad_multiple=vocab_pad_multiple)
    batch = report.synthetic_batch(4, 24, 4, config.vocab_size, seed=3)
    batch["masked_lm_weights"][1, -1] = 0.0  # a padding prediction slot
    return _objective(config), batch


@pytest.mark.slow(20)
@pytest.mark.extended
def test_masked_only_decoding_equals_full_decoding_restricted_to_the_masked_positions():
    objective, batch = _tiny_model_and_batch()
    model = objective.module
    full = report.all_positions_batch(batch)
    assert full["masked_lm_positions"].shape == (4, 24) and full["masked_lm_weights"].sum() == 15
    params = nn.meta.unbox(jitted.init(model, jax.random.key(0), batch, deterministic=True))
    rng = {"dropout": jax.random.key(1)}
    masked_out = jitted.apply(model, params, batch, deterministic=False, rngs=rng)
    full_out = jitted.apply(model, params, full, deterministic=False, rngs=rng)
    assert full_out["mlm_logits"].shape == (4, 24, 300)

    @jax.jit
    def loss_and_sums(batch):
        return objective.loss(params["params"], batch, rng, objective.normalizers(batch), train=True)

    loss, sums = loss_and_sums(batch)
    full_loss, full_sums = loss_and_sums(full)
    np.testing.assert_allclose(float(full_loss), float(loss), rtol=1e-6)
    for key in sums:
        np.testing.assert_allclose(float(full_sums[key]), float(sums[key]), rtol=1e-6, err_msg=key)
    rows = np.arange(4)[:, None]
    np.testing.assert_allclose(
        np.asarray(full_out["mlm_logits"])[rows, batch["masked_lm_positions"]],
        np.asarray(masked_out["mlm_logits"]),
        atol=1e-5,
    )


@pytest.mark.slow(25)
@pytest.mark.extended
def test_vocab_padding_changes_shapes_not_outputs_or_gradients():
    """vocab_pad_multiple=128: 384 table rows for 300 entries; with the unpadded model's
    parameters (padding rows zero) logits and loss are identical and the gradient of the
    padding rows is exactly zero, so they never influence training."""
    objective, batch = _tiny_model_and_batch()
    padded_objective, _ = _tiny_model_and_batch(vocab_pad_multiple=128)
    model, padded_model = objective.module, padded_objective.module
    params = nn.meta.unbox(jitted.init(model, jax.random.key(0), batch, deterministic=True))["params"]
    padded = resize_vocab_rows(jax.device_get(params), 384)
    shapes = jax.eval_shape(lambda: jitted.init(padded_model, jax.random.key(0), batch, deterministic=True))
    assert nn.meta.unbox(shapes)["params"]["mlm_head"]["output_bias"].shape == (384,)
    assert padded["encoder"]["embeddings"]["word_embeddings"]["embedding"].shape == (384, 32)

    def loss(objective, params):
        return objective.loss(params, batch, {}, objective.normalizers(batch), train=False)[0]

    np.testing.assert_allclose(
        np.asarray(jitted.apply(padded_model, {"params": padded}, batch, deterministic=True)["mlm_logits"]),
        np.asarray(jitted.apply(model, {"params": params}, batch, deterministic=True)["mlm_logits"]),
        atol=1e-6,
    )
    grads = jax.jit(jax.grad(lambda p: loss(padded_objective, p)))(padded)
    assert not np.any(np.asarray(grads["encoder"]["embeddings"]["word_embeddings"]["embedding"])[300:])
    assert not np.any(np.asarray(grads["mlm_head"]["output_bias"])[300:])
    assert np.any(np.asarray(grads["mlm_head"]["output_bias"])[:300])
    np.testing.assert_allclose(
        float(jax.jit(lambda p: loss(padded_objective, p))(padded)),
        float(jax.jit(lambda p: loss(objective, p))(params)),
        rtol=1e-6,
    )


@pytest.mark.slow
@pytest.mark.extended
def test_padding_rows_start_at_zero_and_lamb_trains_as_without_them():
    """The padded word table initialises its real rows as the unpadded one and its padding
    rows to zero, so LAMB's per-tensor trust ratio (||w|| / ||update||) is that of the
    unpadded model: two LAMB steps give the same real rows either way."""
    objective, batch = _tiny_model_and_batch()
    padded_objective, _ = _tiny_model_and_batch(vocab_pad_multiple=128)
    states = []
    for obj in (objective, padded_objective):
        params = nn.meta.unbox(jitted.init(obj.module, jax.random.key(0), batch, deterministic=True))[
            "params"
        ]
        optimizer, _ = optim.lamb(total_steps=10, learning_rate=1e-2, warmup_steps=0)

        @jax.jit
        def step(params, opt_state, obj=obj, optimizer=optimizer):
            loss = lambda p: obj.loss(p, batch, {}, obj.normalizers(batch), train=False)[0]  # noqa: E731
            updates, opt_state = optimizer.update(jax.grad(loss)(params), opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        opt_state = optimizer.init(params)
        table = params["encoder"]["embeddings"]["word_embeddings"]["embedding"]
        states.append(np.asarray(table))
        for _ in range(2):
            params, opt_state = step(params, opt_state)
        states.append(params)
    unpadded_init, unpadded, padded_init, padded = states
    np.testing.assert_array_equal(padded_init[:300], unpadded_init)
    assert padded_init.shape == (384, 32) and not np.any(padded_init[300:])
    np.testing.assert_allclose(
        resize_vocab_rows(jax.device_get(padded), 300)["encoder"]["embeddings"]["word_embeddings"][
            "embedding"
        ],
        unpadded["encoder"]["embeddings"]["word_embeddings"]["embedding"],
        rtol=1e-5,
        atol=1e-7,
    )
    assert not np.any(np.asarray(padded["encoder"]["embeddings"]["word_embeddings"]["embedding"])[300:])


def _input_pipeline(capsys, *args):
    """bench.input_pipeline in this process (it needs no particular device count)."""
    run = cli_run.run(input_pipeline.main, args, capsys)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.extended
def test_input_pipeline_benchmark_prints_its_result(capsys):
    result = _input_pipeline(capsys, "--batch_size=8", "--seq_len=32", "--steps=5")
    assert result["examples_per_second"] > 0 and result["tokens_per_second"] > result["examples_per_second"]
    assert 0 < result["fill"] <= 1 and "examples_per_row" not in result


@pytest.mark.slow
@pytest.mark.extended
def test_input_pipeline_benchmark_measures_packing(capsys):
    """DOC-SENTENCES at length 64 over documents of short sentences: document ends leave
    short examples, which packing puts together, so rows are fuller than one per row."""
    result = _input_pipeline(capsys, "--batch_size=8", "--seq_len=64", "--steps=5", "--format=doc_sentences")
    assert result["format"] == "doc_sentences"
    assert result["examples_per_row"] > 1
    assert 0 < result["unpacked_fill"] < result["fill"] <= 1
    assert abs(result["unpacked_fill"] * result["examples_per_row"] - result["fill"]) < 1e-3


@pytest.mark.slow(15)
@pytest.mark.extended
def test_packed_rows_give_each_example_its_unpacked_mlm_loss():
    """Two examples packed into one row (example_ids, restarting positions) have the same
    masked-position logits and per-example MLM loss as each example alone in its row."""
    model = _objective(TINY, sentence_objective="none").module
    rng = np.random.default_rng(0)
    lengths, length = (11, 9), 24
    examples = [rng.integers(5, 300, n).astype(np.int32) for n in lengths]
    masked = [np.array([1, 4, 7]), np.array([2, 5, 8])]  # positions within each example

    def one(tokens, where):
        b = {k: np.zeros((1, length), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
        b["input_ids"][0, : len(tokens)], b["input_mask"][0, : len(tokens)] = tokens, 1
        b["masked_lm_positions"] = where[None].astype(np.int32)
        b["masked_lm_ids"] = tokens[where][None]
        b["masked_lm_weights"] = np.ones((1, len(where)), np.float32)
        return b

    packed = {
        k: np.zeros((1, length), np.int32)
        for k in ("input_ids", "input_mask", "segment_ids", "positions", "example_ids")
    }
    offset = 0
    for k, tokens in enumerate(examples):
        span = slice(offset, offset + len(tokens))
        packed["input_ids"][0, span], packed["input_mask"][0, span] = tokens, 1
        packed["positions"][0, span], packed["example_ids"][0, span] = np.arange(len(tokens)), k + 1
        offset += len(tokens)
    where = np.concatenate([masked[0], masked[1] + lengths[0]])
    packed["masked_lm_positions"] = where[None].astype(np.int32)
    packed["masked_lm_ids"] = packed["input_ids"][:, where]
    packed["masked_lm_weights"] = np.ones((1, len(where)), np.float32)

    params = nn.meta.unbox(jitted.init(model, jax.random.key(0), packed, deterministic=True))
    packed_logits = np.asarray(jitted.apply(model, params, packed, deterministic=True)["mlm_logits"])[0]
    for k, tokens in enumerate(examples):
        alone = one(tokens, masked[k])
        logits = jitted.apply(model, params, alone, deterministic=True)["mlm_logits"]
        np.testing.assert_allclose(packed_logits[3 * k : 3 * k + 3], np.asarray(logits)[0], atol=2e-5)
        piece = {key: packed[key][:, 3 * k : 3 * k + 3] for key in ("masked_lm_ids", "masked_lm_weights")}
        loss_packed = mlm_loss_and_metrics(
            packed_logits[None, 3 * k : 3 * k + 3], piece["masked_lm_ids"], piece["masked_lm_weights"]
        )
        loss_alone = mlm_loss_and_metrics(logits, alone["masked_lm_ids"], alone["masked_lm_weights"])
        np.testing.assert_allclose(loss_packed["mlm_loss_sum"], loss_alone["mlm_loss_sum"], rtol=1e-5)


def _suite(*args):
    env = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0"}  # one CPU device
    result = subprocess.run(
        [sys.executable, "-m", "bench.suite", "--tiny", "--dtype=float32", "--steps=1", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow(90)
@pytest.mark.extended
def test_suite_measures_every_member_in_one_process():
    """`bench.suite --tiny`: every member's step (each recipe's objective and attention path)
    in one child process, a JSON line and a table row each; the peer's rows say why they
    are missing."""
    out, final = _suite("--peer_python=/nonexistent/python", "--compile_workers=0")
    assert [line["member"] for line in final["ours"]] == [m.name for m in suite_members.MEMBERS]
    assert final["child_processes"] == 1
    objectives = {line["member"]: line["result"]["objective"] for line in final["ours"]}
    assert objectives == {
        "bert_base_128": "MaskedLM",
        "bert_large_512": "MaskedLM",
        "bert_large_512_no_attention_dropout": "MaskedLM",
        "bert_large_512_flash": "MaskedLM",
        "roberta_large_512": "MaskedLM",
        "albert_xxlarge_512": "MaskedLM",
        "electra_base_512": "ElectraRTD",
        "spanbert_large_512": "SpanBoundary",
        "deberta_v3_base_512": "DebertaRTD",
        "xlnet_base_512": "PermutationLM",
    }
    for line in final["ours"]:
        result = line["result"]
        assert (result["batch"], result["seq"], result["config"]["num_layers"]) == (2, 32, 1)
        assert result["tokens_per_second"] > 0 and line["wall_seconds"] > result["compile_seconds"]
    assert [p["member"] for p in final["peer"]] == ["bert_base_128", "bert_large_512"]
    assert all(p["note"].startswith("no peer virtualenv at /nonexistent/python") for p in final["peer"])
    assert out.count("| n/a* |") == 2 and out.count("* no peer virtualenv at /nonexistent/python") == 1
    assert "| bert_large_512 | 2 x 32 | explicit, dropout 0.1 |" in out
    # Without attention dropout 'auto' takes the platform's kernel: XLA's on a CPU.
    assert "| bert_large_512_no_attention_dropout | 2 x 32 | xla |" in out
    assert "| bert_large_512_flash | 2 x 32 | flash, dropout 0.1 |" in out
    assert "| deberta_v3_base_512 | 2 x 32 | disentangled, dropout 0.1 |" in out


@pytest.mark.slow
def test_suite_kills_a_member_over_its_time_limit_and_goes_on():
    """Each member killed at its limit, a new child for the rest; the arm with XLA flags in a
    child of its own, after the members without (grouped by flags)."""
    names = ["bert_base_128", "bert_base_128_triton_gemm_off", "electra_base_512"]
    out, final = _suite(f"--only={','.join(names)}", "--timeout=0.5", "--compile_workers=0")

    def killed(name):
        return {"member": name, "error": "no result within 0.5 s: killed"}

    assert final["ours"] == [killed(name) for name in names]
    streamed = [json.loads(line) for line in out.splitlines()[:3]]  # each as it happens
    assert streamed == [
        killed("bert_base_128"),
        killed("electra_base_512"),
        killed("bert_base_128_triton_gemm_off"),
    ]
    assert final["child_processes"] == 3 and final["peer"] == []


@pytest.mark.slow(90)
@pytest.mark.extended
def test_suite_compiles_ahead_in_parallel_then_times_each_member_from_the_cache(tmp_path):
    """`--compile_workers=2`: two processes compile the members (an XLA-flag arm among them,
    with its flags) into the cache before any is timed; the timed processes read each
    member's init and step from it instead of compiling them; the arm runs in a process of
    its own with its flags and is reported against its base."""
    cache = tmp_path / "cache"
    out, final = _suite(
        "--only=bert_base_128,electra_base_512,bert_base_128_triton_gemm_off",
        "--compile_workers=2",
        f"--compilation_cache={cache}",
        "--peer_python=/nonexistent/python",
    )
    names = ["bert_base_128", "electra_base_512", "bert_base_128_triton_gemm_off"]
    assert final["compile_workers"] == 2 and [line["member"] for line in final["ahead"]] == names
    for line in final["ahead"]:
        compiled = line["result"]
        assert compiled["name"] == "ours_compiled" and compiled["step_compile_seconds"] > 0
        assert compiled["compilation_cache"]["requests"] > compiled["compilation_cache"]["hits"]  # compiled
    timed = {line["member"]: line for line in final["ours"]}
    for name in names:  # the timed processes compiled nothing of the members' (the peak is theirs)
        use = timed[name]["result"]["compilation_cache"]
        assert use["requests"] >= 2 and use["hits"] == use["requests"], (name, use)  # init, step ...
    assert "--xla_gpu_enable_triton_gemm=false" in timed["bert_base_128_triton_gemm_off"]["xla_flags"]
    assert "triton" not in timed["bert_base_128"]["xla_flags"]
    assert final["child_processes"] == 2  # the arm's flags need a process of their own
    assert "| bert_base_128_triton_gemm_off | --xla_gpu_enable_triton_gemm=false |" in out
    assert f"compilation cache: {cache}" in out and any(cache.iterdir())


def test_suite_arms_are_the_levers_with_their_bases():
    args = suite.build_parser().parse_args(["--arms"])
    members = suite._members(args)
    assert [m.name for m in members[:2]] == ["bert_base_128", "bert_large_512"]
    assert members[2:] == list(suite_members.ARMS) and all(
        arm.base in suite_members.BY_NAME for arm in suite_members.ARMS
    )
    assert suite_members.lever(suite_members.BY_NAME["bert_base_128_batch_512"]) == "batch 512 x 128"
    assert suite_members.lever(suite_members.BY_NAME["bert_base_128_rbg_dropout"]) == "--dropout_prng=rbg"
    assert (
        suite_members.lever(suite_members.BY_NAME["bert_large_512_remat"])
        == "EncoderConfig.remat_policy = 'dots_saveable'"
    )
    both = suite.build_parser().parse_args(["--arms", "--only=bert_base_128"])
    with pytest.raises(suite.SuiteError, match="--only and --arms"):
        suite._members(both)


def test_compile_workers_take_a_quarter_of_the_cores_and_none_on_small_or_tpu_hosts():
    def workers(setting, members, cpus, tpu_host=False):
        return suite.compile_workers(setting, members, cpus, tpu_host)

    assert workers("auto", members=10, cpus=2) == 0  # this CPU machine: each compiles as it is timed
    assert workers("auto", members=10, cpus=16) == 4  # a GPU host
    assert workers("auto", members=3, cpus=64) == 3
    assert workers("auto", members=10, cpus=240, tpu_host=True) == 0  # one process holds the chips
    assert workers("5", members=3, cpus=2) == 3
    assert workers("0", members=3, cpus=64) == 0


def test_suite_names_its_members_on_a_typo(capsys):
    result = cli_run.run(suite.main, ["--only=bert_base"], capsys)
    assert result.returncode == 2 and result.errors() == [
        "error: --only: no member bert_base; the suite has " + ", ".join(suite_members.BY_NAME)
    ]
