"""What every command-line tool sets before its imports: every tool imports this module
first, before anything imports TensorFlow.

TensorFlow's environment (TensorFlow reads these variables once, when it is loaded; values
the user has set are kept). We use TensorFlow only for tf.data, tf.io.gfile,
tf.train.Example and tf.summary, so:

- TF_CPP_MIN_LOG_LEVEL=2 and TF_ENABLE_ONEDNN_OPTS=0: no C++ start-up chatter on the
  console (the oneDNN notice is logged before TF_CPP_MIN_LOG_LEVEL applies; oneDNN's
  kernels only matter for TensorFlow's own math, which we do not run);
- TF_USE_LEGACY_KERAS=1: `import tensorflow` eagerly imports Keras 3 (and through it
  scikit-learn and matplotlib), about 1.9 s of every tool's start-up on 2 cores; pointed
  at the legacy `tf_keras` package, which is not installed, it skips that import. Nothing
  here uses tf.keras.

Ctrl-C while a tool is still importing (TensorFlow and JAX take seconds) ends it with one
line instead of a traceback through the import machinery: nothing has been done yet.
`core.cli.entry` puts Python's own handler back when the tool starts (it reports a later
Ctrl-C in one line itself). A SIGINT that is ignored (a background job, a preprocessing
worker) stays ignored, and only a tool run as `python -m PACKAGE.TOOL` of this repository
is affected, never a program that imports it (pytest).
"""

import os
import signal
import sys

for _name, _value in (
    ("TF_CPP_MIN_LOG_LEVEL", "2"),
    ("TF_ENABLE_ONEDNN_OPTS", "0"),
    ("TF_USE_LEGACY_KERAS", "1"),
):
    os.environ.setdefault(_name, _value)

_TOOL_PACKAGES = ("bench", "data", "finetune", "interop", "pretrain", "core", "tests")


def _interrupted_while_starting(signum, frame) -> None:
    del signum, frame
    sys.stderr.write("error: interrupted (Ctrl-C) while starting; nothing was done\n")
    sys.stderr.flush()
    os._exit(130)


_main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
if (
    _main_spec is not None
    and _main_spec.name.split(".")[0] in _TOOL_PACKAGES
    and signal.getsignal(signal.SIGINT) is signal.default_int_handler
):
    signal.signal(signal.SIGINT, _interrupted_while_starting)
