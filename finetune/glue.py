r"""GLUE: fine-tune a pretrained workdir on the tasks, evaluate, write a leaderboard submission.

    python -m finetune.glue --init_from=WORKDIR --tasks=all|cola,sst2,... \
        (--glue_dir=DIR | --tfds) --workdir=OUT [--gin_file=configs/glue/bert.gin] \
        [--gin_bindings='Grid.seeds=(0,1,2)'] [--mesh=data:4,fsdp:2,tensor:1]

`--init_from` is a pretraining workdir (model_config.json, tokenizer/, checkpoints/;
core/workdir.py). Started again with the same `--workdir`, finished runs are read
back, not trained again. Writes into OUT:

    results.json      per task: dev metrics (medians over seeds of the chosen configuration),
                      examples read, every configuration with its per-seed values
    results.md        the table, with the GLUE score beside published BERT-base / RoBERTa-base
    CoLA.tsv ... AX.tsv, submission.zip   the leaderboard files (AX from the MNLI model)
    runs/<task>/<configuration>/seed_<s>/   one finished run each
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli

if TYPE_CHECKING:  # for annotations only: the functions import what they use, so `--help` loads no JAX
    from core.sharding import Partitioner
    from finetune.sweep import Grid, SweepResult
    from finetune.tasks import Example, Task, TaskData
    from finetune.trainer import Features
    from interop.bundle import Pretrained

log = logging.getLogger("finetune")


def run_glue(
    init_from: str,
    tasks_spec: str,
    workdir: str,
    *,
    glue_dir: str | None = None,
    use_tfds: bool = False,
    tfds_data_dir: str | None = None,
    mesh_spec: str | None = None,
) -> dict[str, Any]:
    """Fine-tunes and evaluates every task; writes the outputs; returns results.json's content."""
    import jax

    from core import lease, sharding
    from finetune import metrics, submission, tasks
    from interop import bundle

    if (glue_dir is None) == (not use_tfds):
        raise tasks.GlueDataError("pass exactly one of --glue_dir=DIR (official TSV folders) and --tfds")
    selected = tasks.parse_tasks(tasks_spec)
    start = time.time()
    setting = _Setting(
        pretrained=bundle.load_pretrained(init_from),
        partitioner=sharding.Partitioner.create(mesh_spec),
        workdir=workdir,
        main_process=jax.process_index() == 0,
    )
    with lease.held(workdir, "finetune.glue"):  # one run per workdir (core/lease.py)
        read = functools.partial(
            _read_task, glue_dir=glue_dir, use_tfds=use_tfds, tfds_data_dir=tfds_data_dir
        )
        diagnostic = read(tasks.TASKS["ax"]) if "ax" in [t.name for t in selected] else None
        results: dict[str, Any] = {}
        submissions: list[str] = []
        for task in selected:
            if task.name == "ax":
                continue  # predicted with the MNLI model (_test_sets)
            results[task.name] = _finetune_task(task, read(task), diagnostic, setting)
            submissions += results[task.name]["submission_files"]

        summary = {
            "init_from": init_from,
            "pretrained_step": setting.pretrained.step,
            "source": "tfds" if use_tfds else glue_dir,
            "glue_score": metrics.glue_score(
                {name: entry["score_median"] for name, entry in results.items()}
            ),
            "glue_score_tasks": list(results),
            "tasks": results,
            "submission_files": submissions,
            "submission_complete": set(submission.SUBMISSION_FILES) <= set(submissions),
            "wall_seconds": time.time() - start,
        }
        if setting.main_process:
            _write_summary(workdir, summary)
        return summary


@dataclasses.dataclass(frozen=True)
class _Setting:
    """What every task's fine-tuning shares: the pretrained model, the mesh, where outputs go
    and whether this process writes them (the first host)."""

    pretrained: Pretrained
    partitioner: Partitioner
    workdir: str
    main_process: bool


