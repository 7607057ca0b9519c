"""Training-step benchmark of our pretraining code (the same step `pretrain.train` runs).

    python -m bench.pretrain --gin_file=configs/models/bert_base.gin --batch=32 --seq=128 \
        [--dtype=bfloat16] [--steps=10] [--predictions=20] [--mesh=data:1]

Builds the real sharded train step (trainer.build: AdamW, donated state, MLM on the P
masked positions only, NSP) for full-length synthetic rows with P masked positions,
compiles it, runs 2 warm-up steps and times `--steps` more. The last line is one JSON
object (bench/report.py): compile seconds, steps/s, non-pad tokens/s, model TFLOP/s by
PERFORMANCE.md's formula, this device's matmul peak measured in the same run and
dtype, MFU and peak memory. `--fake_devices=N` runs on N fake CPU devices.
"""

from __future__ import annotations

import dataclasses
import os

from absl import app, flags

_GIN_FILES = flags.DEFINE_multi_string("gin_file", [], "model gin file(s)")
_GIN_BINDINGS = flags.DEFINE_multi_string("gin_bindings", [], "extra gin bindings")
_BATCH = flags.DEFINE_integer("batch", 32, "global batch (rows)")
_SEQ = flags.DEFINE_integer("seq", 128, "sequence length")
_PREDICTIONS = flags.DEFINE_integer(
    "predictions", None, "masked positions per row (default 20 per 128 tokens)"
)
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "compute dtype (params stay float32)")
_STEPS = flags.DEFINE_integer("steps", 10, "timed steps after compilation and 2 warm-up steps")
_MESH = flags.DEFINE_string("mesh", None, "e.g. data:8; default every device on data")
_FAKE_DEVICES = flags.DEFINE_integer("fake_devices", 0, "run on this many fake CPU devices")


def main(argv):
    del argv
    if _FAKE_DEVICES.value:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={_FAKE_DEVICES.value}"
        os.environ["JAX_PLATFORMS"] = "cpu"
    import flax.linen as nn
    import jax

    from bench import report
    from models.encoder import EncoderConfig
    from models.pretraining import flops_per_sequence
    from pretrain import cli, optim, sharding, trainer

    batch_size, seq = _BATCH.value, _SEQ.value
    predictions = _PREDICTIONS.value or max(1, 20 * seq // 128)
    with cli.user_errors():
        cli.parse_gin(_GIN_FILES.value, _GIN_BINDINGS.value)
        config = dataclasses.replace(EncoderConfig(), dtype=_DTYPE.value)
        mesh = sharding.make_mesh(_MESH.value)
        sharding.check_batch_size(batch_size, mesh, jax.process_count())
    optimizer, schedule = optim.adamw(total_steps=10_000, learning_rate=1e-4, warmup_steps=100)
    batch = report.synthetic_batch(batch_size, seq, predictions, config.vocab_size)
    rules = sharding.logical_axis_rules()
    example = {k: v[:1] for k, v in batch.items()}
    setup = trainer.build(config, optimizer, schedule, example, mesh, rules, seed=0, sentence_objective=True)
    rng = jax.random.key(1)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        device_batch = sharding.global_batch(batch, mesh)
        compile_seconds, seconds, _ = report.time_steps(
            lambda state, b: setup.train_step(state, b, rng), setup.state, device_batch, _STEPS.value
        )
    print(
        report.result_line(
            "ours",
            batch=batch_size,
            seq=seq,
            real_tokens_per_row=float(batch["input_mask"].sum(1).mean()),
            flops_per_row=flops_per_sequence(config, seq, predictions),
            dtype=_DTYPE.value,
            compile_seconds=compile_seconds,
            seconds_per_step=seconds,
            predictions=predictions,
            config=dataclasses.asdict(config),
        )
    )


if __name__ == "__main__":
    app.run(main)
