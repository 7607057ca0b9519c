r"""Per-device memory of the real train step for a model, batch and mesh, from XLA's
memory analysis of the compiled step. Nothing is allocated: the state is abstract.

    python -m bench.memory --gin_file=configs/models/bert_large.gin --mesh=fsdp:8 \
        [--batch_size=64] [--seq_len=128] [--num_predictions=20] [--fake_devices=8]

`--fake_devices=N` runs on N fake CPU devices (to plan a pod layout on a laptop). The last
line is one JSON object: parameter + optimizer state bytes per device (the arguments of
the step minus the batch), temporaries, and the total.
"""

from __future__ import annotations

import json
import os
import sys

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli


def build_parser():
    parser = cli.parser(__doc__, "bench.memory")
    cli.add_gin_flags(parser, example="EncoderConfig.num_layers = 6")
    parser.add_argument("--mesh", default=None, help="e.g. fsdp:8 or data:8; default every device on data")
    batch_size = parser.add_argument(
        "--batch_size", type=cli.positive_int, default=64, help="global batch (rows)"
    )
    seq_len = parser.add_argument("--seq_len", type=cli.positive_int, default=128, help="sequence length")
    num_predictions = parser.add_argument(
        "--num_predictions", type=cli.positive_int, default=20, help="masked positions per row"
    )
    parser.add_argument(
        "--microbatches", type=cli.positive_int, default=1, help="gradient accumulation steps"
    )
    parser.add_argument("--fake_devices", type=int, default=0, help="run on this many fake CPU devices")
    cli.hidden_alias(parser, "--batch", batch_size)
    cli.hidden_alias(parser, "--seq", seq_len)
    cli.hidden_alias(parser, "--predictions", num_predictions)
    return parser


def _run(args) -> None:
    if args.fake_devices:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.fake_devices}"
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import numpy as np

    from core import optim, sharding
    from data.pipeline_config import PipelineConfig
    from models.encoder import EncoderConfig
    from pretrain import step as step_lib
    from pretrain import trainer  # noqa: F401  (registers what model and recipe files bind)
    from pretrain.objectives import make_objective

    cli.parse_gin(cli.gin_files(args), args.gin_bindings)
    partitioner = sharding.Partitioner.create(args.mesh)
    sharding.check_batch_size(args.batch_size, partitioner.mesh, 1, args.microbatches)
    objective = make_objective(
        EncoderConfig(),
        PipelineConfig(max_seq_length=args.seq_len, max_predictions_per_seq=args.num_predictions),
    )
    optimizer, schedule = optim.adamw(total_steps=1000)
    steps = step_lib.build(
        objective=objective,
        optimizer=optimizer,
        schedule=schedule,
        partitioner=partitioner,
        batch_size=args.batch_size,
        microbatches=args.microbatches,
    )
    spec = objective.batch_spec(args.batch_size, args.seq_len, args.num_predictions)
    batch = {
        k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=partitioner.batch_sharding)
        for k, s in spec.items()
    }
    with partitioner:
        compiled = steps.train_step.lower(steps.states.abstract, batch, jax.random.key(0)).compile()
    analysis = compiled.memory_analysis()
    batch_bytes = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in spec.values())
    batch_bytes //= partitioner.data_parallel_size
    result = {
        "mesh": dict(partitioner.mesh.shape),
        "batch": args.batch_size,
        "seq": args.seq_len,
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


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
