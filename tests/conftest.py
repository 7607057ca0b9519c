"""Test setup, done before JAX or TensorFlow is imported anywhere; subprocesses that the
tests start (the training CLI, the fault-injection runs) inherit it.

- 8 fake CPU devices, so that sharding tests see a mesh.
- XLA's CPU backend at optimisation level 0: compiling the tiny test programs is most of
  this suite's time on 2 cores, and level 0 compiles them about twice as fast (they then
  run about 1.5x slower, which costs little at these sizes). Only LLVM's code generation
  changes, not the program: every comparison in the suite is between runs with the same
  flags, or against a reference with a tolerance.
- A persistent compilation cache shared by every test and subprocess, so that the same
  step is compiled once per `make test`. Cached executables are keyed by the HLO, the XLA
  flags and the jax version, so results do not change (the resume tests compare parameter
  hashes with and without a restart). It lives in .jax_cache/ (ignored by git; about 100 MB
  after a run). JAX's own size cap is off: with it, every write reads the access time of
  every entry (thousands), and fails for good once one entry has none (as a process
  without the cap writes them). Instead the cache is emptied before a test run that finds
  it over 1 GiB (`pytest_configure`).
- TensorFlow's quiet, Keras-free start (core/tf_env.py), as every tool sets it.
"""

import gc
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_flags = os.environ.get("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
if "--xla_backend_optimization_level" not in _flags:
    _flags += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(ROOT, ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", "-1")
CACHE_CAP_BYTES = 2**30

import core.tf_env  # noqa: E402, F401  (TensorFlow's environment, before TensorFlow is imported)

# What the second worker imports before collection (the first collects at once, and its first
# test modules import TensorFlow first): on a fresh venv, whose libraries have no bytecode yet
# (`pip install --no-compile`), the two workers then compile different halves of the heavy
# libraries at the same time instead of the same modules twice (about 43 s of compiling
# each, one half about 24 s), and read the other half's bytecode afterwards.
_SECOND_WORKER_FIRST = (
    "torch",
    "transformers",
    "jax",
    "flax.linen",
    "optax",
    "orbax.checkpoint",
    "sklearn.metrics",
)


def pytest_configure(config):
    """Empties the compilation cache when it has grown over CACHE_CAP_BYTES (a developer's
    .jax_cache/ after many runs of changing code), before any test or worker writes to it:
    the controller process of `pytest -n`, or the only one. In the second worker of `pytest
    -n 2`, imports _SECOND_WORKER_FIRST."""
    if hasattr(config, "workerinput"):
        if config.workerinput.get("workerid") == "gw1":
            for module in _SECOND_WORKER_FIRST:
                importlib.import_module(module)
        return
    cache = os.environ["JAX_COMPILATION_CACHE_DIR"]
    if not os.path.isdir(cache):
        return
    with os.scandir(cache) as entries:
        files = [entry for entry in entries if entry.is_file()]
    if sum(entry.stat().st_size for entry in files) > CACHE_CAP_BYTES:
        for entry in files:
            os.remove(entry.path)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the markers
def pytest_collection_modifyitems(items):
    """The tiers and the order.

    A parametrized test marked `extended(keep=[ids])` is in the extended tier except its cases
    with those ids, which `make test` runs: one case of each proof there, every case in CI.

    Tests marked `slow(seconds)` (the fault-injection script, the local pods, the demo, the
    ablation grids) start first, longest first: `make test` hands whole files to two workers in
    collection order (`--no-loadscope-reorder`), and a 6-minute file started last would
    leave one worker idle while it finishes."""
    for item in items:
        marker = item.get_closest_marker("extended")
        callspec = getattr(item, "callspec", None)
        if marker and callspec and callspec.id in marker.kwargs.get("keep", ()):
            item.own_markers = [m for m in item.own_markers if m is not marker]

    def seconds(item):
        marker = item.get_closest_marker("slow")
        return marker.args[0] if marker and marker.args else 0

    items.sort(key=seconds, reverse=True)


def pytest_collection_finish(session):
    """Moves every object alive after collection (the modules of TensorFlow, JAX, torch and
    transformers that the test modules import: millions of objects) out of the garbage
    collector's view (`gc.freeze`). Python's full collections during the tests, the five that
    pytest runs at the end of each process (its unraisable-exception check) and the one at
    interpreter exit would otherwise traverse them all, about a second each per worker; none
    of them is garbage."""
    del session
    gc.freeze()


@pytest.fixture(scope="session")
def synthetic_shards(tmp_path_factory) -> str:
    """Shards of synthetic documents (data/synthetic.py: 100 for training, 12 held out, token
    ids that name document and sentence), written once per test session; tests/tiny.py trains
    on them."""
    from data import synthetic

    return synthetic.write_shards(
        str(tmp_path_factory.mktemp("synthetic_shards")),
        synthetic.make_documents(100, seed=1, max_len=8),
        synthetic.make_documents(12, seed=2, max_len=8, first_id=150),
    )


@pytest.fixture(scope="session")
def text_shards(tmp_path_factory) -> str:
    """Shards of real English (the first 80 documents of the demo corpus, 10% held out) with a
    600-token WordPiece vocabulary trained on them, written once per test session: for what
    needs words (whole-word and span masking) or a tokenizer (fine-tuning on text)."""
    from data import tokenizers

    return _demo_shards(tmp_path_factory.mktemp("text_shards"), 80, tokenizers.train_wordpiece)


@pytest.fixture(scope="session")
def xlnet_shards(tmp_path_factory) -> str:
    """Shards of the first 120 documents of the demo corpus (10% held out) with a 600-piece
    XLNet SentencePiece vocabulary (<eod>, XLNet's start pieces) trained on them, written once
    per test session: XLNet's row streams read them."""
    from data import tokenizers

    return _demo_shards(tmp_path_factory.mktemp("xlnet_shards"), 120, tokenizers.train_xlnet_sentencepiece)


def _demo_shards(base, documents: int, train_tokenizer) -> str:
    """BASE/data: shards (2 + 1) of the demo corpus's first `documents` documents, 10% held
    out, tokenized by `train_tokenizer(documents, 600)` (saved in BASE/tokenizer)."""
    from data import corpora, preprocess

    docs = [d.sentences for d in corpora.demo_documents()[:documents]]
    train_tokenizer(docs, 600).save(str(base / "tokenizer"))
    corpus = base / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
    data_dir = str(base / "data")
    preprocess.preprocess(
        str(corpus),
        str(base / "tokenizer"),
        data_dir,
        num_shards=2,
        eval_fraction=0.1,
        num_workers=1,
        log=lambda message: None,
    )
    return data_dir
