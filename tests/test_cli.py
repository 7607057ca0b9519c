"""Every command-line tool: `--help` works and explains every flag, and `python -m` runs the
module as a program. (Each tool's behaviour is tested with its stage; these are the checks
they all share.)"""

import argparse
import importlib
import os
import subprocess
import sys

import pytest

from core import cli
from tests import cli_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = [
    "data.preprocess",
    "data.tokenizers",
    "interop.convert",
    "interop.encode",
    "interop.predict",
    "pretrain.train",
    "pretrain.summary",
    "pretrain.ablate",
    "pretrain.demo",
    "pretrain.tpu_compile",
    "finetune.glue",
    "finetune.demo_task",
    "bench.pretrain",
    "bench.compare",
    "bench.memory",
    "bench.input_pipeline",
    "bench.tpu_table",
    "bench.preprocess",
    "bench.sentence_splitters",
    "core.local_pod",
    # bench.peer_hf runs only in the peer's own virtualenv (transformers 4.57.6, Flax models).
]


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


@pytest.mark.parametrize("name", TOOLS)
def test_help_explains_every_flag(name, capsys):
    module = cli_run.tool_module(name)
    # TensorFlow's environment first (quiet start; ruff's isort keeps it before TensorFlow).
    assert "\nimport core.tf_env" in open(module.__file__).read(), name
    for parser in _parsers(module.build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and len(action.help) > 10, f"{name}: {action.option_strings or action.dest}"
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m {name}") and module.__doc__.splitlines()[0] in out


def test_a_bad_flag_is_a_usage_error(capsys):
    from pretrain import summary

    with pytest.raises(SystemExit) as exit_:
        summary.main(["--seq_lenn=3"])
    assert exit_.value.code == 2 and "unrecognized arguments: --seq_lenn=3" in capsys.readouterr().err


@pytest.mark.slow
def test_python_m_runs_the_module():
    """The real entry point, in its own process: a user error is one line and status 2."""
    result = subprocess.run(
        [sys.executable, "-m", "pretrain.summary", "--gin_file=configs/models/nope.gin"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: cannot read --gin_file configs/models/nope.gin: No such file or directory"
    )


def test_every_error_class_is_a_user_error():
    """One base class: every exception a module of ours defines is a UserError, which the
    entry wrapper turns into one `error:` line."""
    import inspect
    import pkgutil

    from core.errors import UserError

    found = []
    for package in ("core", "data", "models", "interop", "pretrain", "finetune", "bench"):
        for info in pkgutil.walk_packages([os.path.join(ROOT, package)], prefix=f"{package}."):
            if info.name == "bench.peer_hf":  # the peer's own virtualenv only
                continue
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if inspect.isclass(value) and issubclass(value, Exception) and value.__module__ == info.name:
                    found.append(f"{info.name}.{name}")
                    assert issubclass(value, UserError), found[-1]
    assert len(found) >= 15


@pytest.mark.slow
def test_demo_task_smoke(tmp_path, capsys):
    from finetune import demo_task

    args = [f"--output={tmp_path}", "--train=20", "--dev=10", "--test=10"]
    result = cli_run.run(demo_task.main, args, capsys)
    assert result.returncode == 0, result.stderr
    assert len((tmp_path / "WordOrder" / "train.tsv").read_text().splitlines()) == 21


@pytest.mark.slow
@pytest.mark.extended
def test_memory_smoke(capsys):
    """The step compiled for a mesh, nothing allocated (8 fake devices here)."""
    import json

    from bench import memory

    args = ["--gin_file=configs/models/bert_tiny.gin", "--gin_bindings=EncoderConfig.vocab_size=512"]
    args += ["--mesh=fsdp:8", "--batch_size=8", "--seq_len=16", "--num_predictions=2"]
    result = cli_run.run(memory.main, [*args], capsys)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1} and out["state_bytes_per_device"] > 0


def test_compare_needs_the_peer_venv(capsys):
    from bench import compare

    result = cli_run.run(compare.main, ["--peer_python=/nonexistent/python"], capsys)
    assert result.returncode == 2
    assert result.errors() == [
        "error: no peer virtualenv at /nonexistent/python: run `make bench-peer-venv` first"
    ]


@pytest.mark.parametrize("name", TOOLS + ["bench.peer_hf"])
def test_usage_lines_reach_help_as_written(name):
    """A backslash that continues a usage line in the module docstring survives into --help
    (a non-raw docstring would join the lines: ruff's D301 keeps them raw)."""
    module = cli_run.tool_module(name)
    source = open(module.__file__).read()
    docstring = source[source.index('"""') + 3 : source.index('"""', source.index('"""') + 3)]
    assert docstring.count("\\\n") == module.__doc__.count("\\\n")
    assert module.build_parser().description == module.__doc__


def test_help_shows_defaults(capsys):
    from bench import input_pipeline

    help_ = input_pipeline.build_parser().format_help()
    assert "rows per batch (default: 32)" in help_ and "timed batches (default: 200)" in help_
    assert "(default: None)" not in help_ and "(default: False)" not in help_


# The flag vocabulary (docs/cli.md): the old spellings stay accepted, hidden from --help.
ALIASES = [
    ("bench.pretrain", "--batch=4", "--batch_size=4", "batch_size", 4),
    ("bench.pretrain", "--seq=16", "--seq_len=16", "seq_len", 16),
    ("bench.pretrain", "--predictions=3", "--num_predictions=3", "num_predictions", 3),
    ("bench.memory", "--predictions=3", "--num_predictions=3", "num_predictions", 3),
    ("bench.input_pipeline", "--batches=7", "--steps=7", "steps", 7),
    ("bench.compare", "--seq=64", "--seq_len=64", "seq_len", 64),
    ("interop.encode", "--max_seq_length=64", "--seq_len=64", "seq_len", 64),
    ("finetune.glue", "--init_checkpoint=W", "--init_from=W", "init_from", "W"),
]
REQUIRED = {
    "interop.encode": ["--workdir=W", "--input=I", "--output=O"],
    "finetune.glue": ["--workdir=O"],
}


@pytest.mark.parametrize("name, old, new, dest, value", ALIASES)
def test_old_flag_spellings_are_hidden_aliases(name, old, new, dest, value):
    parser = cli_run.tool_module(name).build_parser()
    required = REQUIRED.get(name, [])
    assert getattr(parser.parse_args([*required, old]), dest) == value
    assert getattr(parser.parse_args([*required, new]), dest) == value
    assert old.split("=")[0] + " " not in parser.format_help() and new.split("=")[0] in parser.format_help()


def test_gin_dot_flags_are_bindings():
    """t5x's `--gin.NAME=VALUE` spelling, in order with the other flags."""
    argv = [
        "--gin_file=a.gin",
        "--gin.run.steps=100",
        "--gin.PipelineConfig.format",
        "'full_sentences'",
        "--x",
    ]
    assert cli.gin_dot_flags(argv) == [
        "--gin_file=a.gin",
        "--gin_bindings=run.steps = 100",
        "--gin_bindings=PipelineConfig.format = 'full_sentences'",
        "--x",
    ]


def test_every_tool_repeats_gin_file_and_reads_gin_dot_flags():
    from pretrain import demo

    args = demo.build_parser().parse_args(
        cli.gin_dot_flags(["--gin_file=a.gin", "--gin_file=b.gin", "--gin.run.steps=3"])
    )
    assert cli.gin_files(args) == ["a.gin", "b.gin"] and args.gin_bindings == ["run.steps = 3"]
    assert cli.gin_files(demo.build_parser().parse_args([])) == ["configs/runs/demo_deberta.gin"]


@pytest.mark.parametrize(
    "name, argv, message",
    [
        (
            "finetune.demo_task",
            ["--output=OUT", "--train=-5"],
            "argument --train: must be at least 1, got -5",
        ),
        (
            "bench.input_pipeline",
            ["--batch_size=0"],
            "argument --batch_size: must be at least 1, got 0",
        ),
        # an old spelling is named as it was written
        ("bench.input_pipeline", ["--batch=0"], "argument --batch: must be at least 1, got 0"),
        (
            "interop.predict",
            ["--workdir=W", "--text=t", "--top_k=x"],
            "argument --top_k: 'x' is not an integer",
        ),
    ],
)
def test_counts_below_one_are_usage_errors(tmp_path, capsys, name, argv, message):
    with pytest.raises(SystemExit) as exit_:
        cli_run.tool_module(name).main([a.replace("OUT", str(tmp_path / "out")) for a in argv])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: {message}")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.extended
def test_peer_benchmark_outside_its_venv_is_one_line():
    """bench.peer_hf needs transformers 4.57.6 (Flax models): --help works in our venv, a
    run says where to run it."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.peer_hf", "--model={}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: bench.peer_hf needs transformers==4.57.6 (Flax models): run `make bench-peer-venv`, "
        "then .venv-peer/bin/python -m bench.peer_hf"
    ]


@pytest.mark.parametrize("final_line", [True, False])
def test_an_unclosed_bracket_in_a_gin_file_or_binding_is_one_line_naming_it(tmp_path, capsys, final_line):
    """gin reads the rest of the file as the open value: a traceback of Python's tokenizer at
    the end of the text, or an error on a later line. The line of the bracket is named."""
    from pretrain import summary

    lines = ["include 'configs/runs/demo.gin'", "adamw.learning_rate = (1e-3"]
    if not final_line:
        lines.append("run.steps = 4")
    gin_file = tmp_path / "mine.gin"
    gin_file.write_text("\n".join(lines) + "\n")
    result = cli_run.run(summary.main, [f"--gin_file={gin_file}"], capsys)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.errors() == [
        f"error: {gin_file}:2: the '(' of `adamw.learning_rate = (1e-3` is never closed: close it where "
        "its value ends"
    ]
    binding = "adamw.learning_rate = [1e-3"
    result = cli_run.run(
        summary.main, ["--gin_file=configs/runs/demo.gin", f"--gin_bindings={binding}"], capsys
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.errors()[0].startswith(
        f"error: --gin_bindings '{binding}': the '[' of `{binding}` is never"
    )
    quoted = 'run.init_from = """/tmp'
    result = cli_run.run(
        summary.main, ["--gin_file=configs/runs/demo.gin", f"--gin_bindings={quoted}"], capsys
    )
    assert result.errors() == [
        f"error: --gin_bindings '{quoted}': the triple-quoted string of `{quoted}` is never closed: close "
        "it where its value ends"
    ]


def test_a_model_file_whose_encoder_has_no_pooler_is_told_about_the_sentence_objective(capsys):
    """XLNet's model file alone gets the default recipe's NSP head, which needs a pooler: the
    line names that cause, not the pooler setting the model file already makes."""
    from pretrain import summary

    result = cli_run.run(summary.main, ["--gin_file=configs/models/xlnet_base.gin"], capsys)
    assert result.returncode == 2 and result.errors() == [
        "error: PipelineConfig.sentence_objective = 'nsp' puts a sentence head on the pooler, but XLNet's "
        "encoder has no pooler: add the model's recipe (--gin_file=configs/recipes/...), or bind "
        "PipelineConfig.sentence_objective = 'none'"
    ]


@pytest.mark.slow
def test_no_tensorflow_lines_come_before_a_tools_error(tmp_path):
    """`python -m interop.convert` imports its package before its __main__: TensorFlow's C++
    start-up lines (the oneDNN notice) must not precede the tool's one line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "interop.convert",
            "import",
            f"--from=hf:{tmp_path}/nope",
            f"--workdir={tmp_path}/w",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and result.stderr == f"error: hf:{tmp_path}/nope: not a directory\n"


def test_ctrl_c_in_a_tool_is_one_line_and_status_130(capsys):
    """A KeyboardInterrupt a tool does not handle itself ends it with one line, no traceback."""

    def work(args):
        raise KeyboardInterrupt

    main = cli.entry(lambda: cli.parser("A tool.", "tests.tool"), work)
    result = cli_run.run(main, [], capsys)
    assert result.returncode == 130 and result.stderr == "error: interrupted (Ctrl-C)\n"
