"""Several real JAX processes on this machine as one cluster (core/local_pod.py), formed the
way a GPU cluster forms one (core/cluster.py): the settings, their one-line errors, a
collective across processes, a process that fails while the other waits, and pretraining."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import pytest

from core import cluster, local_pod
from data import shards, synthetic
from pretrain import train
from tests import cli_run, mesh_training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "settings, env, message",
    [
        (dict(coordinator_address="10.0.0.1:1234"), {}, "is set but not --num_processes and --process_id"),
        (dict(coordinator_address="10.0.0.1:1234", num_processes=2), {}, "is set but not --process_id"),
        (dict(num_processes=2, process_id=0), {}, "need the coordinator's address too"),
        (dict(coordinator_address="h:1", num_processes=2, process_id=2), {}, "--process_id=2 is not in 0..1"),
        ({}, {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES='two'"),
    ],
)
def test_a_half_given_cluster_is_one_line(monkeypatch, settings, env, message):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(cluster.ClusterError, match=message):
        cluster.initialize_distributed("auto", cluster.Cluster.from_settings(**settings))
    assert not calls


def test_initialize_gets_the_settings_from_flags_or_environment(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(name, raising=False)
    assert not cluster.initialize_distributed("auto") and not calls  # one process, nothing said
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.2,10.0.0.3")  # a pod slice: JAX detects the rest
    assert cluster.initialize_distributed("auto")
    heartbeat = dict(heartbeat_timeout_seconds=60)  # --peer_timeout's default
    assert calls[-1] == dict(coordinator_address=None, num_processes=None, process_id=None, **heartbeat)
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES")
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "3")
    assert cluster.initialize_distributed("auto")
    assert calls[-1] == dict(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3, **heartbeat)
    flags = cluster.Cluster.from_settings("10.0.0.9:99", 2, 1)  # flags win over the environment
    assert cluster.initialize_distributed("auto", flags, peer_timeout=2.5)  # JAX takes whole seconds
    assert calls[-1] == dict(
        coordinator_address="10.0.0.9:99", num_processes=2, process_id=1, heartbeat_timeout_seconds=3
    )
    assert cluster.initialize_distributed("auto", flags, peer_timeout=0)  # JAX's own default
    assert calls[-1]["heartbeat_timeout_seconds"] == 100
    assert not cluster.initialize_distributed("off") and len(calls) == 4
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # SLURM: JAX finds the count and the id itself
    assert cluster.initialize_distributed("auto", cluster.Cluster.from_settings("10.0.0.1:1234", env={}))
    with pytest.raises(cluster.ClusterError, match="--distributed must be"):
        cluster.initialize_distributed("maybe")


def test_in_a_cluster_a_lost_peer_is_one_line_and_every_error_leaves_at_once(monkeypatch, capsys):
    """What cli.entry does in a cluster (faked here; the pod test below kills a real process):
    the error a collective raises when a peer's connection closes becomes one line, any
    other exception keeps its traceback, and both leave without JAX's shutdown barrier."""
    from core import cli

    left = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(cluster, "leave", left.append)

    def tool(error):
        def run(args):
            raise error

        return cli.entry(lambda: cli.parser("A tool.", "tests.tool"), run)

    lost = RuntimeError(
        "UNKNOWN: Gloo AllGather failed: [pair.cc:547] Connection closed by peer [127.0.0.1]:1"
    )
    assert tool(lost)([]) == 2 and left == [2]
    assert capsys.readouterr().err.splitlines() == [
        "error: another process of this cluster stopped during a collective (RuntimeError: UNKNOWN: Gloo "
        "AllGather failed: [pair.cc:547] Connection closed by peer [127.0.0.1]:1); restart every process "
        "with the same command to resume"
    ]
    assert tool(ZeroDivisionError("a bug"))([]) == 1 and left == [2, 1]
    assert "Traceback" in capsys.readouterr().err
    assert tool(cluster.ClusterError("bad"))([]) == 2 and left == [2, 1, 2]
    monkeypatch.setattr(jax, "process_count", lambda: 1)  # one process: a bug is a plain traceback
    with pytest.raises(ZeroDivisionError):
        tool(ZeroDivisionError("a bug"))([])
    assert left == [2, 1, 2]


