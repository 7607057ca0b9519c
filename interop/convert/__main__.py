"""`python -m interop.convert`: the command line of interop/convert/cli.py."""

import sys

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from interop.convert.cli import main

if __name__ == "__main__":
    sys.exit(main())
