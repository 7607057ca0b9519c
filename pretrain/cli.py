"""Plumbing shared by the command-line entry points (train, demo): gin parsing, logging,
and user-facing errors as one `error:` line, never a traceback.

Every error a user can cause (a typo in a gin binding, a missing corpus, a vocab-size
mismatch, a mesh that does not fit) is an exception class with a one-line message;
`user_errors()` prints it as `error: ...` and exits with status 2.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Sequence

import gin

from data import corpora, preprocess, shards, tokenizers
from pretrain import checkpointing, sharding, workdir


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


def parse_gin(files: Sequence[str], bindings: Sequence[str]) -> None:
    """Parses gin files and bindings; registers every configurable first."""
    import pretrain.trainer  # noqa: F401  (registers run, adamw, EncoderConfig, PipelineConfig, ...)

    for path in files:
        try:
            with open(path):
                pass
        except OSError as e:
            raise GinError(f"cannot read --gin_file {path}: {e.strerror}") from None
    try:
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
    except (ValueError, KeyError, SyntaxError) as e:  # gin's parse errors are ValueError / SyntaxError
        raise GinError(f"{_first_line(e)}: check the spelling in --gin_file / --gin_bindings") from None


class GinError(ValueError):
    """A gin file or binding that does not parse."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().strip("'\"")
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    head = lines[0] if lines else type(e).__name__
    where = next((l for l in lines[1:] if l.startswith("In ") or "line" in l), "")
    return f"{head} ({where})" if where else head


USER_ERRORS = (
    GinError,
    preprocess.PreprocessError,
    shards.ShardsError,
    corpora.CorpusError,
    tokenizers.TokenizerError,
    sharding.MeshError,
    checkpointing.CheckpointError,
    workdir.WorkdirError,
)


@contextlib.contextmanager
def user_errors():
    """Turns the user-facing exceptions (and gin's binding-time errors) into `error: ...` + exit 2."""
    from pretrain.trainer import TrainError

    try:
        yield
    except (*USER_ERRORS, TrainError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except ValueError as e:
        # A config value rejected when gin calls the configurable (e.g. EncoderConfig checks).
        if "In call to configurable" not in str(e):
            raise
        print(f"error: {_first_line(e)}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as e:
        # gin raises RuntimeError for a gin.REQUIRED parameter that no file or binding set.
        if "Required bindings" not in str(e):
            raise
        print(f"error: {_first_line(e)}: set them in the gin file or with --gin_bindings", file=sys.stderr)
        sys.exit(2)