@pytest.mark.slow
def test_a_local_pod_forms_one_cluster(tmp_path):
    """Two processes of 2 fake devices each: one 4-device cluster; the global sum counts
    every process's rows (2 devices x 4 x 1 + 2 devices x 4 x 2 = 24); the input pipeline
    gives the two hosts disjoint halves of the shard files."""
    data_dir = synthetic.write_shards(str(tmp_path / "shards"), synthetic.make_documents(8, seed=1))
    results = local_pod.run_pod(
        ["tests.pod_probe", f"--data_dir={data_dir}"], 2, 2, str(tmp_path / "logs"), timeout=240
    )
    assert [r.returncode for r in results] == [0, 0], [r.output()[-2000:] for r in results]
    files = []
    for r in results:
        assert f"process {r.process_id} of 2: 2 local / 4 global devices, sum 24" in r.output()
        files.append(re.search(rf"process {r.process_id} reads (.*)", r.output()).group(1).split(","))
    assert len(files[0]) == len(files[1]) == 2 and not set(files[0]) & set(files[1])
    assert sorted(files[0] + files[1]) == sorted(shards.load_manifest(data_dir).files("train"))


@pytest.mark.slow
def test_a_process_that_fails_leaves_no_one_waiting(tmp_path, capsys):
    """Process 1 exits before joining; process 0 waits for it in jax.distributed.initialize
    until the pod kills it and names both."""
    status = local_pod.main(
        ["--processes=2", "--devices_per_process=2", "--grace=3", f"--log_dir={tmp_path}"]
        + ["--", "tests.pod_probe", "--fail_process=1"]
    )
    err = capsys.readouterr().err.strip()
    assert status == 2 and err == (
        "error: process 1 exited with status 3; process 0 did not end 3 s after that and was killed: "
        f"see {tmp_path}/process_1.log (all logs in {tmp_path})"
    )
    assert "failing as asked" in (tmp_path / "process_1.log").read_text()


