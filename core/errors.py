"""The one base class of every error a user can cause and fix.

A `UserError` is reported by the command-line tools as a single `error: ...` line (exit
status 2, no traceback; core/cli.py): its message says what is wrong and what to do.
Every stage derives its own errors from it (ShardsError, MeshError, CheckpointError, ...),
so a tool catches them all by type, never by matching message text.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input, config, data or disk, explained in one line."""

    exit_status = 2


class Interrupted(UserError):
    """Ctrl-C, after the tool cleaned up: its line says what was kept (status 130, the shell's
    for SIGINT)."""

    exit_status = 130


class ConfigError(UserError, ValueError):
    """A config value that cannot work (raised by the gin-configured dataclasses and run()).

    Also a ValueError, the type Python code expects from a bad argument. gin re-raises an
    error from a configurable's constructor as a subclass of the same type with the binding's
    location appended, so it is still recognised as a ConfigError.
    """


def one_line(e: BaseException) -> str:
    """An exception as `Type: message` on one line, cut at 300 characters (orbax's,
    tensorstore's and the collectives' messages can run to pages)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"
