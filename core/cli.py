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
import io
import logging
import signal
import sys
import tokenize
import traceback
from collections.abc import Callable, Sequence

import core.tf_env

from core.errors import ConfigError, UserError


class GinError(ConfigError):
    """A gin file or binding that does not parse or names nothing."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The module docstring as written (its usage lines), and each flag's default after its
    help when it has one worth showing (not None, False or an empty list).

    `_get_help_string` is the hook the standard library's own ArgumentDefaultsHelpFormatter
    overrides; that class would also print "(default: None)" and "(default: False)" after
    some sixty flags, which says nothing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_ = action.help or ""
        default = action.default
        if "%(default)" in help_ or "(default" in help_ or not action.option_strings:
            return help_
        if default is None or default is False or default == [] or default is argparse.SUPPRESS:
            return help_
        return f"{help_} (default: %(default)s)"


def parser(doc: str, prog: str) -> argparse.ArgumentParser:
    """A parser whose --help starts with the tool's module docstring (usage lines kept as
    written) and shows each flag's default."""
    return argparse.ArgumentParser(prog=f"python -m {prog}", description=doc, formatter_class=_HelpFormatter)


def positive_int(text: str) -> int:
    """argparse type of counts and sizes: an integer >= 1 (anything else is a usage error
    naming the flag, before any work starts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def hidden_alias(container: argparse._ActionsContainer, old: str, new: argparse.Action) -> None:
    """Accepts `old` as another spelling of the flag whose action `add_argument` returned as
    `new` (docs/cli.md: the flag vocabulary): an option of its own with the same destination
    and type, left out of --help, the usage line and argparse's errors (help=SUPPRESS). For a
    required flag, `new` and the alias belong to one required mutually exclusive group
    (`container`), so that either satisfies it."""
    container.add_argument(
        old,
        dest=new.dest,
        type=new.type,
        choices=new.choices,
        metavar=new.metavar,
        help=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
    )


def add_gin_flags(
    parser: argparse.ArgumentParser,
    default_files: Sequence[str] = (),
    example: str = "run.steps = 100",
) -> None:
    """--gin_file (repeatable, applied in order) and --gin_bindings (repeatable, applied last);
    `--gin.NAME=VALUE` (t5x's spelling) is one more binding (see `entry`). `example` is a
    binding this tool accepts, shown in --help."""
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
        help=f"gin binding applied after the files, repeatable, e.g. '{example}'; "
        f"--gin.NAME=VALUE is the same as --gin_bindings='NAME = VALUE'",
    )
    parser.set_defaults(default_gin_files=list(default_files))


def gin_dot_flags(argv: Sequence[str]) -> list[str]:
    """t5x's `--gin.NAME=VALUE` (or `--gin.NAME VALUE`) rewritten as
    `--gin_bindings=NAME = VALUE`; every other argument unchanged, in order."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg.startswith("--gin.") and len(arg) > len("--gin."):
            name, sep, value = arg[len("--gin.") :].partition("=")
            if not sep:
                value = next(args, "")
            out.append(f"--gin_bindings={name} = {value}")
        else:
            out.append(arg)
    return out


def gin_files(args: argparse.Namespace) -> list[str]:
    """The --gin_file values, or the tool's defaults when none was given."""
    return args.gin_file if args.gin_file is not None else list(args.default_gin_files)


def add_mesh_flags(parser: argparse.ArgumentParser) -> None:
    """--mesh (core/sharding.py), --distributed and the cluster's settings (core/cluster.py)."""
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
        help="jax.distributed.initialize(): 'auto' when the settings below or the environment "
        "describe several processes (a TPU pod slice, JAX_COORDINATOR_ADDRESS), 'on' always (JAX "
        "also detects SLURM, Open MPI, Kubernetes), 'off' never",
    )
    parser.add_argument(
        "--coordinator_address",
        default=None,
        metavar="HOST:PORT",
        help="the cluster's coordinator, process 0's host (default: $JAX_COORDINATOR_ADDRESS)",
    )
    parser.add_argument(
        "--num_processes",
        type=positive_int,
        default=None,
        help="processes in the cluster (default: $JAX_NUM_PROCESSES, else what JAX detects)",
    )
    parser.add_argument(
        "--process_id",
        type=int,
        default=None,
        help="this process's id, 0..num_processes-1 (default: $JAX_PROCESS_ID, else what JAX detects)",
    )
    parser.add_argument(
        "--peer_timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="in a cluster, a process that sends JAX's coordination service no heartbeat for this long "
        "(killed, its host gone) ends the others, with one line naming it (JAX's "
        "heartbeat_timeout_seconds; 0: JAX's default, 100 s)",
    )


def add_compilation_cache_flag(parser: argparse.ArgumentParser) -> None:
    """--compilation_cache (core/compilation_cache.py) of the tools that train into a workdir."""
    parser.add_argument(
        "--compilation_cache",
        default="workdir",
        metavar="workdir|off|DIR",
        help="persistent XLA compilation cache, so that a restarted run does not compile its steps "
        "again: 'workdir' = WORKDIR/compilation_cache (or $JAX_COMPILATION_CACHE_DIR when set), "
        "'off', or a directory",
    )


def check_same_command(args: argparse.Namespace) -> None:
    """In a cluster, after the gin files are parsed and before anything is written: every
    process was started with the same flags and gin config, else a one-line ClusterError on
    every process (a host with another data directory would train on data none asked for)."""
    import gin

    from core import cluster

    flags = {k: v for k, v in sorted(vars(args).items()) if k != "process_id"}
    cluster.check_same_everywhere(f"{gin.config_str()}\n{flags!r}")


