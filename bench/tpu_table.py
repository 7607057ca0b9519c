r"""The family's train steps compiled for a slice of each TPU generation, on this machine: the
table of docs/performance.md ("On TPU slices, compiled here").

    python -m bench.tpu_table [--slices=v4-32,v5litepod-16,v5p-64,v6e-16] [--only=bert_base_128,...] \
        [--meshes=data:-1,fsdp:-1] [--flash=all|NAME,...] [--rows_per_device=16] [--dtype=bfloat16] \
        [--out=rows.jsonl]

Each row is `python -m pretrain.tpu_compile` in a child process of its own (a libtpu crash
is that row's error, not the table's): a member of bench/suite_members.py (its model and
recipe gin files, at its length) on one slice, one mesh, with the recipe's attention or
with 'flash' (`--flash` adds those rows, on the first mesh, for the members named that take
it), at
min(the recipe's batch, rows_per_device x devices) rows per step (the recipe's batch is
`k` such steps, as run.microbatches would run them). The estimate columns are XLA's cost
model read from each compiled step (an estimate, not a measurement); for each member,
slice and attention path, the mesh with the lowest estimate among those that fit is
marked "favoured"; "tight": compiled, its buffers over the chip's usable HBM as the memory
analysis counts them (a row whose program has loops has a lower bound for an estimate, ">=",
and is not ranked). Every row's JSON line goes to --out; the markdown table is printed
last (`--from_rows=FILE` prints it again from such a file).
About 1-4 minutes of compilation per row on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from bench.suite_members import MEMBERS
from core import cli

# The rows' members: each family member once (the suite's flash and no-dropout variants are
# columns and options here).
TABLE_MEMBERS = tuple(m for m in MEMBERS if not m.bindings)
# Members with their own attention (no flash row): DeBERTa's disentangled, XLNet's relative.
OWN_ATTENTION = ("deberta", "xlnet")


def build_parser():
    parser = cli.parser(__doc__, "bench.tpu_table")
    parser.add_argument("--slices", default="v4-32,v5litepod-16,v5p-64,v6e-16", help="comma-separated slices")
    parser.add_argument("--only", default="", help="comma-separated member names (default: all)")
    parser.add_argument("--meshes", default="fsdp:-1", help="comma-separated meshes, each compiled")
    parser.add_argument(
        "--flash", default="", help="'all' or member names: also with attention_implementation 'flash'"
    )
    parser.add_argument(
        "--rows_per_device", type=cli.positive_int, default=16, help="rows per device per step, at most"
    )
    parser.add_argument("--dtype", default="bfloat16", help="EncoderConfig.dtype")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per row")
    parser.add_argument("--out", default=None, help="append every row's JSON line to this file")
    parser.add_argument(
        "--from_rows", default=None, help="print the table of a file of rows (--out's); compile nothing"
    )
    return parser


def _recipe(member) -> tuple[int, int]:
    """(the recipe's batch, the length P at the member's length): read from its gin files."""
    import gin

    from pretrain import trainer  # noqa: F401  (registers what the gin files bind)

    gin.clear_config()
    cli.parse_gin(member.gin_files, [])
    return gin.query_parameter("run.batch_size"), gin.query_parameter("PipelineConfig.max_seq_length")


def _row(member, slice_name: str, mesh: str, flash: bool, args) -> dict:
    from core import tpu_slices

    recipe_batch, recipe_length = _recipe(member)
    devices = tpu_slices.parse(slice_name).devices
    batch = min(recipe_batch, args.rows_per_device * devices)
    bindings = [f"EncoderConfig.dtype = '{args.dtype}'"]
    if member.seq != recipe_length:  # BERT-large at its second phase's length (bert_two_phase.gin)
        bindings += [
            f"PipelineConfig.max_seq_length = {member.seq}",
            "PipelineConfig.max_predictions_per_seq = 80",
        ]
    if flash:
        bindings.append("EncoderConfig.attention_implementation = 'flash'")
    argv = [sys.executable, "-m", "pretrain.tpu_compile", f"--topology={slice_name}", f"--mesh={mesh}"]
    argv += [f"--gin_file={f}" for f in member.gin_files] + [f"--gin_bindings={b}" for b in bindings]
    argv.append(f"--batch_size={batch}")
    row = {
        "member": member.name,
        "slice": slice_name,
        "mesh_spec": mesh,
        "flash": flash,
        "recipe_batch": recipe_batch,
    }
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"no result within {args.timeout:g} s"}
    lines = done.stdout.strip().splitlines()
    if lines and lines[-1].startswith("["):
        (result,) = json.loads(lines[-1])
        return {**row, **result}
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    return {
        **row,
        "error": errors[-1] if errors else f"exit status {done.returncode}: {done.stderr.strip()[-300:]}",
    }


def _collectives(row: dict) -> str:
    short = {
        "all-gather": "AG",
        "all-reduce": "AR",
        "reduce-scatter": "RS",
        "all-to-all": "A2A",
        "collective-permute": "CP",
    }
    parts = []
    for kind, c in row["collectives"].items():
        parts.append(f"{short.get(kind, kind)} {c['count']} / {c['bytes'] / 2**30:.2f}")
    return ", ".join(parts)


def _lower_bound(row: dict) -> bool:
    """The row's estimate leaves work out (a loop body priced once, a kernel priced 0:
    core/compiled_program.py): a lower bound."""
    return bool(row["xla_estimate"]["blind_spots"])


def _favoured(rows: list[dict]) -> set[int]:
    """Indices of the rows whose mesh the estimate favours: for each member, slice and path
    compiled on several meshes, the lowest complete estimate among those that fit."""
    best: dict[tuple, tuple[float, int]] = {}
    meshes: dict[tuple, set[str]] = {}
    for i, r in enumerate(rows):
        key = (r["member"], r["slice"], r["flash"])
        meshes.setdefault(key, set()).add(r["mesh_spec"])
        seconds = (r.get("xla_estimate") or {}).get("seconds")
        if "error" not in r and r["fits"] and seconds and not _lower_bound(r):
            best[key] = min(best.get(key, (float("inf"), -1)), (seconds, i))
    return {i for key, (_, i) in best.items() if len(meshes[key]) > 1}


def table(rows: list[dict]) -> str:
    """The markdown table of the rows' JSON lines."""
    favoured = _favoured(rows)
    out = [
        "| member | slice | mesh | rows per step (recipe's) | attention | fits | "
        "buffers per chip, GiB (of usable) | estimated ms per step | estimated MFU | "
        "collectives (count / GiB per chip) | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows):
        head = f"| {r['member']} | {r['slice']} | {r['mesh_spec']}{' (favoured)' if i in favoured else ''} | "
        if "hbm_bytes_per_device" not in r:
            attention = "flash" if r["flash"] else ""
            needs = re.search(
                r"it needs ([\d.]+ GiB) of HBM per chip and the compiler has ([\d.]+ GiB)", r["error"]
            )
            why = f"refused by the compiler: needs {needs[1]}, has {needs[2]}" if needs else r["error"]
            out.append(head + f"({r['recipe_batch']}) | {attention} | no | {why} | | | | |")
            continue
        estimate = r["xla_estimate"]
        bound = ">= " if _lower_bound(r) else ""
        ms = f"{bound}{1e3 * estimate['seconds']:.1f}" if estimate["seconds"] else "none"
        mfu = f"{'<= ' if bound else ''}{100 * estimate['mfu']:.1f}%" if estimate["mfu"] else ""
        memory = f"{r['buffer_bytes_per_device'] / 2**30:.2f} ({r['usable_hbm_bytes'] / 2**30:.2f})"
        out.append(
            head
            + f"{r['batch']} ({r['recipe_batch']}) | {r['attention']} | {'yes' if r['fits'] else 'tight'} | "
            f"{memory} | {ms} | {mfu} | {_collectives(r)} | {r['compile_seconds']:.0f} |"
        )
    return "\n".join(out)


def _run(args) -> None:
    if args.from_rows:
        with open(args.from_rows) as f:
            print(table([json.loads(line) for line in f if line.strip()]))
        return
    members = [m for m in TABLE_MEMBERS if not args.only or m.name in args.only.split(",")]
    rows = []
    for member in members:
        meshes = args.meshes.split(",")
        runs = [(mesh, False) for mesh in meshes]
        named = args.flash == "all" or member.name in args.flash.split(",")
        if named and not member.name.startswith(OWN_ATTENTION):
            runs.append((meshes[0], True))
        for slice_name in args.slices.split(","):
            for mesh, flash in runs:
                row = _row(member, slice_name, mesh, flash, args)
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
                rows.append(row)
    print(table(rows))


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main())
