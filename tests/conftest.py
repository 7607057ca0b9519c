"""Test setup, set before JAX is imported anywhere: 8 fake CPU devices, and a persistent
compilation cache shared by every test and the subprocesses they start (the training CLI,
the fault-injection runs), so that the same tiny step is compiled once per `make test`
rather than once per run: compilation is most of this suite's time on 2 cores. Cached
executables are keyed by the HLO, the XLA flags and the jax version, so results do not
change (the resume tests compare parameter hashes with and without a restart). The cache
lives in .jax_cache/ (ignored by git; about 40 MB after a run), capped at 1 GiB, least
recently used entries evicted first."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(ROOT, ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2**30))


def pytest_collection_modifyitems(items):
    """Tests marked `slow(seconds)` (the fault-injection script, the demo, the ablation
    grid) start first, longest first: `make test` hands whole files to two workers in
    collection order (`--no-loadscope-reorder`), and a 6-minute file started last would
    leave one worker idle while it finishes."""

    def seconds(item):
        marker = item.get_closest_marker("slow")
        return marker.args[0] if marker else 0

    items.sort(key=seconds, reverse=True)
