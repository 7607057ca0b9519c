r"""One call measures the family: every member's train step at its recipe's shape, and the peer.

    python -m bench.suite [--dtype=bfloat16] [--steps=10] [--timeout=300] [--only=NAME,...] \
        [--arms] [--compile_workers=auto|N] [--compilation_cache=DIR] [--profile_dir=DIR] \
        [--peer_python=.venv-peer/bin/python] [--tiny]

For each member of MEMBERS (bench/suite_members.py: a model file and its recipe, at the
batch and length the recipe trains), `bench.pretrain` times our step with the recipe's
objective, dropout and attention path (`EncoderConfig.attention_implementation`, default
'auto': the platform's pick). All members with the same XLA flags run in one child
process, one after the other, so the imports, the backend's start and the peak
measurement are paid once; a member that gives no result within `--timeout` seconds (its
compilation included; the first member's also covers the child's start) is killed and
reported, and a new child goes on with the next. The peer (HF Flax BERT,
bench/peer_hf.py, in its own virtualenv: `make bench-peer-venv`) is timed at BERT-base
128 and BERT-large 512 with our model config; without its virtualenv those rows say so.

Compiling is most of a suite's time on an accelerator (40-50 s per member on an H200), so
on a host with the cores for it `--compile_workers` processes first compile every member's
init and step at once (`bench.pretrain --compile_only`) into JAX's persistent compilation
cache; then the members are timed one after the other, alone on the device, each reading
its executables from the cache. `--arms` runs ARMS instead (bench/suite_members.py), the
levers to try one at a time (XLA flags, batch, remat, the dropout PRNG), each against the
member it changes; `--profile_dir` adds each member's time per XLA operation.

Prints one JSON line per run as it finishes, then a markdown table (tokens/s, MFU against
the matmul peak measured in the same process, the compile seconds ahead and in the timed
process, and the seconds a member cost beyond its compilation and its timed and warm-up
steps), the arms against their bases, then one JSON line with everything. `--tiny` runs
the same suite on tiny shapes (1 layer of width 64, batch 2 x length 32): what the tests
run on a CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from bench.compare import peer_command
from bench.suite_members import ARMS, BY_NAME, MEMBERS, TINY_BATCH, TINY_BINDINGS, TINY_SEQ, Member
from bench.suite_tables import arms_table, table
from core import cli, compilation_cache
from core.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SuiteError(UserError):
    """A suite that cannot run (one line)."""


def build_parser():
    parser = cli.parser(__doc__, "bench.suite")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="bfloat16",
        help="compute dtype (params stay float32)",
    )
    parser.add_argument("--steps", type=cli.positive_int, default=10, help="timed steps per member")
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds a member may take, its compilation included (and again to be compiled ahead)",
    )
    parser.add_argument(
        "--only",
        default=None,
        help=f"comma-separated members to run, of {', '.join(m.name for m in MEMBERS + ARMS)}",
    )
    parser.add_argument(
        "--arms",
        action="store_true",
        help=f"instead of the family, the levers ({', '.join(a.name for a in ARMS)}) and the members "
        "they are measured against",
    )
    parser.add_argument(
        "--peer_python", default=".venv-peer/bin/python", help="python of the peer's virtualenv"
    )
    parser.add_argument("--tiny", action="store_true", help="tiny shapes: the suite's own test on a CPU")
    parser.add_argument(
        "--compile_workers",
        default="auto",
        type=_workers_setting,
        help="processes that compile the members at once, into the persistent cache, before any "
        "is timed; 0: each member compiles as it is timed; auto: one per 4 CPU cores, 0 below 8 "
        "and on TPU hosts",
    )
    parser.add_argument(
        "--compilation_cache",
        default=None,
        metavar="DIR",
        help="JAX's persistent compilation cache for the members (default $JAX_COMPILATION_CACHE_DIR, "
        "else, with compile workers, a temporary directory): a second run reads what the first compiled",
    )
    parser.add_argument(
        "--profile_dir",
        default=None,
        metavar="DIR",
        help="also trace --steps more steps of each member with jax.profiler into DIR/<member> and "
        "print the time per XLA operation kind",
    )
    # Internal: the child process that runs (or only compiles) the members it is given, one
    # JSON line each.
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compile_only", action="store_true", help=argparse.SUPPRESS)
    return parser


def _workers_setting(text: str) -> str:
    if text != "auto" and not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: a number of processes (0: none) or 'auto'")
    return text


def _members(args) -> list[Member]:
    if args.only is not None and args.arms:
        raise SuiteError("--only and --arms: name the arms and their bases in --only, or give --arms alone")
    if args.only is not None:
        names = [n for n in args.only.split(",") if n]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            raise SuiteError(f"--only: no member {', '.join(unknown)}; the suite has {', '.join(BY_NAME)}")
        return [BY_NAME[n] for n in names]
    if args.arms:
        bases = dict.fromkeys(arm.base for arm in ARMS)
        return [BY_NAME[name] for name in bases] + list(ARMS)
    return list(MEMBERS)


def _bench_argv(member: Member, args) -> list[str]:
    """bench.pretrain's command line for one member."""
    batch, seq = (TINY_BATCH, TINY_SEQ) if args.tiny else (member.batch, member.seq)
    argv = [f"--gin_file={g}" for g in member.gin_files]
    argv += [f"--gin_bindings={b}" for b in member.bindings + (TINY_BINDINGS if args.tiny else ())]
    if args.profile_dir and not args.compile_only:
        argv.append(f"--profile_dir={os.path.join(args.profile_dir, member.name)}")
    return (
        argv
        + list(member.options)
        + [
            f"--batch_size={batch}",
            f"--seq_len={seq}",
            f"--steps={args.steps}",
            f"--dtype={args.dtype}",
        ]
    )


