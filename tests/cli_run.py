"""Running a command-line tool's `main(argv)` inside the test process, as a user would run
it (same flags, same exit status, same output), without paying for a new Python process
and its imports each time.

The subprocess tests that remain are the ones that need a real process: signals and kills
(tests/fault_injection.py), the `python -m` entry itself (tests/test_cli.py), and tools
that must start with another device count (bench)."""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable, Sequence
from types import ModuleType

import gin


@dataclasses.dataclass
class Result:
    """What a finished command gives: exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str

    def errors(self) -> list[str]:
        """The `error: ...` lines on stderr."""
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def run(main: Callable[[Sequence[str]], int], argv: Sequence[str], capsys) -> Result:
    """`main(argv)` with stdout/stderr captured (pytest's capsys); gin's config and the
    root logger's handlers are restored afterwards, so tools can set them up as they do
    in their own process."""
    handlers, level = logging.root.handlers[:], logging.root.level
    capsys.readouterr()  # drop what came before
    gin.clear_config()
    try:
        status = main(list(argv))
    except SystemExit as e:  # argparse: --help (0) and bad flags (2)
        status = e.code if isinstance(e.code, int) else 1
    finally:
        gin.clear_config()
        for handler in logging.root.handlers[:]:
            if handler not in handlers:
                logging.root.removeHandler(handler)
        for handler in handlers:
            if handler not in logging.root.handlers:
                logging.root.addHandler(handler)
        logging.root.setLevel(level)
    out, err = capsys.readouterr()
    return Result(status, out, err)


def tool_module(name: str) -> ModuleType:
    """The module holding a tool's `build_parser` and `main`: `name` itself, or for a
    package (`python -m data.tokenizers`) its cli.py, which its __main__.py runs."""
    module = importlib.import_module(name)
    return importlib.import_module(f"{name}.cli") if hasattr(module, "__path__") else module
