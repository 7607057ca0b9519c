r"""Runs every arm of an ablation grid with the same data, seed and token budget, and compares them.

    python -m pretrain.ablate configs/ablations/sentence_objective --workdir=DIR \
        --data_dir=SHARDS [--gin_file=configs/runs/demo.gin] [--steps=N] [--gin_bindings=...]

A grid is a folder of gin files, one per arm, each holding only what the arm changes
(e.g. `PipelineConfig.sentence_objective = 'sop'`). Every arm trains with `pretrain.train` in its
own process on `--gin_file` (the shared base run; default the grid's base.txt, a gin file its
arms are written for, e.g. XLNet's, else the demo run) + the arm file +
`run.data_dir`, `EncoderConfig.vocab_size` (from the shards' manifest) and `run.steps`,
with the base run's seeds, into DIR/<arm>. An arm
whose summary.json shows it finished is skipped, and an interrupted one resumes, so
running the command again completes a grid.

What the arms share (`--budget`, default the grid's budget.txt, else tokens): "tokens":
the same batch_size x max_seq_length x steps (a grid whose arms differ is refused);
"flops": the same model training FLOPs (core/flops.py), the costliest arm training
`--steps` and the others proportionally more (configs/ablations/electra_vs_mlm: ELECTRA's
claim is per FLOP). `--finetune_gin=configs/glue/demo.gin` then fine-tunes every arm on
the offline GLUE demo task (finetune/demo_task.py) into DIR/<arm>_glue.

Writes DIR/results.md (one row per arm: steps, training FLOPs by our count and by the
ELECTRA paper's flops_computation.py, every held-out metric the arms' objectives
evaluate, e.g. MLM loss and accuracy and the sentence accuracy on the arm's own sentence
task, the arm's training tokens/s, and the demo task's median dev score when fine-tuned)
and DIR/eval_curves.png (the first arm's headline metric and the loss, held out, vs step).
`--cross_eval` adds a table of every arm's model on every arm's held-out rows (masked-LM
accuracy, pretrain/cross_eval.py): the arms of a masking grid compared on the same rows.
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
BUDGETS = ("tokens", "flops")


class AblationError(UserError):
    """A grid that cannot be run as asked (one line)."""


def grid_arms(grid: str) -> dict[str, str]:
    """{arm name: gin file} of a grid folder, sorted by name."""
    files = sorted(glob.glob(os.path.join(grid, "*.gin")))
    if not files:
        raise AblationError(f"no *.gin arm files in '{grid}': pass a folder under configs/ablations/")
    return {os.path.splitext(os.path.basename(f))[0]: f for f in files}


def arm_budget(gin_files: list[str], bindings: list[str]) -> dict[str, float]:
    """One arm's steps, batch_size, max_seq_length, tokens (their product), and model FLOPs per
    step: ours (core/flops.py, `flops_per_step`) and, where the objective defines it, the
    count of the ELECTRA paper's flops_computation.py (`paper_flops_per_step`)."""
    import gin

    from data.pipeline_config import PipelineConfig
    from models.encoder import EncoderConfig
    from pretrain import trainer  # noqa: F401  (registers what the run files bind)
    from pretrain.objectives import make_objective

    gin.clear_config()
    cli.parse_gin(gin_files, bindings)
    steps = gin.query_parameter("run.steps")
    batch = gin.query_parameter("run.batch_size")
    data = PipelineConfig()
    objective = make_objective(EncoderConfig(), data)
    seq, predictions = data.max_seq_length, data.max_predictions_per_seq
    paper = objective.paper_flops_per_row(seq, predictions)
    gin.clear_config()
    return {
        "steps": steps,
        "batch_size": batch,
        "max_seq_length": seq,
        "tokens": steps * batch * seq,
        "flops_per_step": batch * objective.flops_per_row(seq, predictions),
        "paper_flops_per_step": None if paper is None else batch * paper,
    }