# ----------------------------------------------------------------------------- the child


def _child(args) -> None:
    """Runs bench.pretrain's main for each named member in this process; prints one JSON line
    per member: {"member", "result"} or {"member", "error"}, with "wall_seconds" and the
    "xla_flags" this process was started with."""
    import gin

    from bench import pretrain, report

    start = time.perf_counter()  # the first member's wall time includes the peak
    if not args.compile_only:
        # Once per process, before any member exists (report.py), and outside the members'
        # counts of the compilation cache, which then count only what each member compiles.
        report.matmul_peak_flops(args.dtype)
    peak_seconds = time.perf_counter() - start
    for i, name in enumerate(args.child.split(",")):
        start = start if i == 0 else time.perf_counter()
        out, err = io.StringIO(), io.StringIO()
        gin.clear_config()
        argv = _bench_argv(BY_NAME[name], args) + (["--compile_only"] if args.compile_only else [])
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = pretrain.main(argv)
        except Exception as e:  # pylint: disable=broad-except  (one member's failure is its row)
            status, err = 1, io.StringIO(f"{type(e).__name__}: {e}")
        line = {"member": name, "wall_seconds": round(time.perf_counter() - start, 2)}
        line["xla_flags"] = os.environ.get("XLA_FLAGS", "")  # as this process was given them
        lines = out.getvalue().strip().splitlines()
        if status == 0 and lines:
            line["result"] = json.loads(lines[-1])
            if i == 0 and not args.compile_only:  # bench.pretrain read the peak measured above
                line["result"]["peak_seconds"] = round(peak_seconds, 2)
        else:
            line["error"] = _last_line(err.getvalue(), f"exit status {status}")
        print(json.dumps(line), flush=True)


# ----------------------------------------------------------------------------- the parent