def initialize_distributed(args: argparse.Namespace) -> bool:
    """`core.cluster.initialize_distributed` with the flags of `add_mesh_flags`."""
    from core import cluster

    settings = cluster.Cluster.from_settings(args.coordinator_address, args.num_processes, args.process_id)
    return cluster.initialize_distributed(args.distributed, settings, args.peer_timeout)


def entry(
    build_parser: Callable[[], argparse.ArgumentParser],
    run: Callable[[argparse.Namespace], int | None],
) -> Callable[[Sequence[str] | None], int]:
    """The tool's `main(argv=None) -> exit status`: parse, run, report user errors in one line."""

    def main(argv: Sequence[str] | None = None) -> int:
        if signal.getsignal(signal.SIGINT) == core.tf_env._interrupted_while_starting:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # the imports are done
        args = build_parser().parse_args(gin_dot_flags(sys.argv[1:] if argv is None else argv))
        try:
            status = run(args)
        except KeyboardInterrupt:
            # Ctrl-C outside a tool's own handling (pretraining stops after a step with a
            # checkpoint; preprocessing says what it removed).
            print("error: interrupted (Ctrl-C)", file=sys.stderr)
            status = 130
        except UserError as e:
            # The message's first line: gin appends the configurable that was being called
            # ("In call to configurable 'run'") on further lines, which says nothing here.
            print(f"error: {_message(e)}", file=sys.stderr)
            status = e.exit_status
        except Exception as e:  # pylint: disable=broad-except
            cluster = _cluster()
            if cluster is None:
                raise
            if cluster.peer_lost(e):  # a collective of a step, an evaluation ...
                print(f"error: {cluster.lost_peer_error('a collective', e)}", file=sys.stderr)
                status = 2
            else:
                traceback.print_exc()
                status = 1
        if status == 130 and argv is None:  # the command line's process, which now exits
            # The Ctrl-C line is out: a second Ctrl-C while the interpreter shuts down (joining
            # a process pool's threads) would add a traceback after it.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if status and _cluster() is not None:
            _cluster().leave(status)  # not through JAX's shutdown barrier, which would wait for the others
        return 0 if status is None else status

    return main


def _cluster():
    """core.cluster when this process is one of several JAX processes, else None."""
    if "jax" not in sys.modules:
        return None
    from core import cluster

    return cluster if cluster.in_cluster() else None


def setup_logging(is_main_process: bool = True) -> None:
    """Our INFO lines on the main process; library chatter (orbax, absl, jax backends) only from WARNING."""
    logging.basicConfig(
        level=logging.INFO if is_main_process else logging.WARNING,
        format="%(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    for chatty in ("absl", "jax._src.xla_bridge", "jax._src.compilation_cache", "orbax"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    jax = sys.modules.get("jax")  # joined a cluster already (initialize_distributed runs first)
    if jax is not None and jax.process_count() > 1:
        logging.getLogger("cluster").info(
            "distributed: process %d of %d, %d of %d devices here",
            jax.process_index(),
            jax.process_count(),
            jax.local_device_count(),
            jax.device_count(),
        )


def parse_gin(
    files: Sequence[str], bindings: Sequence[str], *, skip_unknown: bool | Sequence[str] = False
) -> None:
    """Parses gin files, then bindings; a file that cannot be read or a binding that does not
    parse or names no configurable is a GinError. The caller imports the modules whose
    configurables the files bind first (gin only knows what has been registered);
    `skip_unknown` (True, or the configurables' names) leaves bindings of others unread."""
    import gin

    for path in files:
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise GinError(f"cannot read --gin_file {path}: {e.strerror}") from None
        _check_brackets(text, path, numbered=True)
    for binding in bindings:
        _check_brackets(binding, f"--gin_bindings {binding!r}", numbered=False)
    try:
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=False, skip_unknown=skip_unknown)
    except UserError:
        raise
    except tokenize.TokenError:  # in a file that a --gin_file includes (the others are checked)
        raise GinError(
            "a bracket or a triple-quoted string is never closed in a gin file that a --gin_file "
            "includes: close it where its value ends"
        ) from None
    # gin reports every parse problem (syntax, unknown configurable or parameter, bad
    # reference) from this call as one of these; the call site makes it a gin error.
    except (ValueError, KeyError, SyntaxError, NameError, AttributeError, OSError) as e:
        message = one_line(e)
        if isinstance(e, KeyError):  # str(KeyError) quotes its message
            message = message.strip("'\"")
        raise GinError(f"{message}: check the spelling in --gin_file / --gin_bindings") from None


def _check_brackets(text: str, where: str, *, numbered: bool) -> None:
    """A GinError naming the line of a bracket or triple-quoted string that is never closed:
    gin reads the rest of the file (or binding) as part of that value and fails far from the
    cause, with a traceback of Python's tokenizer at the end. `where` names the file
    (`numbered`: with the line's number) or the binding."""
    opened: list[tuple[int, str]] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.OP and token.string in "([{":
                opened.append((token.start[0], token.string))
            elif token.type == tokenize.OP and token.string in ")]}" and opened:
                opened.pop()
    except tokenize.TokenError as e:
        # The tokenizer stops at the end inside a bracket (the first one open is named) or
        # inside a multi-line string (it reports where the string starts).
        line, what = opened[0] if opened else (e.args[1][0], "triple-quoted string")
        source = text.splitlines()[line - 1].strip()
        place = f"{where}:{line}" if numbered else where
        what = repr(what) if opened else what
        raise GinError(
            f"{place}: the {what} of `{source}` is never closed: close it where its value ends"
        ) from None
    except SyntaxError:  # gin's own parser says what is wrong with the rest
        pass


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
