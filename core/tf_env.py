"""TensorFlow's environment, set when this module is imported: every command-line tool
imports it first, before anything imports TensorFlow (which reads these variables once,
when it is loaded). Values the user has set are kept.

We use TensorFlow only for tf.data, tf.io.gfile, tf.train.Example and tf.summary, so:

- TF_CPP_MIN_LOG_LEVEL=2 and TF_ENABLE_ONEDNN_OPTS=0: no C++ start-up chatter on the
  console (the oneDNN notice is logged before TF_CPP_MIN_LOG_LEVEL applies; oneDNN's
  kernels only matter for TensorFlow's own math, which we do not run);
- TF_USE_LEGACY_KERAS=1: `import tensorflow` eagerly imports Keras 3 (and through it
  scikit-learn and matplotlib), about 1.9 s of every tool's start-up on 2 cores; pointed
  at the legacy `tf_keras` package, which is not installed, it skips that import. Nothing
  here uses tf.keras.
"""

import os

for _name, _value in (
    ("TF_CPP_MIN_LOG_LEVEL", "2"),
    ("TF_ENABLE_ONEDNN_OPTS", "0"),
    ("TF_USE_LEGACY_KERAS", "1"),
):
    os.environ.setdefault(_name, _value)
