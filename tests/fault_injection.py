"""Fault injection: kill, preempt, break the disk and corrupt checkpoints of a tiny run;
every resumed run must end with the same parameters as one uninterrupted run.

    python -m tests.fault_injection [--kills 3] [--seed 0] [--workdir DIR]

Runs `python -m pretrain.train` (the command users run) on synthetic shards, as
separate processes, and checks:

1. uninterrupted: the reference `params_sha256`;
2. SIGKILL while an asynchronous checkpoint save is in flight: the half-written step is
   never taken as latest, the run resumes from the one before;
3. then, in the same workdir, SIGKILL at random later steps, `--kills` times, each
   followed by the same command (exact data position and randomness on resume);
4. then SIGTERM one step after the last kill: exit code 0, "stopped at step N" in the
   log, checkpoint N on disk;
5. then the same command, with the disk filling up during a save (a file-size limit,
   RLIMIT_FSIZE): it resumes from N, and ends with one `error:` line naming N as the last
   complete checkpoint and no traceback; with space again, it resumes from N and ends on
   the reference's hash (the one run that finishes proves every resume before it);
6. damaged checkpoints (an array file deleted, an array file truncated, the iterator
   state deleted: the three newest of the reference run): each reported in one line and
   moved to bad_checkpoints/, the newest intact one is used, same final hash.

Prints one line per scenario and a JSON summary; exits 1 on the first failure.
tests/test_fault_injection.py runs it in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import data_position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 12
CHECKPOINT_EVERY = 2
# The last step a random SIGKILL may land on: the SIGTERM after it must stop the run
# before its last step, so that the full-disk run that follows still has a save to fail.
LAST_KILL = 9

# Kills itself with SIGKILL right after the orbax save of step 6 has started in the
# background: the kill lands while the checkpoint is being written.
_KILL_DURING_SAVE = """
import os, signal, sys
from core import checkpointing
from pretrain import train

original = checkpointing.Checkpointer.save

def save_then_die(self, step, state, iterator):
    original(self, step, state, iterator)
    if step == 6:
        os.kill(os.getpid(), signal.SIGKILL)

checkpointing.Checkpointer.save = save_then_die
sys.exit(train.main(sys.argv[1:]))
"""


class FaultError(AssertionError):
    pass


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        # Under pytest, conftest's flags (8 devices, fast compilation); else 8 devices.
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", "--xla_force_host_platform_device_count=8"),
        "JAX_PLATFORMS": "cpu",
    }


class Scenario:
    """One workdir trained with the same gin file as the reference run."""

    def __init__(self, base: str, name: str, gin_file: str):
        self.workdir = os.path.join(base, name)
        self.gin_file = gin_file

    def _args(self) -> list[str]:
        return [f"--gin_file={self.gin_file}", f"--workdir={self.workdir}"]

    def run(
        self, extra_code: str | None = None, fsize_limit: int | None = None
    ) -> subprocess.CompletedProcess:
        command = (
            [sys.executable, "-c", extra_code] if extra_code else [sys.executable, "-m", "pretrain.train"]
        )

        def limit():
            if fsize_limit is not None:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))

        return subprocess.run(
            command + self._args(),
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
            preexec_fn=limit,
        )

    def run_until(self, step: int, sig: int) -> tuple[int, str]:
        """Starts training, sends `sig` once step `step` is logged; returns (exit code, log)."""
        process = subprocess.Popen(
            [sys.executable, "-m", "pretrain.train", *self._args()],
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines = []
        pattern = re.compile(rf"\bstep {step}/{STEPS}\b")
        for line in process.stdout:
            lines.append(line)
            if pattern.search(line):
                process.send_signal(sig)
                break
        lines.extend(process.stdout)
        return process.wait(timeout=600), "".join(lines)

    def finish(self) -> dict:
        result = self.run()
        if result.returncode != 0:
            raise FaultError(f"{self.workdir}: resume failed:\n{result.stderr[-3000:]}")
        with open(os.path.join(self.workdir, "summary.json")) as f:
            return {"summary": json.load(f), "log": result.stderr}

    def checkpoint_steps(self) -> list[int]:
        directory = os.path.join(self.workdir, "checkpoints")
        return (
            sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []
        )


def write_setup(base: str) -> str:
    """Synthetic shards and a tiny gin file; returns the gin file."""
    sys.path.insert(0, ROOT)
    from data import synthetic

    data_dir = synthetic.write_shards(
        os.path.join(base, "shards"),
        synthetic.make_documents(60, seed=1, max_len=8),
        synthetic.make_documents(6, seed=2, max_len=8, first_id=150),
    )
    gin_file = os.path.join(base, "tiny.gin")
    with open(gin_file, "w") as f:
        f.write(f"""