@dataclasses.dataclass(frozen=True)
class _TestSets:
    """The test files one task's model predicts, by file stem: their rows, the task whose
    labels they take and their leaderboard file names. MNLI's model also predicts AX."""

    rows: dict[str, list[Example]]
    tasks: dict[str, Task]
    file_names: dict[str, str]


def _read_task(task: Task, *, glue_dir: str | None, use_tfds: bool, tfds_data_dir: str | None) -> TaskData:
    from finetune import tasks

    log.info("reading %s", task.name)
    return tasks.read_tfds(task, tfds_data_dir) if use_tfds else tasks.read_glue_dir(glue_dir, task)


def _test_sets(task: Task, data: TaskData, diagnostic: TaskData | None) -> _TestSets:
    """The task's test files, and AX's with MNLI when AX was asked for (`diagnostic`)."""
    from finetune import tasks

    test_sets = _TestSets(
        rows=dict(data.test),
        tasks={stem: task for stem in data.test},
        file_names=dict(zip(task.test_files, task.submission_names)),
    )
    if task.name == "mnli" and diagnostic is not None:
        ax = tasks.TASKS["ax"]
        test_sets.rows.update(diagnostic.test)
        test_sets.tasks.update({stem: ax for stem in diagnostic.test})
        test_sets.file_names.update(zip(ax.test_files, ax.submission_names))
    return test_sets


def _finetune_task(
    task: Task, data: TaskData, diagnostic: TaskData | None, setting: _Setting
) -> dict[str, Any]:
    """Sweeps the task's grid (finished runs are read back), writes its leaderboard files and
    returns its entry of results.json."""
    from finetune import sweep, trainer

    grid = sweep.task_grid(task)
    test_sets = _test_sets(task, data, diagnostic)
    features = functools.partial(
        trainer.featurize,
        task=task,
        tokenizer=setting.pretrained.tokenizer,
        max_seq_length=grid.max_seq_length,
    )
    train = features(data.train)
    dev = {stem: features(rows) for stem, rows in data.dev.items()}
    test = {stem: features(rows) for stem, rows in test_sets.rows.items()}
    config = setting.pretrained.config.with_dropout(grid.dropout_rate)
    steps = trainer.TaskSteps(
        config, task, grid.optimizer, grid.max_seq_length, setting.partitioner, grid.classifier_dropout_rate
    )
    train_one = functools.partial(trainer.finetune, steps, setting.pretrained.params, train, dev, test)
    outcome = sweep.sweep(task, grid, setting.workdir, train_one)
    written = _write_predictions(outcome, test_sets, setting)
    _log_choice(task, outcome.chosen)
    return _task_result(outcome, grid, train, dev, test, written)


def _write_predictions(outcome: SweepResult, test_sets: _TestSets, setting: _Setting) -> list[str]:
    """The leaderboard files of the chosen configuration's test predictions; returns their
    names (every process, the files only from the first)."""
    from finetune import submission

    written = []
    for stem, logits in outcome.test_logits.items():
        name = test_sets.file_names[stem]
        labels = submission.prediction_labels(test_sets.tasks[stem], logits)
        if setting.main_process:
            submission.write_predictions(os.path.join(setting.workdir, name), test_sets.rows[stem], labels)
        written.append(name)
    return written


def _task_result(
    outcome: SweepResult,
    grid: Grid,
    train: Features,
    dev: dict[str, Features],
    test: dict[str, Features],
    written: list[str],
) -> dict[str, Any]:
    """A task's entry of results.json: the chosen configuration's dev metrics and scores, the
    examples read (and truncated), every configuration and the files written."""
    chosen = outcome.chosen
    return {
        "metrics": chosen["dev_median"],
        "score_median": chosen["glue_score_median"],
        "score_mean": chosen["glue_score_mean"],
        "train_examples": len(train),
        "dev_examples": {stem: len(f) for stem, f in dev.items()},
        "test_examples": {stem: len(f) for stem, f in test.items()},
        "truncated": {
            "train": train.truncated,
            **{stem: f.truncated for stem, f in {**dev, **test}.items()},
        },
        "chosen": chosen,
        "chosen_seed": outcome.chosen_seed,
        "configurations": outcome.configurations,
        "runs_trained": outcome.trained,
        "runs_reused": outcome.reused,
        "submission_files": written,
        "grid": dataclasses.asdict(grid),
    }


