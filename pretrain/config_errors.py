"""gin parsing and user-facing errors for the CLIs: one `error:` line, never a traceback.

Every error a user can cause (a typo in a gin binding, a missing corpus, a vocab-size
mismatch, a mesh that does not fit) is an exception class with a one-line message;
`user_errors()` prints it as `error: ...` and exits with status 2.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Sequence

import gin

from data import corpora, shards, tokenizers
from pretrain import checkpointing, sharding


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
  except (ValueError, KeyError, SyntaxError, gin.config.ParseError if hasattr(gin.config, "ParseError") else ValueError) as e:
    raise GinError(_first_line(e)) from None


class GinError(ValueError):
  """A gin file or binding that does not parse."""


def _first_line(e: BaseException) -> str:
  text = str(e).strip().strip("'\"")
  lines = [l.strip() for l in text.splitlines() if l.strip()]
  head = lines[0] if lines else type(e).__name__
  where = next((l for l in lines[1:] if l.startswith("In ") or "line" in l), "")
  return f"{head} ({where})" if where else head


USER_ERRORS = (GinError, shards.ShardsError, corpora.CorpusError, tokenizers.TokenizerError,
               sharding.MeshError, checkpointing.CheckpointError)


@contextlib.contextmanager
def user_errors():
  """Turns the user-facing exceptions (and gin's binding-time errors) into `error: ...` + exit 2."""
  from pretrain.trainer import TrainError
  try:
    yield
  except (*USER_ERRORS, TrainError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except (TypeError, ValueError) as e:
    # gin reports a binding of a parameter that does not exist when the function is called.
    if "gin" in str(e) or "configurable" in str(e).lower() or "binding" in str(e).lower():
      print(f"error: {_first_line(e)}", file=sys.stderr)
      sys.exit(2)
    raise
