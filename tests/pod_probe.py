r"""A tiny program for the local-pod tests (core/local_pod.py): joins the cluster as our
tools do and checks one collective across the processes.

    python -m core.local_pod --processes=2 --devices_per_process=2 -- tests.pod_probe [--fail_process=1]

Prints `process I of N: D local / G global devices, sum S` where S is the sum over a
global array whose rows each process filled with its own id + 1 (so it is right only if
every process's rows took part), and with `--data_dir=D` `process I reads F1,F2...`: the
training shards the input pipeline gives this host. `--fail_process=K` makes process K exit with status 3
before joining: the others then wait for it (the hang the pod must name). `--hold=S` keeps
every process alive S seconds after its line (for a test that kills one of them).
`--train_mesh=SPEC` instead trains the mesh tests' tiny MaskedLM for 3 steps on fixed
global batches (tests/mesh_training.py), each process feeding its own rows of each, then
evaluates it on a fourth, and prints `SPEC: params_sha256 H losses L held-out sums S`: the
same whatever the number of processes.
"""

import argparse
import os
import sys
import time

import numpy as np

from core import cli


def build_parser():
    parser = cli.parser(__doc__, "tests.pod_probe")
    cli.add_mesh_flags(parser)
    parser.add_argument("--fail_process", type=int, default=None, help="this process exits with status 3")
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to stay after the line")
    parser.add_argument(
        "--data_dir", default=None, help="also print the training shard files this process reads"
    )
    parser.add_argument(
        "--train_mesh",
        action="append",
        default=[],
        help="train 3 steps on this mesh and print the hash (repeatable)",
    )
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.fail_process is not None and os.environ.get("JAX_PROCESS_ID") == str(args.fail_process):
        print("failing as asked", flush=True)
        return 3
    cli.initialize_distributed(args)
    import jax
    from jax.experimental import multihost_utils

    from core import sharding

    if args.train_mesh:
        for spec in args.train_mesh:
            _train(spec)
        return 0
    mesh = sharding.make_mesh(None)
    local = np.full((jax.local_device_count(), 4), jax.process_index() + 1, np.float32)
    rows = multihost_utils.host_local_array_to_global_array(local, mesh, jax.sharding.PartitionSpec("data"))
    total = float(jax.jit(lambda x: x.sum())(rows))
    print(
        f"process {jax.process_index()} of {jax.process_count()}: {jax.local_device_count()} local / "
        f"{jax.device_count()} global devices, sum {total:g}",
        flush=True,
    )
    if args.data_dir:
        from data.pipeline import host_files

        files, _ = host_files(args.data_dir, "train", jax.process_index(), jax.process_count())
        print(f"process {jax.process_index()} reads {','.join(files)}", flush=True)
    time.sleep(args.hold)
    return 0


def _train(mesh_spec: str) -> None:
    import jax

    from core import sharding
    from core.state import params_sha256
    from data.pipeline_config import PipelineConfig
    from pretrain.objectives import MaskedLM
    from tests import mesh_training

    rows = mesh_training.B // jax.process_count()
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    batches = [{k: v[mine] for k, v in b.items()} for b in mesh_training.mlm_batches(4)]
    data = PipelineConfig(max_seq_length=mesh_training.L, max_predictions_per_seq=mesh_training.P)
    objective = MaskedLM(mesh_training.SHARDABLE, data)
    mesh = sharding.make_mesh(mesh_spec)
    state, losses = mesh_training.train(mesh, batches[:3], objective)
    held_out = mesh_training.held_out_sums(mesh, state.params, batches[3], objective)
    print(
        f"{mesh_spec}: params_sha256 {params_sha256(state.params)} losses {losses} held-out sums {held_out}",
        flush=True,
    )


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
