"""Command-line plumbing shared by every tool: one flags library (argparse), one entry
wrapper, gin parsing and logging.

Every tool module has the same shape:

    def build_parser() -> argparse.ArgumentParser: ...   # cli.parser(__doc__, "pkg.tool") + flags
    def run(args: argparse.Namespace) -> int | None: ... # the work
    main = cli.entry(build_parser, run)                  # main(argv) -> exit status
    if __name__ == "__main__":
        sys.exit(main())

`main` is callable in-process (tests pass argv), parses the flags, runs, and turns any
`UserError` (core/errors.py) into one `error: ...` line on stderr and exit status 2;
argparse reports a bad flag with its usage line and status 2 as well.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from core.errors import ConfigError, UserError


class GinError(ConfigError):
    """A gin file or binding that does not parse or names nothing."""


def parser(doc: str, prog: str) -> argparse.ArgumentParser:
    """A parser whose --help starts with the tool's module docstring (usage lines kept as written)."""
    return argparse.ArgumentParser(
        prog=f"python -m {prog}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_gin_flags(parser: argparse.ArgumentParser, default_files: Sequence[str] = ()) -> None:
    """--gin_file (repeatable, applied in order) and --gin_bindings (repeatable, applied last)."""
    default = f" (default: {', '.join(default_files)})" if default_files else ""
    parser.add_argument(
        "--gin_file",
        action="append",
        default=None,
        metavar="FILE",
        help=f"gin file, repeatable, parsed in order{default}",
    )
    parser.add_argument(
        "--gin_bindings",
        action="append",
        default=[],
        metavar="BINDING",
        help="gin binding applied after the files, repeatable, e.g. 'run.steps = 100'",
    )
    parser.set_defaults(default_gin_files=list(default_files))


def gin_files(args: argparse.Namespace) -> list[str]:
    """The --gin_file values, or the tool's defaults when none was given."""
    return args.gin_file if args.gin_file is not None else list(args.default_gin_files)


def add_mesh_flags(parser: argparse.ArgumentParser) -> None:
    """--mesh and --distributed (core/sharding.py)."""
    parser.add_argument(
        "--mesh",
        default=None,
        help="device mesh, e.g. 'data:4,fsdp:2,tensor:1' (one size may be -1 for 'the rest'); "
        "default: every device on 'data'",
    )
    parser.add_argument(
        "--distributed",
        default="auto",
        choices=("auto", "on", "off"),
        help="jax.distributed.initialize(): 'auto' when the environment lists several hosts (a TPU "
        "pod slice, or JAX_COORDINATOR_ADDRESS), 'on' always, 'off' never",
    )


def entry(
    build_parser: Callable[[], argparse.ArgumentParser],
    run: Callable[[argparse.Namespace], int | None],
) -> Callable[[Sequence[str] | None], int]:
    """The tool's `main(argv=None) -> exit status`: parse, run, report user errors in one line."""

    def main(argv: Sequence[str] | None = None) -> int:
        args = build_parser().parse_args(argv)
        try:
            status = run(args)
        except UserError as e:
            # The message's first line: gin appends the configurable that was being called
            # ("In call to configurable 'run'") on further lines, which says nothing here.
            print(f"error: {_message(e)}", file=sys.stderr)
            return 2
        return 0 if status is None else status

    return main


def setup_logging(is_main_process: bool = True) -> None:
    """Our INFO lines on the main process; library chatter (orbax, absl, jax backends) only from WARNING."""
    logging.basicConfig(
        level=logging.INFO if is_main_process else logging.WARNING,
        format="%(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    for chatty in ("absl", "jax._src.xla_bridge", "orbax"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def parse_gin(files: Sequence[str], bindings: Sequence[str], *, skip_unknown: bool = False) -> None:
    """Parses gin files, then bindings; a file that cannot be read or a binding that does not
    parse or names no configurable is a GinError. The caller imports the modules whose
    configurables the files bind first (gin only knows what has been registered)."""
    import gin

    for path in files:
        try:
            with open(path):
                pass
        except OSError as e:
            raise GinError(f"cannot read --gin_file {path}: {e.strerror}") from None
    try:
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=False, skip_unknown=skip_unknown)
    except UserError:
        raise
    # gin reports every parse problem (syntax, unknown configurable or parameter, bad
    # reference) from this call as one of these; the call site makes it a gin error.
    except (ValueError, KeyError, SyntaxError, NameError, AttributeError, OSError) as e:
        message = one_line(e)
        if isinstance(e, KeyError):  # str(KeyError) quotes its message
            message = message.strip("'\"")
        raise GinError(f"{message}: check the spelling in --gin_file / --gin_bindings") from None


def _message(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def one_line(e: BaseException) -> str:
    """An exception's message as one line: its first line, plus the location gin appends
    ("In call to configurable ...", "In file ..., line N") when there is one."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    head = lines[0] if lines else type(e).__name__
    where = next((line for line in lines[1:] if line.startswith("In ") or "line" in line), "")
    return f"{head} ({where})" if where else head
