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
    for package in ("core", "data", "models", "pretrain", "finetune", "bench"):
        for info in pkgutil.walk_packages([os.path.join(ROOT, package)], prefix=f"{package}."):
            if info.name == "bench.peer_hf":  # the peer's own virtualenv only
                continue
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if inspect.isclass(value) and issubclass(value, Exception) and value.__module__ == info.name:
                    found.append(f"{info.name}.{name}")
                    assert issubclass(value, UserError), found[-1]
    assert len(found) >= 15
