"""Pretraining CLI.

    python -m pretrain.train --gin_file=configs/runs/demo.gin --workdir=DIR \
        [--gin_bindings='run.steps=100' ...] [--mesh=data:4,fsdp:2,tensor:1]

Started again with the same workdir, it resumes from the latest checkpoint. SIGTERM or
SIGINT (a preemption notice, Ctrl-C) stops after the current step with a checkpoint and
exit status 0. A problem with the config, data or workdir is one `error:` line, status 2.
"""

from __future__ import annotations

import sys

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli


def build_parser():
    parser = cli.parser(__doc__, "pretrain.train")
    cli.add_gin_flags(parser)
    parser.add_argument("--workdir", required=True, help="where checkpoints, metrics and the summary go")
    cli.add_mesh_flags(parser)
    return parser


def _run(args) -> None:
    import jax
    import tensorflow as tf

    from core import sharding
    from pretrain import trainer  # registers run, the objectives, EncoderConfig, PipelineConfig, adamw ...

    sharding.initialize_distributed(args.distributed)  # before any other JAX call
    tf.config.set_visible_devices([], "GPU")  # tf.data only: keep TF off the accelerators
    cli.setup_logging(jax.process_index() == 0)
    cli.parse_gin(cli.gin_files(args), args.gin_bindings)
    summary = trainer.run(args.workdir, mesh_spec=args.mesh)
    if summary.get("stopped_by"):  # preempted: the checkpoint is written, exit 0 so schedulers restart us
        print(f"stopped by {summary['stopped_by']} at step {summary['step']}: run the same command to resume")
        return
    headline = summary["headline_metric"]
    print(
        f"done: step {summary['step']}  eval loss {summary['loss']:.4f}  {headline} {summary[headline]:.4f}  "
        f"summary in {args.workdir}/summary.json"
    )


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