def equalize(budgets: dict[str, dict], budget: str, steps: int | None) -> dict[str, int]:
    """{arm: training steps}. "tokens": every arm its configured steps (or `steps`), and the
    arms must see the same tokens. "flops": the arm with the most FLOPs per step trains
    `steps` (default: its configured steps) and every other arm as many steps as spend the
    same model FLOPs (rounded; within half a step of theirs)."""
    if budget == "tokens":
        if len({b["tokens"] for b in budgets.values()}) > 1:
            raise AblationError(
                "arms see different numbers of training tokens (steps x batch x length): "
                + ", ".join(f"{n} {b['tokens']}" for n, b in budgets.items())
                + "; make the arms' batch_size x max_seq_length x steps equal"
            )
        return {name: b["steps"] for name, b in budgets.items()}
    costliest = max(budgets.values(), key=lambda b: b["flops_per_step"])
    total = (steps or costliest["steps"]) * costliest["flops_per_step"]
    return {name: max(1, round(total / b["flops_per_step"])) for name, b in budgets.items()}


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
    command = ["pretrain.train", f"--workdir={workdir}"]
    command += [f"--gin_file={g}" for g in gin_files]
    command += [f"--gin_bindings={b}" for b in bindings]
    run_tool(f"{name}: training", command, f"{workdir}.stderr.log")
    with open(summary_path) as f:
        return json.load(f)


def run_tool(what: str, command: list[str], log: str) -> None:
    """`python -m COMMAND...` in its own process from the repository root. On failure its
    stderr goes to `log` and the error names its `error:` line (or its exit status)."""
    print(f"{what} ({' '.join(command)})", flush=True)
    result = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        with open(log, "w") as f:
            f.write(result.stderr)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        reason = errors[-1] if errors else f"exit status {result.returncode}"
        raise AblationError(f"{what} failed ({reason}); its output is in {log}")


def eval_curve(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == "eval"]


def finetune_demo(workdir: str, glue_dir: str, gin_file: str) -> dict:
    """Fine-tunes one arm's model on the offline GLUE demo task (finetune/demo_task.py) in
    its own process, into ARM_glue/; returns its results.json (`tasks.word_order`)."""
    out = f"{workdir}_glue"
    command = ["finetune.glue", f"--init_from={workdir}", "--tasks=word_order"]
    command += [f"--glue_dir={glue_dir}", f"--workdir={out}", f"--gin_file={gin_file}"]
    run_tool(f"{os.path.basename(workdir)}: fine-tuning", command, f"{out}.stderr.log")
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def write_results(
    directory: str,
    grid: str,
    summaries: dict[str, dict],
    budgets: dict[str, dict],
    budget: str,
    finetuned: dict[str, dict] | None = None,
) -> str:
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
    same = "tokens" if budget == "tokens" else "model FLOPs (core/flops.py)"
    columns = ["steps", "train FLOPs", "paper's count", *metrics, "tokens/s"]
    if finetuned:
        columns.append("demo task dev (median)")
    lines = [
        f"Grid `{grid}`: same data and seed, the same {same} per arm; held-out metrics of each "
        "arm's own objective. Training FLOPs by our count (core/flops.py) and by the ELECTRA "
        "paper's flops_computation.py.",
        "",
        "| arm | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for name, s in summaries.items():
        b = budgets[name]
        paper = b["paper_flops_per_step"]
        values = [
            str(s["step"]),
            fmt(s["step"] * b["flops_per_step"], "{:.3e}"),
            fmt(None if paper is None else s["step"] * paper, "{:.3e}"),
            *[fmt(s["eval"].get(m)) for m in metrics],
            fmt(s.get("tokens_per_second"), "{:.0f}"),
        ]
        if finetuned:
            values.append(fmt(finetuned[name]["tasks"]["word_order"]["score_median"]))
        lines.append(f"| {name} | " + " | ".join(values) + " |")
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
        "--steps",
        type=cli.positive_int,
        default=None,
        help="training steps of every arm (budget flops: of the costliest arm); default: the base run's",
    )
    parser.add_argument(
        "--budget",
        choices=BUDGETS,
        default=None,
        help="what the arms share: 'tokens' (steps x batch x length) or 'flops' (model FLOPs: "
        "cheaper arms train more steps); default: the grid folder's budget.txt, else tokens",
    )
    parser.add_argument(
        "--cross_eval",
        action="store_true",
        help="also evaluate every arm's model on every arm's held-out rows (masked-LM accuracy; "
        "for arms that mask differently: pretrain/cross_eval.py)",
    )
    parser.add_argument(
        "--finetune_gin",
        default=None,
        help="also fine-tune every arm on the offline GLUE demo task with this grid "
        "(e.g. configs/glue/demo.gin) and report its dev score",
    )
    return parser


