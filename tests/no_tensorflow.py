"""Importing this module makes importing TensorFlow, TensorBoard or TFDS fail in this process,
as on an accelerator host with only JAX installed.

    python -m tests.no_tensorflow MODULE ARGS...

runs MODULE as `python -m MODULE ARGS...` would under that block, then asserts that none of
them was loaded (the tests of what needs no TensorFlow: the step, the benchmarks,
checkpointing).
"""

import runpy
import sys

BLOCKED = ("tensorflow", "tensorboard", "tensorflow_datasets")


# As if not installed: `import tensorflow` raises ModuleNotFoundError and
# importlib.util.find_spec("tensorflow") returns None (etils.epath asks it before choosing a
# file backend).
for _name in BLOCKED:
    sys.modules[_name] = None


def assert_none_loaded() -> None:
    loaded = [m for m, module in sys.modules.items() if m.split(".")[0] in BLOCKED and module is not None]
    assert not loaded, f"loaded although blocked: {loaded[:5]}"


if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    try:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    finally:
        assert_none_loaded()
