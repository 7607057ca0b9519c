"""Pretraining CLI, the only module that defines flags.

    python -m pretrain.train --gin_file=configs/runs/demo.gin --workdir=DIR \
        [--gin_bindings='run.steps=100' ...] [--mesh=data:4,fsdp:2,tensor:1]

Started again with the same workdir, it resumes from the latest checkpoint. SIGTERM or
SIGINT (a preemption notice, Ctrl-C) stops after the current step with a checkpoint and
exit status 0.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's C++ start-up chatter

from absl import app, flags  # noqa: E402

from pretrain import cli  # noqa: E402

_GIN_FILES = flags.DEFINE_multi_string("gin_file", [], "gin files, applied in order")
_GIN_BINDINGS = flags.DEFINE_multi_string("gin_bindings", [], "gin bindings, e.g. 'run.steps=100'")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "where checkpoints, metrics and the summary go", required=True
)
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed",
    "auto",
    ["auto", "on", "off"],
    "jax.distributed.initialize(): auto = when the environment lists several hosts (TPU pod)",
)
_MESH = flags.DEFINE_string(
    "mesh", None, "e.g. 'data:4,fsdp:2,tensor:1' (one size may be -1); default: every device on 'data'"
)


def main(argv):
    del argv
    import jax
    import tensorflow as tf

    from pretrain import sharding, trainer

    with cli.user_errors():
        sharding.initialize_distributed(_DISTRIBUTED.value)  # before any other JAX call

    tf.config.set_visible_devices([], "GPU")  # tf.data only: keep TF off the accelerators
    cli.setup_logging(jax.process_index() == 0)
    with cli.user_errors():
        cli.parse_gin(_GIN_FILES.value, _GIN_BINDINGS.value)
        summary = trainer.run(_WORKDIR.value, mesh_spec=_MESH.value)
    if summary.get("stopped_by"):  # preempted: the checkpoint is written, exit 0 so schedulers restart us
        print(f"stopped by {summary['stopped_by']} at step {summary['step']}: run the same command to resume")
        return
    print(
        f"done: step {summary['step']}  eval loss {summary['loss']:.4f}  "
        f"mlm_accuracy {summary['mlm_accuracy']:.4f}  sentence_accuracy {summary['sentence_accuracy']}  "
        f"summary in {_WORKDIR.value}/summary.json"
    )


if __name__ == "__main__":
    app.run(main)
