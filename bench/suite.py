r"""One call measures the family: every member's train step at its recipe's shape, and the peer.

    python -m bench.suite [--dtype=bfloat16] [--steps=10] [--timeout=300] [--only=NAME,...] \
        [--peer_python=.venv-peer/bin/python] [--tiny]

For each member of MEMBERS (a model file and its recipe, at the batch and length the issue
of record measures), `bench.pretrain` times our step with the recipe's objective, dropout
and attention path (`EncoderConfig.attention_implementation`, default 'auto': the
platform's pick). All members run in one child process, one after the other, so the
imports, the backend's start and the peak measurement's warm-up are paid once; a member
that gives no result within `--timeout` seconds (its compilation included; the first
member's also covers the child's start) is killed and reported, and a new child goes on
with the next. The peer (HF Flax BERT, bench/peer_hf.py, in its own virtualenv: `make
bench-peer-venv`) is timed at BERT-base 128 and BERT-large 512 with our model config;
without its virtualenv those rows say so.

Prints one JSON line per run as it finishes, then a markdown table (tokens/s, MFU against
the matmul peak measured in the same process, compile seconds, and the seconds a member
cost beyond its compilation and its timed and warm-up steps), then one JSON line with
everything. `--tiny` runs the same suite on tiny shapes (1 layer of width 64, batch 2 x
length 32): what the tests run on a CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import queue
import subprocess
import sys
import threading
import time

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from bench.compare import peer_command
from core import cli
from core.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP_STEPS = 2  # bench.pretrain's warm-up steps before the timed ones


class SuiteError(UserError):
    """A suite that cannot run (one line)."""


@dataclasses.dataclass(frozen=True)
class Member:
    """One row of the suite: our step for these gin files at batch x seq."""

    name: str
    gin_files: tuple[str, ...]
    batch: int
    seq: int
    peer: bool = False  # also time HF Flax BERT at this shape
    bindings: tuple[str, ...] = ()  # gin bindings after the files (an ablation arm)


MEMBERS = (
    Member("bert_base_128", ("configs/models/bert_base.gin", "configs/recipes/bert.gin"), 256, 128, True),
    Member("bert_large_512", ("configs/models/bert_large.gin", "configs/recipes/bert.gin"), 32, 512, True),
    # What BERT's attention dropout costs: without it 'auto' takes the platform's fused kernel.
    Member(
        "bert_large_512_no_attention_dropout",
        ("configs/models/bert_large.gin", "configs/recipes/bert.gin"),
        32,
        512,
        bindings=("EncoderConfig.attention_dropout_rate = 0.0",),
    ),
    # BERT's attention dropout in our flash kernel (opt-in until this row beats bert_large_512).
    Member(
        "bert_large_512_flash",
        ("configs/models/bert_large.gin", "configs/recipes/bert.gin"),
        32,
        512,
        bindings=("EncoderConfig.attention_implementation = 'flash'",),
    ),
    Member(
        "roberta_large_512",
        ("configs/models/roberta_large.gin", "configs/recipes/roberta_large.gin"),
        32,
        512,
    ),
    Member(
        "albert_xxlarge_512", ("configs/models/albert_xxlarge.gin", "configs/recipes/albert.gin"), 32, 512
    ),
    Member(
        "electra_base_512", ("configs/models/electra_base.gin", "configs/recipes/electra_base.gin"), 32, 512
    ),
    Member(
        "spanbert_large_512", ("configs/models/spanbert_large.gin", "configs/recipes/spanbert.gin"), 32, 512
    ),
    Member(
        "deberta_v3_base_512",
        ("configs/models/deberta_v3_base.gin", "configs/recipes/deberta_v3.gin"),
        32,
        512,
    ),
    # Both streams and the recipe's 384 memory positions; 80 targets per row (bench.pretrain's
    # P at 512, where the recipe has 85).
    Member("xlnet_base_512", ("configs/models/xlnet_base.gin", "configs/recipes/xlnet.gin"), 32, 512),
)
# --tiny: every member's structure (objective, embeddings, attention kind) at a size a CPU
# compiles in seconds.
TINY_BINDINGS = (
    "EncoderConfig.num_layers = 1",
    "EncoderConfig.hidden_size = 64",
    "EncoderConfig.num_heads = 2",
    "EncoderConfig.intermediate_size = 128",
    "EncoderConfig.vocab_size = 512",
    "REUSE_LEN = 16",  # XLNet's reused part, within the tiny rows (a macro the others leave unread)
)
TINY_BATCH, TINY_SEQ = 2, 32


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
        "--timeout", type=float, default=300.0, help="seconds a member may take, its compilation included"
    )
    parser.add_argument(
        "--only",
        default=None,
        help=f"comma-separated members to run, of {', '.join(m.name for m in MEMBERS)}",
    )
    parser.add_argument(
        "--peer_python", default=".venv-peer/bin/python", help="python of the peer's virtualenv"
    )
    parser.add_argument("--tiny", action="store_true", help="tiny shapes: the suite's own test on a CPU")
    # Internal: the child process that runs the members it is given, one JSON line each.
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser


def _members(args) -> list[Member]:
    if args.only is None:
        return list(MEMBERS)
    by_name = {m.name: m for m in MEMBERS}
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SuiteError(f"--only: no member {', '.join(unknown)}; the suite has {', '.join(by_name)}")
    return [by_name[n] for n in names]


def _bench_argv(member: Member, args) -> list[str]:
    """bench.pretrain's command line for one member."""
    batch, seq = (TINY_BATCH, TINY_SEQ) if args.tiny else (member.batch, member.seq)
    argv = [f"--gin_file={g}" for g in member.gin_files]
    argv += [f"--gin_bindings={b}" for b in member.bindings + (TINY_BINDINGS if args.tiny else ())]
    return argv + [
        f"--batch_size={batch}",
        f"--seq_len={seq}",
        f"--steps={args.steps}",
        f"--dtype={args.dtype}",
    ]


