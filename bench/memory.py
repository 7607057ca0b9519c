"""Per-device memory of the real train step for a model, batch and mesh, from XLA's
memory analysis of the compiled step. Nothing is allocated: the state is abstract.

    python -m bench.memory --gin_file=configs/models/bert_large.gin --mesh=fsdp:8 \
        [--batch=64] [--seq=128] [--predictions=20] [--fake_devices=8]

`--fake_devices=N` runs on N fake CPU devices (to plan a pod layout on a laptop). The last
line is one JSON object: parameter + optimizer state bytes per device (the arguments of
the step minus the batch), temporaries, and the total.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags

_GIN_FILES = flags.DEFINE_multi_string("gin_file", [], "model gin file(s)")
_GIN_BINDINGS = flags.DEFINE_multi_string("gin_bindings", [], "extra gin bindings")
_MESH = flags.DEFINE_string("mesh", None, "e.g. fsdp:8 or data:8")
_BATCH = flags.DEFINE_integer("batch", 64, "global batch")
_SEQ = flags.DEFINE_integer("seq", 128, "sequence length")
_PREDICTIONS = flags.DEFINE_integer("predictions", 20, "masked positions per row")
_MICROBATCHES = flags.DEFINE_integer("microbatches", 1, "gradient accumulation steps")
_FAKE_DEVICES = flags.DEFINE_integer("fake_devices", 0, "run on this many fake CPU devices")


def main(argv):
    del argv
    if _FAKE_DEVICES.value:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={_FAKE_DEVICES.value}"
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import numpy as np

    from models.encoder import EncoderConfig
    from pretrain import cli, optim, sharding, trainer

    with cli.user_errors():
        cli.parse_gin(_GIN_FILES.value, _GIN_BINDINGS.value)
        config = EncoderConfig()
        mesh = sharding.make_mesh(_MESH.value)
        sharding.check_batch_size(_BATCH.value, mesh, 1, _MICROBATCHES.value)
    optimizer, schedule = optim.adamw(total_steps=1000)
    b, l, p = _BATCH.value, _SEQ.value, _PREDICTIONS.value
    batch = {
        **{k: np.zeros((b, l), np.int32) for k in ("input_ids", "input_mask", "segment_ids", "positions")},
        **{k: np.zeros((b, p), np.int32) for k in ("masked_lm_positions", "masked_lm_ids")},
        "masked_lm_weights": np.zeros((b, p), np.float32),
        "sentence_label": np.zeros((b,), np.int32),
    }
    example = {k: v[:1] for k, v in batch.items()}
    rules = sharding.logical_axis_rules()
    setup = trainer.build(
        config, optimizer, schedule, example, mesh, rules, 0, True, _MICROBATCHES.value, materialize=False
    )
    abstract_batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding.batch_sharding(mesh))
        for k, v in batch.items()
    }
    import flax.linen as nn

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        compiled = setup.train_step.lower(setup.state, abstract_batch, jax.random.key(0)).compile()
    analysis = compiled.memory_analysis()
    batch_bytes = sum(v.nbytes for v in batch.values()) // sharding.data_parallel_size(mesh)
    result = {
        "mesh": dict(mesh.shape),
        "batch": b,
        "seq": l,
        "state_bytes_per_device": int(analysis.argument_size_in_bytes - batch_bytes),
        "temp_bytes_per_device": int(analysis.temp_size_in_bytes),
        "total_bytes_per_device": int(
            analysis.argument_size_in_bytes
            + analysis.temp_size_in_bytes
            + analysis.output_size_in_bytes
            - analysis.alias_size_in_bytes
        ),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(app.run(main))
