r"""What a preemption costs a run: the restart's time to its first step, with and without the
compilation cache.

    python -m bench.restart --gin_file=RUN.gin [--gin_bindings=...] [--preempt_at=2] \
        [--caches=off,workdir] [--workdir=DIR]

For each `--compilation_cache` setting, a fresh workdir: `pretrain.train` runs until it logs
step `--preempt_at`, gets SIGTERM (the checkpoint is written, as on a preemption), and is
started again with the same command. Prints one JSON line per setting: the restart's seconds
to its first step (the trainer's "step N done (compilation included) in S s"), its wall
seconds, the cache's own summary line and which jitted steps it read from the cache.
docs/reliability.md has the figures and the command.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from core import cli
from core.errors import UserError

_FIRST_STEP = re.compile(r"step \d+ done \(compilation included\) in ([\d.]+) s")
_CACHE = re.compile(r"compilation cache(: off| \S+: \d+ of \d+ compilations read from it.*)")
_READ = re.compile(r"Persistent compilation cache hit for 'jit_(\w+)'")


def build_parser():
    parser = cli.parser(__doc__, "bench.restart")
    cli.add_gin_flags(parser)
    parser.add_argument(
        "--preempt_at", type=cli.positive_int, default=2, help="step at which SIGTERM is sent"
    )
    parser.add_argument("--caches", default="off,workdir", help="--compilation_cache settings to compare")
    parser.add_argument("--workdir", default=None, help="where the runs go (default: a temporary folder)")
    return parser


def _run(args) -> None:
    base = args.workdir or tempfile.mkdtemp(prefix="bench_restart_")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "JAX_LOG_COMPILES": "1"}  # names each cache hit
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # a shared cache would be warm already
    for setting in args.caches.split(","):
        command = [sys.executable, "-m", "pretrain.train", f"--workdir={os.path.join(base, setting)}"]
        command += [f"--gin_file={f}" for f in cli.gin_files(args)]
        command += [f"--gin_bindings={b}" for b in args.gin_bindings] + [f"--compilation_cache={setting}"]
        first = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        preempted = False
        for line in first.stdout:
            if re.search(rf"\bstep {args.preempt_at}/\d+\b", line):
                first.send_signal(signal.SIGTERM)
                preempted = True
                break
        first.stdout.read()
        if first.wait() != 0 or not preempted:
            raise UserError(
                f"the run to preempt ended (status {first.returncode}) before logging step "
                f"{args.preempt_at}: give --preempt_at below its run.steps and a run.log_every that logs it"
            )
        start = time.perf_counter()
        restart = subprocess.run(command, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        log = restart.stdout + restart.stderr
        step, cache = _FIRST_STEP.search(log), _CACHE.search(log)
        line = {
            "compilation_cache": setting,
            "exit_status": restart.returncode,
            "first_step_seconds": float(step[1]) if step else None,
            "wall_seconds": round(wall, 1),
            "cache": cache[0] if cache else None,
            "steps_read_from_cache": sorted({name for name in _READ.findall(log) if name.endswith("_step")}),
        }
        print(json.dumps(line), flush=True)


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