# ----------------------------------------------------------------------------- the child


def _child(args) -> None:
    """Runs bench.pretrain's main for each named member in this process; prints one JSON line
    per member: {"member", "result"} or {"member", "error"}, and "wall_seconds"."""
    import gin

    from bench import pretrain

    by_name = {m.name: m for m in MEMBERS}
    for name in args.child.split(","):
        start = time.perf_counter()
        out, err = io.StringIO(), io.StringIO()
        gin.clear_config()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = pretrain.main(_bench_argv(by_name[name], args))
        except Exception as e:  # pylint: disable=broad-except  (one member's failure is its row)
            status, err = 1, io.StringIO(f"{type(e).__name__}: {e}")
        line = {"member": name, "wall_seconds": round(time.perf_counter() - start, 2)}
        lines = out.getvalue().strip().splitlines()
        if status == 0 and lines:
            line["result"] = json.loads(lines[-1])
        else:
            errors = [x for x in err.getvalue().splitlines() if x.strip()]
            line["error"] = errors[-1] if errors else f"exit status {status}"
        print(json.dumps(line), flush=True)


# ----------------------------------------------------------------------------- the parent


def _ours(members: list[Member], args) -> tuple[dict[str, dict], int]:
    """({member name: child's line}, child processes started), each member within --timeout
    seconds."""
    lines: dict[str, dict] = {}
    pending = [m.name for m in members]
    processes = 0
    while pending:
        processes += 1
        command = [sys.executable, "-m", "bench.suite", f"--child={','.join(pending)}"]
        command += [f"--steps={args.steps}", f"--dtype={args.dtype}"] + (["--tiny"] if args.tiny else [])
        child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results: queue.Queue = queue.Queue()
        stderr_tail: list[str] = []
        threading.Thread(target=_pump, args=(child.stdout, results.put), daemon=True).start()
        threading.Thread(target=_pump, args=(child.stderr, stderr_tail.append), daemon=True).start()
        while pending:
            name = pending[0]
            try:
                text = results.get(timeout=args.timeout)
            except queue.Empty:
                child.kill()
                lines[name] = {"member": name, "error": f"no result within {args.timeout:g} s: killed"}
                print(json.dumps(lines[name]), flush=True)
                pending.pop(0)
                break
            if text is None:  # the child died (out of memory, a crash in XLA ...)
                child.wait()
                tail = [x.strip() for x in stderr_tail if x and x.strip()]
                lines[name] = {
                    "member": name,
                    "error": f"the process died (status {child.returncode}): {tail[-1] if tail else ''}",
                }
                print(json.dumps(lines[name]), flush=True)
                pending.pop(0)
                break
            if not text.startswith("{"):
                continue
            line = json.loads(text)
            lines[line["member"]] = line
            print(json.dumps(line), flush=True)
            pending.remove(line["member"])
        child.wait()
    return lines, processes


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
        errors = [x for x in result.stderr.splitlines() if x.strip()]
        return {"error": errors[-1] if errors else f"exit status {result.returncode}"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def overhead_seconds(line: dict, steps: int) -> float:
    """What a member cost beyond its compilation and its warm-up and timed steps: imports
    (the first member), the peak measurement, building the state, host transfers."""
    result = line["result"]
    stepping = (WARMUP_STEPS + steps) * result["seconds_per_step"]
    return round(line["wall_seconds"] - result["compile_seconds"] - stepping, 2)


def attention_path(result: dict) -> str:
    """The attention path the member's train step took (bench.pretrain's `attention`)."""
    rate = result["config"]["attention_dropout_rate"]
    return f"{result['attention']}, dropout {rate:g}" if rate else result["attention"]


def _table(members: list[Member], ours: dict, peers: dict, args) -> str:
    rows = [
        "| member | batch x length | attention | tokens/s | MFU | compile s | overhead s | peer tokens/s "
        "| ours / peer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for member in members:
        line = ours[member.name]
        if "error" in line:
            rows.append(f"| {member.name} | | | {line['error']} | | | | | |")
            continue
        r = line["result"]
        peer = peers.get(member.name, {})
        peer_rate = (
            f"{peer['tokens_per_second']:.0f}"
            if "tokens_per_second" in peer
            else peer.get("note", peer.get("error", ""))
        )
        ratio = (
            f"{r['tokens_per_second'] / peer['tokens_per_second']:.2f}x"
            if "tokens_per_second" in peer
            else ""
        )
        rows.append(
            f"| {member.name} | {r['batch']} x {r['seq']} | {attention_path(r)} "
            f"| {r['tokens_per_second']:.0f} | {r['mfu']:.1%} | "
            f"{r['compile_seconds']:.1f} | {overhead_seconds(line, args.steps):.1f} | {peer_rate} | {ratio} |"
        )
    return "\n".join(rows)


def _run(args) -> None:
    if args.child:
        _child(args)
        return
    members = _members(args)
    start = time.perf_counter()
    ours, processes = _ours(members, args)
    peers = {}
    for member in members:
        if member.peer and "result" in ours[member.name]:
            peers[member.name] = {"member": member.name, **_peer(member, ours[member.name]["result"], args)}
            print(json.dumps({"peer": peers[member.name]}), flush=True)
    first = next((line["result"] for line in ours.values() if "result" in line), {})
    seconds = time.perf_counter() - start
    print(f"\n{len(members)} members, {args.dtype}, on {first.get('device', '?')}, in {seconds:.0f} s\n")
    print(_table(members, ours, peers, args))
    print(
        json.dumps(
            {
                "ours": [ours[m.name] for m in members],
                "peer": list(peers.values()),
                "child_processes": processes,
                "seconds": round(seconds, 1),
            }
        )
    )


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