def grid_budget(grid: str, flag: str | None) -> str:
    """The --budget flag, else the grid's budget.txt ("tokens" or "flops"), else "tokens"."""
    if flag:
        return flag
    path = os.path.join(grid, "budget.txt")
    if not os.path.exists(path):
        return "tokens"
    with open(path) as f:
        value = f.read().strip()
    if value not in BUDGETS:
        raise AblationError(f"{path} says {value!r}: write one of {BUDGETS}")
    return value


def grid_base(grid: str) -> list[str] | None:
    """The base run the grid's arms are written for: its base.txt (one gin file), else None
    (any base run: the tool's default, the demo run)."""
    path = os.path.join(grid, "base.txt")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        base = f.read().strip()
    if not os.path.exists(os.path.join(ROOT, base)) and not os.path.exists(base):
        raise AblationError(f"{path} names {base!r}, which does not exist: write a gin file's path")
    return [base]


def _run(args) -> None:
    from data import shards

    cli.setup_logging()
    arms = grid_arms(args.grid)
    base = args.gin_file if args.gin_file is not None else grid_base(args.grid) or cli.gin_files(args)
    vocab_size = shards.load_manifest(args.data_dir).vocab_size
    shared = [f"run.data_dir='{args.data_dir}'", f"EncoderConfig.vocab_size={vocab_size}", *args.gin_bindings]
    budget = grid_budget(args.grid, args.budget)
    steps = [f"run.steps={args.steps}"] if args.steps is not None and budget == "tokens" else []
    budgets = {name: arm_budget([*base, f], shared + steps) for name, f in arms.items()}
    arm_steps = equalize(budgets, budget, args.steps)
    os.makedirs(args.workdir, exist_ok=True)
    summaries, arm_runs = {}, {}
    for name, arm_file in arms.items():
        arm_runs[name] = ([*base, arm_file], [*shared, f"run.steps={arm_steps[name]}"])
    if args.cross_eval:  # before any training: an arm that cannot take part is one line now
        from pretrain import cross_eval

        evaluated = {n: cross_eval.arm(os.path.join(args.workdir, n), *run) for n, run in arm_runs.items()}
    for name, (gin_files, bindings) in arm_runs.items():
        summaries[name] = run_arm(name, gin_files, os.path.join(args.workdir, name), bindings)
    finetuned = None
    if args.finetune_gin:
        glue_dir = os.path.join(args.workdir, "glue_data")
        if not os.path.exists(os.path.join(glue_dir, "WordOrder", "dev.tsv")):
            run_tool("demo task", ["finetune.demo_task", f"--output={glue_dir}"], f"{glue_dir}.stderr.log")
        finetuned = {
            name: finetune_demo(os.path.join(args.workdir, name), glue_dir, args.finetune_gin)
            for name in arms
        }
    table = write_results(args.workdir, args.grid, summaries, budgets, budget, finetuned)
    if args.cross_eval:
        cross = cross_eval.table(args.data_dir, evaluated)
        with open(os.path.join(args.workdir, "results.md"), "a") as f:
            f.write("\n" + cross)
        table += "\n" + cross
    print(table)
    print(f"results: {args.workdir}/results.md, {args.workdir}/eval_curves.png")


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
