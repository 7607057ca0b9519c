"""Runs every arm of an ablation grid with the same data, seed and token budget, and compares them.

    python -m pretrain.ablate configs/ablations/sentence_objective --workdir=DIR \
        --data_dir=SHARDS [--gin_file=configs/runs/demo.gin] [--steps=N] [--gin_bindings=...]

A grid is a folder of gin files, one per arm, each holding only what the arm changes
(e.g. `PipelineConfig.sentence_objective = 'sop'`). Every arm trains with `pretrain.train` in its
own process on `--gin_file` (the shared base run, default the demo run) + the arm file +
`run.data_dir`, `EncoderConfig.vocab_size` (from the shards' manifest) and `run.steps`,
with the base run's seeds, into DIR/<arm>. An arm
whose summary.json shows it finished is skipped, and an interrupted one resumes, so
running the command again completes a grid. Arms must see the same number of training
tokens (batch_size x max_seq_length x steps): a grid whose arms differ is refused.

Writes DIR/results.md (one row per arm: every held-out metric the arms' objectives
evaluate, e.g. MLM loss and accuracy and the sentence accuracy on the arm's own sentence
task, and the arm's training tokens/s) and DIR/eval_curves.png (the objective's headline
metric and the loss, held out, vs step, for every arm).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli
from core.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class AblationError(UserError):
    """A grid that cannot be run as asked (one line)."""


def grid_arms(grid: str) -> dict[str, str]:
    """{arm name: gin file} of a grid folder, sorted by name."""
    files = sorted(glob.glob(os.path.join(grid, "*.gin")))
    if not files:
        raise AblationError(f"no *.gin arm files in '{grid}': pass a folder under configs/ablations/")
    return {os.path.splitext(os.path.basename(f))[0]: f for f in files}


def arm_budget(gin_files: list[str], bindings: list[str]) -> dict[str, int]:
    """steps, batch_size, max_seq_length and their product (tokens) of one arm's config."""
    import gin

    from data.pipeline import PipelineConfig
    from pretrain import trainer  # noqa: F401  (registers what the run files bind)

    gin.clear_config()
    cli.parse_gin(gin_files, bindings)

    steps = gin.query_parameter("run.steps")
    batch = gin.query_parameter("run.batch_size")
    seq = PipelineConfig().max_seq_length
    gin.clear_config()
    return {"steps": steps, "batch_size": batch, "max_seq_length": seq, "tokens": steps * batch * seq}


def run_arm(name: str, gin_files: list[str], workdir: str, bindings: list[str]) -> dict:
    """Trains (or resumes, or skips) one arm in its own process; returns its summary."""
    summary_path = os.path.join(workdir, "summary.json")
    wanted_steps = next(int(b.split("=")[1]) for b in bindings if b.startswith("run.steps="))
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
        if summary.get("step") == wanted_steps:
            print(f"{name}: finished before, skipped", flush=True)
            return summary
    command = [sys.executable, "-m", "pretrain.train", f"--workdir={workdir}"]
    command += [f"--gin_file={g}" for g in gin_files]
    command += [f"--gin_bindings={b}" for b in bindings]
    print(f"{name}: training ({' '.join(command[2:])})", flush=True)
    result = subprocess.run(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        raise AblationError(f"arm {name} failed: {errors[-1] if errors else result.stderr[-2000:]}")
    with open(summary_path) as f:
        return json.load(f)


def eval_curve(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == "eval"]


def write_results(directory: str, grid: str, summaries: dict[str, dict], steps: int) -> str:
    """DIR/results.md and DIR/eval_curves.png; returns the markdown table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def fmt(value, pattern="{:.4f}"):
        return "-" if value is None else pattern.format(value)

    # Every held-out metric some arm evaluates, the loss first (an arm without a sentence
    # task shows "-" in its columns).
    metrics = list(dict.fromkeys(m for s in summaries.values() for m in s["eval"]))
    metrics.sort(key=lambda m: m != "loss")
    lines = [
        f"Grid `{grid}`, {steps} steps per arm, same data, seed and tokens per arm; held-out metrics.",
        "",
        "| arm | " + " | ".join(metrics) + " | tokens/s |",
        "|---|" + "---|" * (len(metrics) + 1),
    ]
    for name, s in summaries.items():
        values = [fmt(s["eval"].get(m)) for m in metrics]
        lines.append(
            f"| {name} | " + " | ".join(values) + f" | {fmt(s.get('tokens_per_second'), '{:.0f}')} |"
        )
    table = "\n".join(lines) + "\n"
    with open(os.path.join(directory, "results.md"), "w") as f:
        f.write(table)

    headline = next(iter(summaries.values()))["headline_metric"]
    fig, (acc, loss) = plt.subplots(1, 2, figsize=(10, 4))
    for name in summaries:
        curve = eval_curve(os.path.join(directory, name))
        acc.plot([r["step"] for r in curve], [r.get(headline) for r in curve], marker="o", label=name)
        loss.plot([r["step"] for r in curve], [r["loss"] for r in curve], marker="o", label=name)
    acc.set(xlabel="step", ylabel=f"held-out {headline}", title=os.path.basename(grid.rstrip("/")))
    loss.set(xlabel="step", ylabel="held-out loss")
    acc.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "eval_curves.png"), dpi=100)
    plt.close(fig)
    return table


def build_parser():
    parser = cli.parser(__doc__, "pretrain.ablate")
    parser.add_argument("grid", help="a folder of arm gin files, e.g. configs/ablations/sentence_objective")
    parser.add_argument("--workdir", required=True, help="one subfolder per arm, and the results")
    parser.add_argument("--data_dir", required=True, help="shards (data.preprocess) every arm reads")
    cli.add_gin_flags(parser, default_files=["configs/runs/demo.gin"])
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps of every arm (default: the base run's)"
    )
    return parser


def _run(args) -> None:
    from data import shards

    cli.setup_logging()
    arms = grid_arms(args.grid)
    base = cli.gin_files(args)
    vocab_size = shards.load_manifest(args.data_dir).vocab_size
    shared = [f"run.data_dir='{args.data_dir}'", f"EncoderConfig.vocab_size={vocab_size}", *args.gin_bindings]
    steps = [f"run.steps={args.steps}"] if args.steps is not None else []
    budgets = {name: arm_budget([*base, f], shared + steps) for name, f in arms.items()}
    if len({b["tokens"] for b in budgets.values()}) > 1:
        raise AblationError(
            "arms see different numbers of training tokens (steps x batch x length): "
            + ", ".join(f"{n} {b['tokens']}" for n, b in budgets.items())
            + "; make the arms' batch_size x max_seq_length x steps equal"
        )
    os.makedirs(args.workdir, exist_ok=True)
    summaries = {}
    for name, arm_file in arms.items():
        bindings = [*shared, f"run.steps={budgets[name]['steps']}"]
        summaries[name] = run_arm(name, [*base, arm_file], os.path.join(args.workdir, name), bindings)
    steps = next(iter(budgets.values()))["steps"]
    print(write_results(args.workdir, args.grid, summaries, steps))
    print(f"results: {args.workdir}/results.md, {args.workdir}/eval_curves.png")


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