def _log_choice(task: Task, chosen: dict[str, Any]) -> None:
    log.info(
        "%s: chosen %s, dev score median %.4f (mean %.4f) over seeds %s",
        task.name,
        chosen["name"],
        chosen["glue_score_median"],
        chosen["glue_score_mean"],
        chosen["seeds"],
    )


def _write_summary(workdir: str, summary: dict[str, Any]) -> None:
    """results.json, results.md, operative_config.gin and submission.zip (the leaderboard's
    files first, in its order)."""
    import gin
    import tensorflow as tf

    from finetune import submission

    with tf.io.gfile.GFile(os.path.join(workdir, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with tf.io.gfile.GFile(os.path.join(workdir, "results.md"), "w") as f:
        f.write(submission.markdown_table(summary))
    with tf.io.gfile.GFile(os.path.join(workdir, "operative_config.gin"), "w") as f:
        f.write(gin.operative_config_str())
    submissions = summary["submission_files"]
    if submissions:
        ordered = [n for n in submission.SUBMISSION_FILES if n in submissions]
        submission.zip_submission(workdir, ordered + [n for n in submissions if n not in ordered])
    if not summary["submission_complete"]:
        log.info(
            "submission.zip holds %d of the %d leaderboard files (run --tasks=all for a full submission)",
            len(submissions),
            len(submission.SUBMISSION_FILES),
        )


def build_parser():
    parser = cli.parser(__doc__, "finetune.glue")
    source = parser.add_mutually_exclusive_group(required=True)  # --init_from or its old spelling
    init_from = source.add_argument("--init_from", help="pretraining (or imported) workdir to start from")
    cli.hidden_alias(source, "--init_checkpoint", init_from)  # next to it: the usage line shows the group
    parser.add_argument(
        "--tasks", default="all", help="'all' (the nine tasks and AX) or a list, e.g. 'cola,sst2,mnli,ax'"
    )
    parser.add_argument(
        "--glue_dir", default=None, help="folder with the official GLUE task folders (CoLA/, ...)"
    )
    parser.add_argument("--tfds", action="store_true", help="read TFDS glue/<task> instead of --glue_dir")
    parser.add_argument("--tfds_data_dir", default=None, help="TFDS data_dir (default: TFDS's own)")
    parser.add_argument("--workdir", required=True, help="where runs, results and the submission go")
    cli.add_gin_flags(parser, default_files=["configs/glue/bert.gin"], example="Grid.seeds = (0, 1, 2)")
    cli.add_mesh_flags(parser)
    cli.add_compilation_cache_flag(parser)
    return parser


def _run(args) -> None:
    import jax
    import tensorflow as tf

    from core import compilation_cache
    from finetune import sweep  # noqa: F401  (registers Grid with gin)

    cli.initialize_distributed(args)
    tf.config.set_visible_devices([], "GPU")  # TF only reads files here: keep it off the accelerators
    cli.setup_logging(jax.process_index() == 0)
    logging.getLogger("finetune").setLevel(logging.INFO)
    cli.parse_gin(cli.gin_files(args), args.gin_bindings)
    cli.check_same_command(args)
    with compilation_cache.enabled(args.compilation_cache, args.workdir) as cache:
        summary = run_glue(
            args.init_from,
            args.tasks,
            args.workdir,
            glue_dir=args.glue_dir,
            use_tfds=args.tfds,
            tfds_data_dir=args.tfds_data_dir,
            mesh_spec=args.mesh,
        )
    logging.getLogger("finetune").info(cache.summary())
    print(
        f"done: GLUE score {100 * summary['glue_score']:.1f} over {', '.join(summary['glue_score_tasks'])}; "
        f"{args.workdir}/results.md, results.json, submission.zip "
        f"({len(summary['submission_files'])} files) in {summary['wall_seconds']:.0f} s"
    )


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
