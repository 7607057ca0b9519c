"""Every command-line tool: `--help` works and explains every flag, and `python -m` runs the
module as a program. (Each tool's behaviour is tested with its stage; these are the checks
they all share.)"""

import argparse
import importlib
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = [
    "data.preprocess",
    "data.tokenizers",
    "models.convert",
    "models.encode",
    "models.predict",
    "pretrain.train",
    "pretrain.summary",
    "pretrain.ablate",
    "pretrain.demo",
    "finetune.glue",
    "finetune.demo_task",
    "bench.pretrain",
    "bench.compare",
    "bench.memory",
    "bench.input_pipeline",
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
    module = importlib.import_module(name)
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
