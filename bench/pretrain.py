"""Training-step benchmark of our pretraining code (the same step `pretrain.train` runs).

    python -m bench.pretrain --gin_file=configs/models/bert_base.gin --batch=32 --seq=128 \
        [--dtype=bfloat16] [--steps=10] [--predictions=20] [--mesh=data:1] \
        [--without=masked_decoding,donation,vocab_padding] [--fused_attention] [--profile_dir=DIR]

Builds the real sharded train step (trainer.build: AdamW, donated state, MLM on the P
masked positions only, NSP) for full-length synthetic rows with P masked positions,
compiles it, runs 2 warm-up steps and times `--steps` more. The last line is one JSON
object (bench/report.py): compile seconds, steps/s, non-pad tokens/s, model TFLOP/s by
PERFORMANCE.md's formula, this device's matmul peak measured in the same run and
dtype, MFU and peak memory. `--fake_devices=N` runs on N fake CPU devices.

`--without=X,...` turns off one of our optimisations, to measure what each buys:
`masked_decoding` (the MLM head decodes all L positions, loss unchanged:
report.all_positions_batch), `donation` (the state is not donated), `vocab_padding`
(the vocab is not padded to --vocab_pad_multiple). `--fused_attention` sets attention
dropout to 0 so that attention goes through jax.nn.dot_product_attention
(`EncoderConfig.attention_implementation`, e.g. cudnn on GPU) instead of the explicit
softmax with dropout that BERT's recipe trains with. Model FLOPs are always counted
for P masked positions, so a variant doing more work gets no credit for it.
`--paired` also builds the default step and times the two alternately (`--rounds`
times `--steps` steps each), so that a shared machine's drift hits both alike; the
JSON then has default_seconds_per_step and variant_over_default (the ratio of seconds
per step: what an optimisation buys, when the variant turns it off).
`--profile_dir=DIR` then traces `--steps` more steps with jax.profiler into DIR (open
it in TensorBoard's profile plugin or Perfetto) and prints the time per XLA operation
kind, largest first (bench/report.py:profile_steps); the JSON gets the same table.
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
_VOCAB_PAD = flags.DEFINE_integer(
    "vocab_pad_multiple", 128, "EncoderConfig.vocab_pad_multiple, as the pretraining recipes bind it"
)
OPTIMISATIONS = ("masked_decoding", "donation", "vocab_padding")
_WITHOUT = flags.DEFINE_list("without", [], f"optimisations to turn off, of {', '.join(OPTIMISATIONS)}")
flags.register_validator(
    "without", lambda names: set(names) <= set(OPTIMISATIONS), f"--without takes {', '.join(OPTIMISATIONS)}"
)
_FUSED_ATTENTION = flags.DEFINE_bool(
    "fused_attention", False, "attention dropout 0, so attention runs jax.nn.dot_product_attention"
)
_PAIRED = flags.DEFINE_bool(
    "paired", False, "also time the default step, alternating with this variant (drift-proof ratio)"
)
_ROUNDS = flags.DEFINE_integer("rounds", 1, "with --paired: alternate the two this many times")
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", None, "after timing, trace --steps more steps with jax.profiler here and summarise them"
)


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
    without = set(_WITHOUT.value)
    with cli.user_errors():
        cli.parse_gin(_GIN_FILES.value, _GIN_BINDINGS.value)
        mesh = sharding.make_mesh(_MESH.value)
        sharding.check_batch_size(batch_size, mesh, jax.process_count())
    rules = sharding.logical_axis_rules()
    optimizer, schedule = optim.adamw(total_steps=10_000, learning_rate=1e-4, warmup_steps=100)
    rng = jax.random.key(1)

    def build(without: set[str], fused_attention: bool):
        """(config, rows, step, state, device batch) of one variant of our train step."""
        config = dataclasses.replace(
            EncoderConfig(),
            dtype=_DTYPE.value,
            vocab_pad_multiple=1 if "vocab_padding" in without else _VOCAB_PAD.value,
        )
        if fused_attention:
            config = dataclasses.replace(config, attention_dropout_rate=0.0)
        batch = report.synthetic_batch(batch_size, seq, predictions, config.vocab_size)
        if "masked_decoding" in without:
            batch = report.all_positions_batch(batch)
        setup = trainer.build(
            config,
            optimizer,
            schedule,
            {k: v[:1] for k, v in batch.items()},
            mesh,
            rules,
            seed=0,
            sentence_objective=True,
            donate="donation" not in without,
        )
        with jax.set_mesh(mesh):
            device_batch = sharding.global_batch(batch, mesh)
        last_state = {}  # the state the timed steps end with (the earlier ones were donated)

        def step(state, b):
            last_state["state"], metrics = setup.train_step(state, b, rng)
            return last_state["state"], metrics

        step.last_state = last_state
        return config, batch, step, setup.state, device_batch

    variants = [build(without, _FUSED_ATTENTION.value)]
    if _PAIRED.value:
        variants.append(build(set(), False))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        timings = report.time_alternately([v[2:] for v in variants], _STEPS.value, _ROUNDS.value)
        if _PROFILE_DIR.value:
            step, _, device_batch = variants[0][2:]
            profile = report.profile_steps(
                step, step.last_state["state"], device_batch, _STEPS.value, _PROFILE_DIR.value
            )
            print(f"profile of {_STEPS.value} steps in {_PROFILE_DIR.value}; time per XLA operation:")
            for row in profile:
                print(f"  {row['ms_per_step']:10.1f} ms/step  {row['share']:6.1%}  {row['op']}")
    config, batch = variants[0][:2]
    extra = {"profile": profile} if _PROFILE_DIR.value else {}
    if _PAIRED.value:
        extra["default_seconds_per_step"] = round(timings[1][1], 6)
        extra["variant_over_default"] = round(timings[0][1] / timings[1][1], 4)
    print(
        report.result_line(
            "ours",
            batch=batch_size,
            seq=seq,
            real_tokens_per_row=float(batch["input_mask"].sum(1).mean()),
            flops_per_row=flops_per_sequence(config, seq, predictions),
            dtype=_DTYPE.value,
            compile_seconds=timings[0][0],
            seconds_per_step=timings[0][1],
            predictions=predictions,
            without=sorted(without),
            fused_attention=_FUSED_ATTENTION.value,
            **extra,
            config=dataclasses.asdict(config),
        )
    )


if __name__ == "__main__":
    app.run(main)
