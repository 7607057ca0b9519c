r"""Ours vs the peer (HF Flax BERT), side by side in one run, as ratios; what `make bench` runs.

    python -m bench.compare --gin_file=configs/models/bert_base.gin --batch_size=32 --seq_len=128 \
        [--dtypes=float32,bfloat16] [--steps=5] [--peer_python=.venv-peer/bin/python] \
        [--optimisations]

For each dtype it runs bench/pretrain.py (this venv) and then bench/peer_hf.py (the
peer's venv, same model config, batch, rows and masked positions) as separate
processes one after the other, then bench/input_pipeline.py once. Prints a markdown
table (tokens/s, model TFLOP/s, MFU against the matmul peak each process measured,
peak memory, ours/peer ratio) and, last, one JSON line with every result.

`--optimisations` also times ours with and without each optimisation, the two
alternating in one process (bench/pretrain.py --without=X --paired, in the first
dtype, so drift on a shared machine cancels), and prints what each buys, beside bf16
vs float32 from the main table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from bench.pretrain import OPTIMISATIONS
from core import cli
from core.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BenchError(UserError):
    """A benchmark that cannot run (one line)."""


def build_parser():
    parser = cli.parser(__doc__, "bench.compare")
    cli.add_gin_flags(
        parser, default_files=["configs/models/bert_base.gin"], example="EncoderConfig.num_layers = 6"
    )
    batch_size = parser.add_argument(
        "--batch_size", type=cli.positive_int, default=32, help="global batch (rows)"
    )
    seq_len = parser.add_argument("--seq_len", type=cli.positive_int, default=128, help="sequence length")
    parser.add_argument(
        "--dtypes", default="float32,bfloat16", help="compute dtypes to compare, comma-separated"
    )
    parser.add_argument("--steps", type=cli.positive_int, default=5, help="timed steps per run")
    parser.add_argument(
        "--peer_python", default=".venv-peer/bin/python", help="python of the peer's virtualenv"
    )
    parser.add_argument(
        "--optimisations", action="store_true", help="also measure each optimisation on its own"
    )
    cli.hidden_alias(parser, "--batch", batch_size)
    cli.hidden_alias(parser, "--seq", seq_len)
    return parser


def _last_json(command: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one real device, as users run
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        raise BenchError(f"{' '.join(command[:3])} failed: {errors[-1] if errors else result.stderr[-3000:]}")
    line = result.stdout.strip().splitlines()[-1]
    print(line, file=sys.stderr, flush=True)  # progress: each run takes minutes on a CPU
    return json.loads(line)


def peer_command(peer_python: str, ours: dict, steps: int) -> list[str]:
    """bench.peer_hf's command line for the peer at the batch, length, masked positions,
    dtype and model config of our result line `ours`: both sides train the same thing."""
    return [
        peer_python,
        "-m",
        "bench.peer_hf",
        f"--model={json.dumps(ours['config'])}",
        f"--batch_size={ours['batch']}",
        f"--seq_len={ours['seq']}",
        f"--num_predictions={ours['predictions']}",
        f"--dtype={ours['dtype']}",
        f"--steps={steps}",
    ]


def _run(args) -> None:
    if not os.path.exists(os.path.join(ROOT, args.peer_python)):
        raise BenchError(f"no peer virtualenv at {args.peer_python}: run `make bench-peer-venv` first")
    gin_files = cli.gin_files(args)
    shape = [f"--batch_size={args.batch_size}", f"--seq_len={args.seq_len}", f"--steps={args.steps}"]
    ours_command = [
        sys.executable,
        "-m",
        "bench.pretrain",
        *(f"--gin_file={g}" for g in gin_files),
        *(f"--gin_bindings={b}" for b in args.gin_bindings),
        *shape,
    ]
    rows = []
    for dtype in args.dtypes.split(","):
        ours = _last_json([*ours_command, f"--dtype={dtype}"])
        peer = _last_json(peer_command(args.peer_python, ours, args.steps))
        rows.append((dtype, ours, peer))
    pipeline = _last_json(
        [
            sys.executable,
            "-m",
            "bench.input_pipeline",
            f"--batch_size={args.batch_size}",
            f"--seq_len={args.seq_len}",
        ]
    )

    print(f"\n{', '.join(gin_files)}, batch {args.batch_size} x {args.seq_len}, on {rows[0][1]['device']}\n")
    print("| dtype | code | tokens/s | model TFLOP/s | MFU (measured peak) | peak memory GB | ours / peer |")
    print("|---|---|---|---|---|---|---|")
    for dtype, ours, peer in rows:
        ratio = ours["tokens_per_second"] / peer["tokens_per_second"]
        for result, shown in ((ours, f"{ratio:.2f}x"), (peer, "")):
            print(
                f"| {dtype} | {result['name']} | {result['tokens_per_second']:.0f} | "
                f"{result['model_tflops_per_second']:.3f} | {result['mfu']:.1%} of "
                f"{result['peak_tflops_per_second']:.3f} | "
                f"{result['peak_memory_bytes'] / 1e9:.2f} | {shown} |"
            )
    consumed = max(ours["tokens_per_second"] for _, ours, _ in rows)
    print(
        f"\ninput pipeline alone: {pipeline['examples_per_second']:.0f} examples/s, "
        f"{pipeline['tokens_per_second'] / consumed:.0f}x the tokens/s the fastest step consumes"
    )
    optimisations = _optimisations(ours_command, rows) if args.optimisations else []
    print(
        json.dumps(
            {
                "results": [{"dtype": d, "ours": o, "peer": p} for d, o, p in rows],
                "input_pipeline": pipeline,
                "optimisations": optimisations,
            }
        )
    )


def _optimisations(ours_command: list[str], rows: list) -> list[dict]:
    """Times ours with and without each optimisation, alternating in one process
    (bench/pretrain.py --paired), in the first dtype; prints and returns the ratios."""
    dtype = rows[0][0]
    variants = [(name, [f"--without={name}"]) for name in OPTIMISATIONS]
    # These add a change to the default step instead of removing one.
    added = {
        "fused attention (no attention dropout)": ["--fused_attention"],
        "dropout masks from rbg instead of threefry": ["--dropout_prng=rbg"],
        "layers as one lax.scan (`scan_layers`)": ["--scan_layers"],
    }
    variants.extend(added.items())
    measured = []
    for name, flags_ in variants:
        result = _last_json([*ours_command, f"--dtype={dtype}", *flags_, "--paired", "--rounds=2"])
        ratio = result["variant_over_default"]
        variant = (result["seconds_per_step"], result["compile_seconds"])
        default = (result["default_seconds_per_step"], result["default_compile_seconds"])
        if name in added:
            ratio, without, with_ = 1 / ratio, default, variant
        else:
            without, with_ = variant, default
        measured.append(
            {
                "optimisation": name,
                "seconds_without": without[0],
                "seconds_with": with_[0],
                "ratio": ratio,
                "compile_seconds_without": without[1],
                "compile_seconds_with": with_[1],
            }
        )
    by_dtype = {d: o for d, o, _ in rows}
    if "float32" in by_dtype and "bfloat16" in by_dtype:  # separate processes, from the table above
        f32, bf16 = by_dtype["float32"]["seconds_per_step"], by_dtype["bfloat16"]["seconds_per_step"]
        measured.append(
            {
                "optimisation": "bf16 compute",
                "seconds_without": f32,
                "seconds_with": bf16,
                "ratio": f32 / bf16,
                "compile_seconds_without": by_dtype["float32"]["compile_seconds"],
                "compile_seconds_with": by_dtype["bfloat16"]["compile_seconds"],
            }
        )
    print(f"\nEach optimisation on its own ({dtype} unless named), with and without it in one process\n")
    print("| optimisation | s/step without | s/step with | speed-up | compile s without | compile s with |")
    print("|---|---|---|---|---|---|")
    for m in measured:
        seconds = f"{m['seconds_without']:.3f} | {m['seconds_with']:.3f} | {m['ratio']:.2f}x"
        compile_ = f"{m['compile_seconds_without']:.1f} | {m['compile_seconds_with']:.1f}"
        print(f"| {m['optimisation']} | {seconds} | {compile_} |")
    return measured


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