include '{ROOT}/configs/recipes/bert.gin'
run.data_dir = '{data_dir}'
run.model_config = @EncoderConfig()
EncoderConfig.vocab_size = {synthetic.VOCAB_SIZE}
EncoderConfig.hidden_size = 32
EncoderConfig.num_layers = 2
EncoderConfig.num_heads = 2
EncoderConfig.intermediate_size = 64
EncoderConfig.max_position_embeddings = 64
PipelineConfig.max_seq_length = 32
PipelineConfig.max_predictions_per_seq = 5
PipelineConfig.document_shuffle_buffer = 10
PipelineConfig.instance_shuffle_buffer = 20
run.batch_size = 8
run.steps = {STEPS}
run.log_every = 1
run.eval_every = 1000
run.eval_batches = 1
run.checkpoint_every = {CHECKPOINT_EVERY}
run.max_checkpoints = 4
adamw.learning_rate = 1e-3
adamw.warmup_steps = 2
""")
    return gin_file


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise FaultError(message)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs at random steps")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill steps")
    parser.add_argument("--workdir", default=None, help="default: a temporary folder, deleted after")
    args = parser.parse_args(argv)
    if not 1 <= args.kills <= LAST_KILL - 6:
        parser.error(f"--kills must be in 1..{LAST_KILL - 6} (distinct steps 7..{LAST_KILL})")
    base = args.workdir or tempfile.mkdtemp(prefix="fault_injection_")
    os.makedirs(base, exist_ok=True)
    rng = random.Random(args.seed)
    started = time.time()
    report: dict = {}
    try:
        gin_file = write_setup(base)

        reference = Scenario(base, "reference", gin_file).finish()["summary"]["params_sha256"]
        report["reference_sha256"] = reference
        print(f"uninterrupted run: params_sha256 {reference[:16]}", flush=True)

        def same_end(scenario: Scenario, what: str) -> dict:
            finished = scenario.finish()
            got = finished["summary"]["params_sha256"]
            _expect(got == reference, f"{what}: final params_sha256 {got[:16]} != reference {reference[:16]}")
            return finished

        # Items 2-5 of the module docstring, as one chain in one workdir.
        scenario = Scenario(base, "faults", gin_file)
        result = scenario.run(extra_code=_KILL_DURING_SAVE)
        _expect(result.returncode == -signal.SIGKILL, f"kill during save: exit {result.returncode}")
        on_disk = scenario.checkpoint_steps()
        _expect(max(on_disk, default=0) <= 6, f"kill during save: unexpected steps {on_disk}")
        # After step 6 so that every run is killed after it has resumed, and before step
        # LAST_KILL + 1 so that the SIGTERM after them leaves a save for the full disk.
        kill_steps = sorted(rng.sample(range(7, LAST_KILL + 1), args.kills))  # --kills checked above
        resumed_from = []
        for step in kill_steps:
            code, log = scenario.run_until(step, signal.SIGKILL)
            _expect(code == -signal.SIGKILL, f"SIGKILL at step {step}: exit code {code}\n{log[-2000:]}")
            # The run killed before this one left its lease (core/lease.py): taken over at once.
            _expect(
                "took over the lease of pretraining" in log and "whose process has ended" in log,
                f"SIGKILL at step {step}: the killed run's lease was not taken over:\n{log[-2000:]}",
            )
            match = re.search(r"resumed from step (\d+)", log)
            resumed_from.append(int(match.group(1)) if match else 0)
        _expect(
            resumed_from[0] == max(on_disk, default=0), f"kill during save: resumed from {resumed_from[0]}"
        )
        report["kill_during_save"] = {"complete_steps_after_kill": on_disk, "resumed_from": resumed_from[0]}
        report["sigkill"] = {"killed_at": kill_steps, "resumed_from": resumed_from[1:]}
        print(f"SIGKILL during the save of step 6: complete steps {on_disk}, resumed", flush=True)
        print(f"SIGKILL at steps {kill_steps}, each resumed", flush=True)

        code, log = scenario.run_until(kill_steps[-1] + 1, signal.SIGTERM)
        match = re.search(r"SIGTERM: stopped at step (\d+)", log)
        _expect(code == 0 and match is not None, f"SIGTERM: exit {code}, log:\n{log[-2000:]}")
        stopped = int(match.group(1))
        _expect(stopped < STEPS, f"SIGTERM: stopped at the last step {stopped}, no save left to fail")
        _expect(stopped in scenario.checkpoint_steps(), f"SIGTERM: no checkpoint {stopped}")
        report["sigterm"] = {"stopped_at": stopped, "exit_code": code}
        print(f"SIGTERM: exit 0, checkpoint at step {stopped}", flush=True)
        before = scenario.checkpoint_steps()
        result = scenario.run(fsize_limit=64 * 1024)
        _expect(f"resumed from step {stopped}" in result.stderr, "SIGTERM: did not resume at the stop")
        # orbax's own reports of the failed background writes (tracebacks from its threads,
        # asyncio's and tensorstore's) stay off stderr (core/checkpointing.py): the user sees
        # one line, and nothing runs into it.
        errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
        _expect(
            result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr,
            f"disk full: exit {result.returncode}:\n{result.stderr[-3000:]}",
        )
        _expect(errors[0].startswith("error: saving checkpoint"), f"disk full: {errors[0]}")
        _expect(f"last complete checkpoint is step {before[-1]}" in errors[0], f"disk full: {errors[0]}")
        finished = same_end(scenario, f"SIGKILL during a save and at {kill_steps}, SIGTERM, a full disk")
        _expect(f"resumed from step {stopped}" in finished["log"], "disk full: did not resume at the stop")
        report["disk_full"] = {"error": errors[0], "checkpoints_before": before}
        print(
            f"disk full during a save: '{errors[0][:120]}...'; after freeing space: resumed from the "
            "SIGTERM's checkpoint, identical final hash",
            flush=True,
        )

        # 6. Damaged checkpoints: the reference run keeps four (6, 8, 10 and 12); the three
        # newest are damaged, each another way, and the same command runs again. It must
        # report each in one line, move each to bad_checkpoints/, fall back through them to
        # the oldest and train from there to the reference's parameters.
        scenario = Scenario(base, "reference", gin_file)
        os.remove(os.path.join(scenario.workdir, "summary.json"))
        steps = scenario.checkpoint_steps()
        _expect(len(steps) == 4, f"damaged: expected 4 checkpoints, found {steps}")
        damages = dict(
            zip(reversed(steps), ("delete_array_file", "truncate_array_file", "delete_iterator_state"))
        )
        for step, damage in damages.items():
            _damage(scenario.workdir, step, damage)
        finished = same_end(scenario, "three damaged checkpoints")
        for step, damage in damages.items():
            warning = [l for l in finished["log"].splitlines() if f"checkpoint step {step} is damaged" in l]
            _expect(
                len(warning) == 1, f"{damage} in step {step}: no one-line report:\n{finished['log'][-2000:]}"
            )
            moved = os.path.join(scenario.workdir, "bad_checkpoints", str(step))
            _expect(os.path.isdir(moved), f"{damage}: damaged step {step} not kept in bad_checkpoints/")
        _expect(f"resumed from step {steps[0]}" in finished["log"], "damaged: did not fall back")
        report["corruption"] = {"damaged": damages, "resumed_from": steps[0]}
        print(
            "damaged checkpoints "
            + ", ".join(f"{step} ({damage})" for step, damage in damages.items())
            + f": each reported and moved aside, resumed from {steps[0]}: identical final hash"
        )

    except FaultError as e:
        print(f"FAILED: {e}", flush=True)
        return 1
    finally:
        if args.workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    report["seconds"] = round(time.time() - started, 1)
    print(json.dumps(report))
    return 0


def _damage(workdir: str, step: int, how: str) -> None:
    """Damages checkpoint `step` the way a crashed disk or a careless `rm` would."""
    state = os.path.join(workdir, "checkpoints", str(step), "state")
    arrays = sorted(
        (
            os.path.join(root, name)
            for root, _, names in os.walk(state)
            for name in names
            if "/d/" in root + "/"
        ),
        key=os.path.getsize,
    )
    if how == "delete_array_file":
        os.remove(arrays[-1])
    elif how == "truncate_array_file":
        with open(arrays[-1], "r+b") as f:
            f.truncate(os.path.getsize(arrays[-1]) // 2)
    elif how == "delete_iterator_state":
        shutil.rmtree(os.path.join(workdir, "checkpoints", str(step), data_position.ITEM))
    else:
        raise ValueError(how)


if __name__ == "__main__":
    sys.exit(main())
