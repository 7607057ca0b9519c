"""Every command in the README and docs/ is one our tools accept: its flags parse with the
tool's own parser (a dry run of the command line, no work done), the gin files and grid
folders it names exist, and every `make` target exists. So no command a reader copies goes
stale when a flag or a file is renamed."""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from core import cli
from tests import cli_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUR_PACKAGES = ("core", "data", "models", "interop", "pretrain", "finetune", "bench")
PAGES = ["README.md", *sorted(glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True))]
_FENCE = re.compile(r"^```(\w*)\s*$")
_SHELL_BLOCKS = ("sh", "bash", "shell")


def shell_lines(path: str) -> list[tuple[int, str]]:
    """(line number, command) of every command in the page's shell code blocks, with
    backslash continuations joined."""
    commands, block, pending, start = [], None, "", 0
    with open(os.path.join(ROOT, path)) as f:
        for number, line in enumerate(f, 1):
            fence = _FENCE.match(line.strip())
            if fence:
                block = fence.group(1) if block is None else None
                continue
            if block not in _SHELL_BLOCKS or block is None:
                continue
            text = line.rstrip("\n")
            if not pending:
                start = number
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            command = (pending + text).strip()
            pending = ""
            if command and not command.startswith("#"):
                commands.append((start, command))
    return commands


def _words(command: str) -> list[list[str]]:
    """The simple commands of a shell line (split at &&, ||, |, ;), env assignments dropped."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    simple, out = [], []
    for token in lexer:
        if token in ("&&", "||", "|", ";", "&"):
            out.append(simple)
            simple = []
        else:
            simple.append(token)
    out.append(simple)
    return [s[_first_program(s) :] for s in out]


def _first_program(words: list[str]) -> int:
    """Index of the first word that is not an environment assignment."""
    return next((i for i, w in enumerate(words) if not re.match(r"^\w+=", w)), len(words))


def _module_args(words: list[str]) -> tuple[str, list[str]] | None:
    """('pkg.tool', args) when the words run one of our tools with `python -m`."""
    if len(words) < 3 or not re.search(r"(^|/)python3?$", words[0]) or words[1] != "-m":
        return None
    if words[2].split(".")[0] not in OUR_PACKAGES:
        return None
    return words[2], words[3:]


def _commands():
    for page in PAGES:
        for number, line in shell_lines(page):
            try:
                simple_commands = _words(line)
            except ValueError as e:  # shlex: an unclosed quote
                UNREADABLE.append(f"{page}:{number}: {e}: {line}")
                continue
            for words in simple_commands:
                yield page, number, line, words


UNREADABLE: list[str] = []
ALL = list(_commands())
TOOL_RUNS = [(p, n, line, m) for p, n, line, w in ALL if (m := _module_args(w))]
MAKE_RUNS = [(p, n, w) for p, n, _, w in ALL if w[:1] == ["make"]]


def test_the_pages_hold_commands():
    assert not UNREADABLE, UNREADABLE
    assert len(TOOL_RUNS) >= 30 and len(MAKE_RUNS) >= 3, (len(TOOL_RUNS), len(MAKE_RUNS))


@pytest.mark.parametrize("page, number, line, run", TOOL_RUNS, ids=[f"{p}:{n}" for p, n, _, _ in TOOL_RUNS])
def test_each_tool_command_parses(page, number, line, run):
    name, args = run
    parser = cli_run.tool_module(name).build_parser()
    try:
        parsed = parser.parse_args(cli.gin_dot_flags(args))
    except SystemExit:
        pytest.fail(f"{page}:{number}: {name} refuses its flags: {line}")
    if name == "core.local_pod":  # the pod's flags, then the tool each process runs
        inner = parsed.command[1:] if parsed.command[:1] == ["--"] else parsed.command
        assert inner, f"{page}:{number}: no tool after --: {line}"
        test_each_tool_command_parses(page, number, line, (inner[0], inner[1:]))
    hidden = {
        alias
        for action in parser._actions
        if action.help == argparse.SUPPRESS
        for alias in action.option_strings
    }
    old = [a for a in args if a.split("=")[0] in hidden]
    assert not old, f"{page}:{number}: {old} is an old spelling (docs/cli.md): {line}"
    named = [*(getattr(parsed, "gin_file", None) or []), getattr(parsed, "grid", None)]
    for path in named:
        if path and path.startswith("configs/"):
            assert os.path.exists(os.path.join(ROOT, path)), f"{page}:{number}: no {path}"


def test_each_make_target_exists():
    with open(os.path.join(ROOT, "Makefile")) as f:
        targets = set(re.findall(r"^([\w.-]+):", f.read(), re.M))
    for page, number, words in MAKE_RUNS:
        for word in words[1:]:
            if not word.startswith("-") and "=" not in word:
                assert word in targets, f"{page}:{number}: no make target {word!r}"


def test_the_commands_are_read_as_a_reader_reads_them():
    """The parser of the pages: continuations joined, chains split, env assignments dropped."""
    words = _words("XLA_FLAGS=x python -m pretrain.train --workdir=W && make test # done")
    assert words == [["python", "-m", "pretrain.train", "--workdir=W"], ["make", "test"]]
    assert _module_args(["python", "-m", "finetune.glue", "--tasks=all|cola"]) == (
        "finetune.glue",
        ["--tasks=all|cola"],
    )
    assert _module_args(["python", "-m", "pip", "install"]) is None


def _readme_section_commands(heading: str) -> list[str]:
    """The commands of the first shell block after the README's `heading`."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index(heading) :]
    block = section[section.index("```sh") + len("```sh") : section.index("```", section.index("```sh") + 5)]
    commands, pending = [], ""
    for line in block.splitlines():
        if line.endswith("\\"):
            pending += line[:-1] + " "
        elif (pending + line).strip() and not line.strip().startswith("#"):
            commands.append((pending + line).strip())
            pending = ""
    return commands


@pytest.mark.slow(120)
@pytest.mark.extended
def test_the_readmes_own_corpus_commands_run_as_written(tmp_path):
    """The README's own-corpus section, from a corpus glob to fill-mask and features, run in a
    folder holding only `corpus/` (120 documents of the demo corpus in two files, as a
    user's) and the repository's configs. One edit: 20 steps instead of the section's 300
    (asserted there)."""
    from data import corpora

    commands = _readme_section_commands("## Pretraining your own model")
    assert [shlex.split(c)[2] for c in commands] == [
        "data.tokenizers",
        "data.preprocess",
        "pretrain.train",
        "interop.predict",
        "interop.encode",
    ]
    assert sum('"run.steps=300"' in c for c in commands) == 1
    documents = list(corpora.iter_documents("demo"))[:120]  # enough for 4 shards, and quick
    (tmp_path / "corpus").mkdir()
    for i, part in enumerate((documents[: len(documents) // 2], documents[len(documents) // 2 :])):
        text = "\n\n".join("\n".join(d.sentences) for d in part)
        (tmp_path / "corpus" / f"part_{i:02d}.txt").write_text(text + "\n")
    os.symlink(os.path.join(ROOT, "configs"), tmp_path / "configs")
    env = {**os.environ, "PYTHONPATH": ROOT}
    outputs = []
    for command in commands:
        words = shlex.split(command.replace('"run.steps=300"', '"run.steps=20"'))
        result = subprocess.run(
            [sys.executable, *words[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
        outputs.append(result.stdout)
    assert "done: step 20" in outputs[2]
    assert outputs[3].splitlines()[1].startswith("  mask 1: ")
    with np.load(tmp_path / "runs/mine_tiny/features.npz") as features:
        assert features["last_hidden_state"].shape[-1] == 128
