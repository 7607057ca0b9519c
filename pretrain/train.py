r"""Pretraining CLI.

    python -m pretrain.train --gin_file=configs/runs/demo.gin --workdir=DIR \
        [--gin_bindings='run.steps=100' ...] [--mesh=data:4,fsdp:2,tensor:1]

The model's vocabulary size is the shards' (their manifest.json records the tokenizer's):
a model gin file's `EncoderConfig.vocab_size` (the published vocabulary's) gives way to it,
with a log line; one bound on the command line (--gin_bindings) must match it.

`--compile_for=SLICE` (a TPU accelerator type or topology, e.g. v5p-64) only compiles the
run's train step for that slice on this machine and says whether it fits, with nothing
trained or written (pretrain/tpu_compile.py): a launcher runs it before a slice is paid for.

Started again with the same workdir, it resumes from the latest checkpoint. SIGTERM or
SIGINT (a preemption notice, Ctrl-C) stops after the current step with a checkpoint and
exit status 0. A problem with the config, data or workdir is one `error:` line, status 2.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Sequence

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli
from pretrain import tpu_compile


def build_parser():
    parser = cli.parser(__doc__, "pretrain.train")
    cli.add_gin_flags(parser)
    parser.add_argument("--workdir", required=True, help="where checkpoints, metrics and the summary go")
    cli.add_mesh_flags(parser)
    cli.add_compilation_cache_flag(parser)
    tpu_compile.add_slice_flag(
        parser,
        "--compile_for",
        purpose="only compile the train step here for this slice, say if it fits, exit; ",
    )
    return parser


# A command-line binding of the vocabulary size, however the configurable is named.
_VOCAB_BINDING = re.compile(r"^\s*([\w.]+\.)?EncoderConfig\.vocab_size\s*=")


def vocab_size_from_shards(command_line_bindings: Sequence[str]) -> str | None:
    """Binds EncoderConfig.vocab_size to the shards' (run.data_dir's manifest) unless the
    command line binds it (then the trainer checks that it matches). Call after the gin
    files are parsed. Returns the log line when it overrides the gin files' value, else None."""
    import gin

    from data import shards

    if any(_VOCAB_BINDING.match(b) for b in command_line_bindings):
        return None
    try:
        data_dir = gin.query_parameter("run.data_dir")
    except ValueError:  # unset: the trainer says so in its own words
        return None
    vocab_size = shards.load_manifest(data_dir).vocab_size
    try:
        configured = gin.query_parameter("EncoderConfig.vocab_size")
    except ValueError:
        configured = None
    with gin.unlock_config():
        gin.bind_parameter("EncoderConfig.vocab_size", vocab_size)
    if configured is None or configured == vocab_size:
        return None
    return (
        f"EncoderConfig.vocab_size = {vocab_size}, the shards' tokenizer's (the gin files say {configured}, "
        "a published vocabulary's)"
    )


def _run(args) -> None:
    if args.compile_for:  # compile for the slice here, train nothing
        tpu_compile.compile_check(args.compile_for, args)
        return
    import jax
    import tensorflow as tf

    from core import compilation_cache
    from pretrain import trainer  # registers run, the objectives, EncoderConfig, PipelineConfig, adamw ...

    cli.initialize_distributed(args)  # before any other JAX call
    tf.config.set_visible_devices([], "GPU")  # tf.data only: keep TF off the accelerators
    cli.setup_logging(jax.process_index() == 0)
    cli.parse_gin(cli.gin_files(args), args.gin_bindings)
    overridden = vocab_size_from_shards(args.gin_bindings)
    if overridden:
        logging.getLogger("pretrain").info(overridden)
    cli.check_same_command(args)
    with compilation_cache.enabled(args.compilation_cache, args.workdir) as cache:
        summary = trainer.run(args.workdir, mesh_spec=args.mesh)
    logging.getLogger("pretrain").info(cache.summary())
    if summary.get("stopped_by"):
        # Preempted: the checkpoint is written and the trainer's log line said so ("SIGTERM:
        # stopped at step N of M, checkpoint in ..."); exit 0 so that schedulers restart us.
        return
    headline = summary["headline_metric"]
    print(
        f"done: step {summary['step']}  eval loss {summary['loss']:.4f}  {headline} {summary[headline]:.4f}  "
        f"summary in {args.workdir}/summary.json"
    )


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