def _in_children(
    members: list[Member], args, env: dict, ahead: bool = False, stop: threading.Event | None = None
) -> tuple[dict[str, dict], int]:
    """({member name: child's line}, child processes started): the members run one after the
    other in a child process (`ahead`: compiled only), each within --timeout seconds; a
    child that overruns is killed and a new one goes on with the rest. Members with other
    XLA flags run in a child of their own (XLA reads them once per process), so the members
    are grouped by their flags. `stop` set: no new child starts."""
    lines: dict[str, dict] = {}
    queued = sorted(members, key=lambda m: m.xla_flags)  # stable: the given order within a group
    processes = 0
    while queued:
        flags = queued[0].xla_flags
        count = next((i for i, m in enumerate(queued) if m.xla_flags != flags), len(queued))
        pending, queued = [m.name for m in queued[:count]], queued[count:]
        processes += 1
        command = [sys.executable, "-m", "bench.suite", f"--child={','.join(pending)}"]
        command += [f"--steps={args.steps}", f"--dtype={args.dtype}"] + (["--tiny"] if args.tiny else [])
        command += ["--compile_only"] if ahead else []
        command += [f"--profile_dir={args.profile_dir}"] if args.profile_dir else []
        child_env = {**env, "XLA_FLAGS": " ".join((env.get("XLA_FLAGS", ""),) + flags).strip()}
        with _LIVE_LOCK:  # a stop (below) kills the children started before it, and no later one starts
            if stop and stop.is_set():
                break
            child = subprocess.Popen(
                command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env
            )
            _LIVE.add(child)
        try:
            _read_child(child, pending, lines, args.timeout, ahead)
        finally:  # also on Ctrl-C: no child outlives the suite
            if child.poll() is None:
                child.kill()
            child.wait()
            with _LIVE_LOCK:
                _LIVE.discard(child)
        queued = [BY_NAME[name] for name in pending] + queued  # after a kill: a new child goes on
    return lines, processes


def _read_child(
    child: subprocess.Popen, pending: list[str], lines: dict, timeout: float, ahead: bool
) -> None:
    """Reads the child's line for each pending member into `lines`, removing it from `pending`;
    returns when all are in, or after the member it waited for overran `timeout` seconds (the
    child is killed) or the child died, either of which is that member's line."""
    results: queue.Queue = queue.Queue()
    stderr_tail: list[str] = []
    threading.Thread(target=_pump, args=(child.stdout, results.put), daemon=True).start()
    threading.Thread(target=_pump, args=(child.stderr, stderr_tail.append), daemon=True).start()
    while pending:
        name = pending[0]
        try:
            text = results.get(timeout=timeout)
        except queue.Empty:
            child.kill()
            lines[name] = {"member": name, "error": f"no result within {timeout:g} s: killed"}
            _print_line(lines[name], ahead)
            pending.pop(0)
            return
        if text is None:  # the child died (out of memory, a crash in XLA ...)
            child.wait()
            last = _last_line("".join(filter(None, stderr_tail)), "")  # the pump's None ends it
            error = f"the process died (status {child.returncode}): {last}"
            lines[name] = {"member": name, "error": error}
            _print_line(lines[name], ahead)
            pending.pop(0)
            return
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue  # not the child's report (a library writing to stdout)
        if isinstance(line, dict) and line.get("member") in pending:
            lines[line["member"]] = line
            _print_line(line, ahead)
            pending.remove(line["member"])


_PRINTING = threading.Lock()  # compile-ahead workers report from threads of their own
_LIVE: set[subprocess.Popen] = set()  # the children running now
_LIVE_LOCK = threading.Lock()


def _print_line(line: dict, ahead: bool) -> None:
    with _PRINTING:
        print(json.dumps({"ahead": line} if ahead else line), flush=True)


