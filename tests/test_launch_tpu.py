"""launch_tpu.sh: every subcommand under DRY_RUN=1 prints the gcloud commands it would run;
--help documents everything; shellcheck is clean."""

import os
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "launch_tpu.sh")
BASE = ["--name", "bert", "--zone", "us-central2-b"]


def _dry(*args, env=None):
    result = subprocess.run(
        ["bash", SCRIPT, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        env={**os.environ, "DRY_RUN": "1", **(env or {})},
    )
    return result, [shlex.split(line) for line in result.stdout.splitlines()]


def test_create_plain_and_spot():
    result, commands = _dry("create", *BASE, "--type", "v4-32", "--version", "tpu-ubuntu2204-base")
    assert result.returncode == 0
    assert commands == [
        [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "create",
            "bert",
            "--zone=us-central2-b",
            "--accelerator-type=v4-32",
            "--version=tpu-ubuntu2204-base",
        ]
    ]
    _, commands = _dry("create", *BASE, "--type", "v5p-128", "--spot", "--project", "p")
    assert commands == [
        [
            "gcloud",
            "compute",
            "tpus",
            "queued-resources",
            "create",
            "bert",
            "--node-id=bert",
            "--zone=us-central2-b",
            "--project=p",
            "--accelerator-type=v5p-128",
            "--runtime-version=tpu-ubuntu2204-base",
            "--spot",
        ]
    ]


def test_setup_copies_to_every_worker_and_installs_jax_tpu():
    _, commands = _dry("setup", *BASE)
    assert commands[0][:3] == ["git", "archive", "--format=tar.gz"]
    scp = commands[1]
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
    ssh = commands[2]
    assert ssh[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"] and "--worker=all" in ssh
    remote = ssh[-1]
    assert "pip install --quiet -r requirements-tpu.txt -f https://storage.googleapis.com/" in remote


@pytest.mark.parametrize(
    "accelerator, extra", [("tpu", ["jax[tpu]", "libtpu==0.0.42.1"]), ("gpu", ["jax[cuda12]"])]
)
def test_accelerator_requirements_add_jax_plugins_at_our_jax_version(accelerator, extra):
    """requirements-{gpu,tpu}.txt: requirements.txt plus JAX's plugin for the accelerator, at
    the JAX version requirements.txt pins (`make check-accelerator-requirements` resolves them
    against PyPI); the TPU's libtpu by name too (pretrain.tpu_compile installs it alone)."""
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        (jax_pin,) = [line.strip() for line in f if line.startswith("jax==")]
    with open(os.path.join(ROOT, f"requirements-{accelerator}.txt")) as f:
        lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    assert lines == ["-r requirements.txt", f"{extra[0]}=={jax_pin.split('==')[1]}", *extra[1:]]


def test_run_starts_the_same_command_on_all_workers_in_the_background():
    _, commands = _dry(
        "run",
        *BASE,
        "--workdir",
        "gs://b/run",
        "--",
        "--gin_file=configs/runs/demo.gin",
        "--gin_bindings=run.data_dir='gs://b/shards'",
    )
    (ssh,) = commands
    assert "--worker=all" in ssh
    remote = shlex.split(ssh[-1].removeprefix("--command="))
    assert remote[:4] == ["cd", "encoder-pretraining", "&&", "nohup"]
    assert remote[4:9] == [
        ".venv/bin/python",
        "-m",
        "pretrain.train",
        "--workdir=gs://b/run",
        "--gin_file=configs/runs/demo.gin",
    ]
    assert remote[9] == "--gin_bindings=run.data_dir='gs://b/shards'"
    assert remote[-4:] == [">", "~/train.log", "2>&1", "&"]


def test_run_with_a_type_compiles_the_step_for_that_slice_here_first():
    """`run --type`: `pretrain.train --compile_for` on this machine with the run's arguments,
    then the workers' command; `--no-check` (or no --type) starts the workers only."""
    args = ["run", *BASE, "--workdir", "gs://b/run", "--", "--gin_file=configs/runs/demo.gin"]
    _, commands = _dry(*args[:5], "--type", "v5litepod-16", *args[5:], env={"PYTHON": "/venv/python"})
    check, ssh = commands
    assert check == [
        "/venv/python",
        "-m",
        "pretrain.train",
        "--compile_for=v5litepod-16",
        "--workdir=gs://b/run",
        "--gin_file=configs/runs/demo.gin",
    ]
    assert ssh[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
    for skipped in ([*args[:5], "--type", "v5litepod-16", "--no-check", *args[5:]], args):
        _, commands = _dry(*skipped)
        assert len(commands) == 1 and commands[0][0] == "gcloud"


@pytest.mark.parametrize(
    "command, expected",
    [
        ("tail", ["--worker=0", "--command=tail -n 200 -f ~/train.log"]),
        ("ssh", ["--worker=0"]),
        ("stop", ["--worker=all", "--command=pkill -TERM -f 'python -m pretrain.train' || true"]),
        ("delete", ["--quiet"]),
    ],
)
def test_other_commands(command, expected):
    result, commands = _dry(command, *BASE)
    assert result.returncode == 0 and len(commands) == 1
    assert commands[0][:4] == ["gcloud", "compute", "tpus", "tpu-vm"]
    assert commands[0][-len(expected) :] == expected


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", *BASE], "run needs --workdir"),
        (["create", "--zone", "z"], "--name is required"),
        (["launch", *BASE], "unknown command 'launch'"),
        (["create", *BASE, "--tpye", "v4-8"], "unknown option '--tpye'"),
    ],
)
def test_errors(args, message):
    result, _ = _dry(*args)
    assert result.returncode == 2 and result.stderr.startswith("error: ") and message in result.stderr


def test_help_documents_every_command_and_option():
    result = subprocess.run(["bash", SCRIPT, "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    for word in (
        "create",
        "setup",
        "run",
        "tail",
        "ssh",
        "stop",
        "delete",
        "--name",
        "--zone",
        "--type",
        "--version",
        "--spot",
        "--queued",
        "--workdir",
        "--no-check",
        "PYTHON",
        "DRY_RUN=1",
    ):
        assert word in result.stdout


def test_shellcheck_clean():
    shellcheck = os.path.join(os.path.dirname(sys.executable), "shellcheck")
    result = subprocess.run([shellcheck, SCRIPT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout
