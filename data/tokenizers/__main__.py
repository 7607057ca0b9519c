"""`python -m data.tokenizers`: the command line of data/tokenizers/cli.py."""

import sys

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from data.tokenizers.cli import main

if __name__ == "__main__":
    sys.exit(main())