@pytest.mark.slow
@pytest.mark.extended
def test_a_coordinator_without_a_count_is_one_line_from_the_tool():
    """The case a GPU-cluster user meets first: only JAX_COORDINATOR_ADDRESS set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_NUM", "JAX_PROCESS", "SLURM"))}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain.train",
            "--gin_file=configs/runs/demo.gin",
            "--workdir=/nonexistent/w",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**env, "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1"},
        timeout=120,
    )
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: the coordinator address 127.0.0.1:1 is set but not --num_processes and --process_id: give "
        "every process the cluster's size and its own id (JAX_NUM_PROCESSES, JAX_PROCESS_ID), or start it "
        "under SLURM, Open MPI or Kubernetes"
    ]


@pytest.mark.slow(60)
@pytest.mark.extended(keep=["every_axis"])
@pytest.mark.parametrize(
    "meshes",
    [
        pytest.param(["data:2,fsdp:2,tensor:2"], id="every_axis"),
        pytest.param(["data:8", "fsdp:8"], id="data_or_fsdp"),
    ],
)
def test_two_processes_train_as_one_process_with_the_same_mesh(tmp_path, meshes):
    """The same global batches (each process feeding its rows) give bit-identical parameters,
    losses and held-out metric sums (over every host's rows) on 2 processes x 4
    devices and on a 1-process cluster x 8 devices (a plain process, with XLA's in-process
    collectives, differs in the last bits), with the batch split over both processes
    (data:8), parameters split across them (fsdp:8: the hash gathers them), and every axis
    at once (the case `make test` runs)."""
    command = ["tests.pod_probe", *(f"--train_mesh={m}" for m in meshes)]
    lines = {}
    for processes in (1, 2):
        results = local_pod.run_pod(
            command, processes, 8 // processes, str(tmp_path / str(processes)), timeout=400
        )
        assert all(r.returncode == 0 for r in results), [r.output()[-3000:] for r in results]
        for r in results:
            lines[processes, r.process_id] = [
                line for line in r.output().splitlines() if "params_sha256" in line
            ]
    assert len(lines[1, 0]) == len(meshes) and lines[2, 0] == lines[1, 0] and lines[2, 1] == lines[1, 0]
    weight = float(mesh_training.mlm_batches(4)[3]["masked_lm_weights"].sum())  # both hosts' rows
    assert all(f"'mlm_weight': {weight}" in line for line in lines[2, 0]), (weight, lines[2, 0])


def _when_logged(pod: local_pod.Pod, pattern: str, timeout: float = 300.0) -> re.Match:
    """The first match of `pattern` in process 0's output, once there is one."""
    deadline = time.monotonic() + timeout
    while not (match := re.search(pattern, pod.output(0), re.M)):
        assert pod.running(0) and time.monotonic() < deadline, pod.output(0)[-3000:]
        time.sleep(0.1)
    return match


class _PretrainingPod:
    """pretrain.train as 2 processes x 4 devices on a tiny BERT, through the tool's own
    --distributed=auto: runs in folders of `root`, each host reading its own shard files."""

    def __init__(self, root):
        self.root = root
        self.shards = [
            synthetic.write_shards(
                str(root / f"shards{i}"),
                synthetic.make_documents(40, seed=1 + i, max_len=8),
                synthetic.make_documents(6, seed=2, max_len=8, first_id=150),
            )
            for i in range(2)
        ]
        self.gin_file = root / "tiny.gin"
        self.gin_file.write_text(
            "include 'configs/models/bert_tiny.gin'\ninclude 'configs/recipes/bert.gin'\n"
            f"run.data_dir = '{self.shards[0]}'\nPipelineConfig.max_seq_length = 32\n"
            "PipelineConfig.max_predictions_per_seq = 5\nPipelineConfig.document_shuffle_buffer = 10\n"
            "PipelineConfig.instance_shuffle_buffer = 10\nrun.batch_size = 8\nrun.steps = 10\n"
            "run.log_every = 1\nrun.eval_batches = 1\nrun.checkpoint_every = 2\nadamw.warmup_steps = 1\n"
        )

    def start(self, run: str, logs: str, process_1_extra: tuple[str, ...] = ()) -> local_pod.Pod:
        command = [
            "pretrain.train",
            f"--gin_file={self.gin_file}",
            f"--workdir={self.root / run}",
            "--peer_timeout=20",
        ]
        return local_pod.Pod([command, command + list(process_1_extra)], 4, str(self.root / "logs" / logs))

    def finished(self, run: str, logs: str) -> dict:
        with self.start(run, logs) as pod:
            results = pod.wait(timeout=400)
        assert [r.returncode for r in results] == [0, 0], [r.output()[-3000:] for r in results]
        assert "done: step 10" in results[0].output()
        # Process 0 held the pod's one workdir lease (core/lease.py), and let it go at the end.
        assert not (self.root / run / "lease.json").exists()
        return json.loads((self.root / run / "summary.json").read_text())

    def resumed(self, run: str, logs: str) -> tuple[local_pod.Pod, int]:
        """A restarted run, once it has resumed and logged one step more: (pod, resumed step)."""
        pod = self.start(run, logs)
        try:
            step = int(_when_logged(pod, r"resumed from step (\d+)").group(1))
            _when_logged(pod, rf"step {step + 1}/10")
        except BaseException:
            pod.__exit__(None, None, None)  # no processes left behind
            raise
        return pod, step


@pytest.fixture(scope="module")
def pretraining_pod(tmp_path_factory):
    """The pod's files and its uninterrupted run "a" (summary.json), shared by the tests."""
    pod = _PretrainingPod(tmp_path_factory.mktemp("pretraining_pod"))
    return pod, pod.finished("a", "a")


@pytest.mark.slow(40)
@pytest.mark.extended
def test_a_pod_launched_on_a_live_runs_workdir_is_refused_on_every_process(pretraining_pod):
    """Another live run holds the workdir (here a process holding its lease): process 0 is
    refused and every process of the pod prints the same line, learnt from process 0 through
    JAX's coordination service; nothing is trained or written."""
    pod, _ = pretraining_pod
    workdir = pod.root / "held"
    code = (
        "import time; from core import lease; "
        f"lease.acquire({str(workdir)!r}, 'pretraining'); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pod.start("held", "held") as refused:
            results = refused.wait(timeout=300)
    finally:
        holder.kill()
        holder.wait()
    errors = [[line for line in r.output().splitlines() if line.startswith("error:")] for r in results]
    assert [r.returncode for r in results] == [2, 2], [r.output()[-3000:] for r in results]
    assert errors[0] == errors[1] and len(errors[0]) == 1, errors
    assert errors[0][0].startswith(
        f"error: workdir '{workdir}' is in use by pretraining (pid {holder.pid} on "
    )
    assert sorted(p.name for p in workdir.iterdir()) == [".lease.lock", "lease.json"]


@pytest.mark.slow(90)
@pytest.mark.extended
def test_pretraining_on_a_local_pod_resumes_after_a_host_is_killed(pretraining_pod):
    """The uninterrupted run: each host saves its own data position, process 0 alone writes
    the summary, metrics, config and TensorBoard, the checkpoint holds both hosts' work. Then
    SIGKILL to process 1 mid-run: process 0 ends within seconds with one line (JAX's heartbeat
    timeout, --peer_timeout, naming process 1; or a collective that fails first); restarted,
    the run ends on the uninterrupted run's parameters."""
    pod, summary = pretraining_pod
    workdir = pod.root / "a"
    assert (
        "distributed: process 0 of 2, 4 of 8 devices here" in (pod.root / "logs/a/process_0.log").read_text()
    )
    assert summary["step"] == 10 and (workdir / "checkpoints" / "10").is_dir()
    positions = (workdir / "checkpoints" / "10" / "data_iterator").glob("process_*")
    assert {p.name.split(".")[0] for p in positions} == {"process_0", "process_1"}
    metrics = (workdir / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == len(set(metrics)) and len(list((workdir / "tensorboard").rglob("events*"))) == 1
    assert (workdir / "config.gin").read_text().count("run.steps = 10") == 1

    with pod.start("k", "k_kill") as killed:
        _when_logged(killed, r"step 4/10")
        killed.send_signal(1, signal.SIGKILL)
        begin = time.monotonic()
        results = killed.wait(timeout=120, grace=60)
    # JAX's abort (SIGABRT) when its heartbeat timeout comes first, our exit when a collective fails.
    assert results[0].returncode in (2, -signal.SIGABRT), results[0].output()[-3000:]
    assert results[1].returncode == -signal.SIGKILL
    assert time.monotonic() - begin < 60
    output = results[0].output()
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output[-3000:]
    assert errors[0].startswith(
        (
            "error: process 1 of 2 stopped sending heartbeats to JAX's coordination service for 20 s",
            "error: another process of this cluster",
        )
    ) and errors[0].endswith("restart every process with the same command to resume"), errors
    assert "Traceback" not in output and "Check failure" not in output
    assert pod.finished("k", "k_end")["params_sha256"] == summary["params_sha256"]


@pytest.mark.slow(180)
@pytest.mark.extended
def test_pretraining_on_a_local_pod_through_preemption_and_the_coordinators_death(
    pretraining_pod, capsys, monkeypatch
):
    """SIGTERM to one host (a preemption notice) stops both at the same step with a
    checkpoint and status 0; SIGKILL to process 0 (where JAX's coordination service runs)
    ends the other at once with one line; restarted, the run ends on the uninterrupted
    run's parameters. A host started with another data directory: one line on each, nothing
    written. One process resuming the 2-host run: one line, nothing moved; with the data
    stream reset, the one process reads the 2-host checkpoint and trains on."""
    monkeypatch.chdir(ROOT)
    pod, summary = pretraining_pod

    # SIGTERM to process 1: JAX's preemption sync makes both hosts stop at one step.
    with pod.start("b", "b_term") as preempted:
        _when_logged(preempted, r"step 3/10")
        preempted.send_signal(1, signal.SIGTERM)
        results = preempted.wait(timeout=120)
    assert [r.returncode for r in results] == [0, 0], [r.output()[-3000:] for r in results]
    stops = [re.findall(r"SIGTERM: stopped at step (\d+)", r.output()) for r in results]
    assert len(stops[0]) == 1 and stops[0] == stops[1], stops  # one line each, the same step
    assert (pod.root / "b" / "checkpoints" / stops[0][0]).is_dir()

    # SIGKILL to process 0: process 1 ends at once with one line (core/abort_line.py)
    # instead of JAX's C++ abort.
    killed, resumed = pod.resumed("b", "b_kill0")
    with killed:
        assert resumed == int(stops[0][0])
        killed.send_signal(0, signal.SIGKILL)
        begin = time.monotonic()
        results = killed.wait(timeout=120, grace=60)
    # JAX's abort (status -SIGABRT), or first a collective's error (2): one line either way.
    assert results[0].returncode == -signal.SIGKILL and results[1].returncode in (-signal.SIGABRT, 2)
    assert time.monotonic() - begin < 10
    output = results[1].output()
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(
        (
            "error: process 0 of 2, which runs JAX's coordination service, has ended or is gone",
            "error: another process of this cluster stopped during",
        )
    ), output[-3000:]
    assert "Traceback" not in output and "Check failure" not in output
    assert pod.finished("b", "b_end")["params_sha256"] == summary["params_sha256"]

    # Process 1 with another data directory: both say so before anything is written.
    with pod.start("c", "c", (f"--gin_bindings=run.data_dir = '{pod.shards[1]}'",)) as other:
        results = other.wait(timeout=120)
    for r in results:
        assert r.returncode == 2 and [line for line in r.output().splitlines() if "error:" in line] == [
            "error: process 1 of 2 was started with other flags or gin config (files, bindings, data "
            "directory, workdir) than process 0: start every process with the same command and files"
        ], r.output()[-3000:]
    assert not (pod.root / "c").exists()

    # One process resuming the 2-host run: the positions of 2 hosts do not fit 1 (nothing
    # moved); with the data stream reset, it reads the checkpoint both hosts wrote.
    workdir = pod.root / "b"
    before = sorted(p.name for p in (workdir / "checkpoints").iterdir())
    args = [f"--gin_file={pod.gin_file}", f"--workdir={workdir}", "--gin_bindings=run.steps = 11"]
    result = cli_run.run(train.main, args, capsys)
    assert result.returncode == 2 and result.errors() == [
        f"error: checkpoint step 10 in {workdir / 'checkpoints'} holds the data positions of "
        "2 host(s), this run has 1: resume with 2 host(s), or bind run.reset_data_iterator = True to "
        "keep the model and optimizer state and restart the data stream"
    ]
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == before
    result = cli_run.run(train.main, [*args, "--gin_bindings=run.reset_data_iterator = True"], capsys)
    assert result.returncode == 0 and "resumed from step 10" in result.stderr, result.stderr[-3000:]
    assert json.loads((workdir / "summary.json").read_text())["step"] == 11


@pytest.mark.slow(30)
@pytest.mark.extended
def test_a_process_killed_outside_a_collective_is_named_after_the_heartbeat_timeout(tmp_path):
    """Process 2 of 3 killed while no process is in a collective (no socket error tells the
    others): JAX's heartbeat timeout, --peer_timeout=3, ends them, and each one's line names
    process 2, the coordination service's process 0 and process 1 alike."""
    command = ["tests.pod_probe", "--hold=120", "--peer_timeout=3"]
    with local_pod.Pod([command] * 3, 1, str(tmp_path)) as pod:
        deadline = time.monotonic() + 120
        while not all("sum 24" in pod.output(i) for i in range(3)):
            assert all(pod.running(i) for i in range(3)) and time.monotonic() < deadline
            time.sleep(0.1)
        pod.send_signal(2, signal.SIGKILL)
        begin = time.monotonic()
        results = pod.wait(timeout=60, grace=30)
    assert time.monotonic() - begin < 20
    for r in results[:2]:
        assert r.returncode == -signal.SIGABRT and r.output().splitlines()[-1] == (
            "error: process 2 of 3 stopped sending heartbeats to JAX's coordination service for 3 s "
            "(killed, or its host is gone): restart every process with the same command to resume"
        ), r.output()[-3000:]


@pytest.mark.slow
def test_when_process_0_is_killed_the_others_end_at_once_with_one_line(tmp_path):
    """JAX's coordination service lives in process 0: killed, JAX aborts the others at once
    with a C++ stack, which core/abort_line.py makes one line."""
    with local_pod.Pod([["tests.pod_probe", "--hold=120"]] * 3, 1, str(tmp_path)) as pod:
        deadline = time.monotonic() + 120
        while not all("sum 24" in pod.output(i) for i in range(3)):
            assert all(pod.running(i) for i in range(3)) and time.monotonic() < deadline
            time.sleep(0.1)
        pod.send_signal(0, signal.SIGKILL)
        begin = time.monotonic()
        results = pod.wait(timeout=60, grace=30)
    assert time.monotonic() - begin < 10
    for r in results[1:]:
        assert r.returncode == -signal.SIGABRT and r.output().splitlines()[-2:] == [
            f"process {r.process_id} of 3: 1 local / 3 global devices, sum 24",
            "error: process 0 of 3, which runs JAX's coordination service, has ended or is gone (killed, "
            "its host lost, or an error of its own: see its output): restart every process with the same "
            "command to resume",
        ], r.output()


def test_a_failed_pod_names_how_each_process_ended_and_what_it_said(tmp_path):
    """The console line of `python -m core.local_pod` when process 0 was killed: the others'
    own error lines are in their logs, and the pod's line repeats the last one of each."""
    gone = (
        "error: process 0 of 3, which runs JAX's coordination service, has ended or is gone (killed, its "
        "host lost, or an error of its own: see its output): restart every process with the same command "
        "to resume"
    )
    results = []
    for i, (code, text) in enumerate(
        [(-signal.SIGKILL, "12:00:01 step 3/10\n"), (-signal.SIGABRT, gone), (None, "")]
    ):
        (tmp_path / f"process_{i}.log").write_text(text + "\n")
        results.append(local_pod.ProcessResult(i, code, str(tmp_path / f"process_{i}.log")))
    assert local_pod.failure_line(results, 60, 600, str(tmp_path)) == (
        f"process 0 ended by SIGKILL; process 1 ended by SIGABRT ({gone}); process 2 did not end 60 s "
        f"after that and was killed: see {tmp_path}/process_0.log (all logs in {tmp_path})"
    )
    assert local_pod.failure_line([local_pod.ProcessResult(0, 0, "x")], 60, 600, "d") is None
    (tmp_path / "rt.log").write_text("")
    realtime = local_pod.ProcessResult(0, -40, str(tmp_path / "rt.log"))  # a signal with no name
    assert local_pod.failure_line([realtime], 60, 600, "d").startswith("process 0 ended by signal 40: see")


@pytest.mark.slow
def test_a_pod_that_outlives_its_timeout_is_killed_and_named(tmp_path, capsys):
    status = local_pod.main(
        ["--processes=2", "--devices_per_process=1", "--timeout=3", f"--log_dir={tmp_path}"]
        + ["--", "tests.pod_probe", "--hold=120"]
    )
    assert status == 2 and capsys.readouterr().err.strip() == (
        f"error: process 0, 1 did not end within 3 s and were killed: see {tmp_path}/process_0.log "
        f"(all logs in {tmp_path})"
    )