def compile_workers(setting: str, members: int, cpus: int, tpu_host: bool) -> int:
    """Processes that compile the members ahead (--compile_workers): 'auto' is one per 4 CPU
    cores, at most one per member; none on a host with fewer than 8 cores (a CPU run, where
    the compilations would take the cores from each other) or with TPU chips, which one
    process at a time holds."""
    if setting != "auto":
        return min(int(setting), members)
    return 0 if cpus < 8 or tpu_host else min(cpus // 4, members)


def _cpus() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def tpu_host() -> bool:
    """Whether this host has TPU chips (their device files), asked without starting JAX."""
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def _compile_ahead(members: list[Member], workers: int, args, env: dict) -> dict[str, dict]:
    """{member name: its compile-ahead line}: `workers` child processes at once, each compiling
    every workers-th member into the persistent cache, before any member is timed."""
    env = {**env, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # several processes on one accelerator
    results: list[dict] = [{} for _ in range(workers)]
    stop = threading.Event()

    def work(i):
        results[i] = _in_children(members[i::workers], args, env, ahead=True, stop=stop)[0]

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    finally:  # interrupted: the workers' children are killed and no new ones start
        with _LIVE_LOCK:
            stop.set()
            for child in _LIVE:
                child.kill()
    return {name: line for result in results for name, line in result.items()}


@contextlib.contextmanager
def _cache_environment(args, workers: int):
    """(the children's environment, its cache directory or None): with compile-ahead workers
    or --compilation_cache, JAX's persistent cache in that directory (by default
    $JAX_COMPILATION_CACHE_DIR, else a temporary one removed at the end), every compilation
    written to it; otherwise the environment as it is."""
    directory = args.compilation_cache or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if not workers and not args.compilation_cache:
        yield dict(os.environ), directory
        return
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_suite_cache_"))
        elif "://" not in directory:
            directory = os.path.abspath(directory)  # the children run in the repository's root
        yield {**os.environ, **compilation_cache.environment(directory)}, directory


def _last_line(text: str, default: str) -> str:
    """The last non-blank line of a process's stderr (its error), stripped; `default` if none."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else default


def _pump(stream, put) -> None:
    """Every line of `stream`, then None at its end."""
    for line in stream:
        put(line)
    put(None)


def _peer(member: Member, ours: dict, args) -> dict:
    """The peer's line at this member's shape with our model config, or a note why not."""
    python = os.path.join(ROOT, args.peer_python)
    if not os.path.exists(python):
        return {"note": f"no peer virtualenv at {args.peer_python}: make bench-peer-venv"}
    try:
        result = subprocess.run(
            peer_command(python, ours, args.steps),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=args.timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {args.timeout:g} s: killed"}
    if result.returncode != 0:
        return {"error": _last_line(result.stderr, f"exit status {result.returncode}")}
    return json.loads(result.stdout.strip().splitlines()[-1])


def _run(args) -> None:
    if args.child:
        _child(args)
        return
    members = _members(args)
    if args.profile_dir:
        args.profile_dir = os.path.abspath(args.profile_dir)  # the children run in the repository's root
    workers = compile_workers(args.compile_workers, len(members), _cpus(), tpu_host())
    # SIGTERM (a scheduler, `kill`) as Ctrl-C, so that the children are killed.
    previous_handler = signal.signal(signal.SIGTERM, signal.default_int_handler)
    start = time.perf_counter()
    try:
        with _cache_environment(args, workers) as (env, cache):
            ahead = _compile_ahead(members, workers, args, env) if workers else {}
            ahead_seconds = time.perf_counter() - start
            ours, processes = _in_children(members, args, env)
    except KeyboardInterrupt:
        raise SuiteError(
            "interrupted: its processes are killed; the lines above are the members measured"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    peers = {}
    for member in members:
        if member.peer and "result" in ours[member.name]:
            peers[member.name] = {"member": member.name, **_peer(member, ours[member.name]["result"], args)}
            print(json.dumps({"peer": peers[member.name]}), flush=True)
    first = next((line["result"] for line in ours.values() if "result" in line), {})
    seconds = time.perf_counter() - start
    print(
        f"\n{len(members)} members, {args.dtype}, on {first.get('device', '?')}, in {seconds:.0f} s", end=""
    )
    if workers:
        print(f" ({workers} processes compiled them ahead in the first {ahead_seconds:.0f} s)", end="")
    print(f"; compilation cache: {cache or 'none'}\n")
    print(table(members, ours, ahead, peers, args.steps))
    arms = arms_table(members, ours)
    if arms:
        print(f"\n{arms}")
    for member in members:
        profile = ours[member.name].get("result", {}).get("profile")
        if profile:
            print(f"\n{member.name}: time per XLA operation ({args.profile_dir}/{member.name})")
            for row in profile:
                print(f"  {row['ms_per_step']:10.3f} ms/step  {row['share']:6.1%}  {row['op']}")
    print(
        json.dumps(
            {
                "ours": [ours[m.name] for m in members],
                "ahead": [ahead[m.name] for m in members if m.name in ahead],
                "peer": list(peers.values()),
                "compile_workers": workers,
                "ahead_seconds": round(ahead_seconds, 1),
                "child_processes": processes,
                "seconds": round(seconds, 1),
            }
        )
    )


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
