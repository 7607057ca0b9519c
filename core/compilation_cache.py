"""The persistent XLA compilation cache of a run, so that a restart does not compile again.

Spot TPUs and preemptible GPUs restart a run often, and each restart used to compile the
train and evaluation steps again (minutes for a large model on an accelerator, paid by
every host). JAX can keep compiled executables on disk (its persistent compilation cache;
MaxText sets `jax_cache_dir` the same way); with it a restart reads the steps it compiled
before. The training tools' `--compilation_cache` picks the directory:

    workdir  (default) <workdir>/compilation_cache, beside the checkpoints it serves; but
             a cache the environment names (JAX_COMPILATION_CACHE_DIR) is kept, and
             JAX_ENABLE_COMPILATION_CACHE=false turns it off
    off      no persistent cache
    DIR      any directory JAX can write (a local path or, as for workdirs, gs://...; on
             an object store XLA's own GPU autotuning cache, which JAX would put beside
             it, stays off: XLA writes it through local files only)

The cache holds executables that JAX runs without checking them: a workdir others can write
to is a way to run their code in your job: keep the cache where only you write.

JAX writes only compilations that took at least `jax_persistent_cache_min_compile_time_secs`
(1 s by default: the steps, not the small helpers). `Usage.summary()` says at the end of a
run how many compilations were read from the cache and the compile time that saved.

It is enabled after the tools' checks that every process runs the same command (which
compile a tiny collective), so a refused start creates nothing in the workdir: hence
`reset_cache`, which lets JAX take the directory after its first compilation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache

DEFAULT = "workdir"
SUBDIRECTORY = "compilation_cache"
_ENVIRONMENT = "JAX_COMPILATION_CACHE_DIR"


def directory(setting: str, workdir: str) -> str | None:
    """The cache directory of a `--compilation_cache` setting ("workdir", "off" or a directory)."""
    if setting == "off":
        return None
    if setting == DEFAULT:
        return os.environ.get(_ENVIRONMENT) or os.path.join(workdir, SUBDIRECTORY)
    return setting


@dataclasses.dataclass
class Usage:
    """What the cache did in this process since `enable` (from JAX's monitoring events)."""

    path: str | None
    requests: int = 0  # compilations that looked in the cache
    hits: int = 0  # ... and found their executable there
    seconds_saved: float = 0.0  # the compile time those hits had taken when written

    def on_event(self, event: str, **_) -> None:
        if event == "/jax/compilation_cache/compile_requests_use_cache":
            self.requests += 1
        elif event == "/jax/compilation_cache/cache_hits":
            self.hits += 1

    def on_duration(self, event: str, seconds: float, **_) -> None:
        if event == "/jax/compilation_cache/compile_time_saved_sec":
            self.seconds_saved += seconds

    def summary(self) -> str:
        """One line for the log: 'compilation cache DIR: 2 of 5 compilations read from it (18.4 s
        of compiling saved)'."""
        if self.path is None:
            return "compilation cache: off"
        return (
            f"compilation cache {self.path}: {self.hits} of {self.requests} compilations read from it "
            f"({self.seconds_saved:.1f} s of compiling saved)"
        )


@contextlib.contextmanager
def enabled(setting: str, workdir: str) -> Iterator[Usage]:
    """Points JAX's persistent cache at `directory(setting, workdir)` (or turns it off) for the
    rest of this process, and counts its use inside the block."""
    path = directory(setting, workdir)
    if setting == DEFAULT and os.environ.get("JAX_ENABLE_COMPILATION_CACHE", "").lower() in ("0", "false"):
        path = None  # the environment turned JAX's cache off
    jax_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", path is not None)
    if path is not None:
        if _keep_xla_caches_off(path):
            jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
        jax_cache.set_cache_dir(path)
    with counted(path) as usage:
        yield usage


def environment(path: str) -> dict[str, str]:
    """The environment variables that point a child process's JAX at the cache `path`, every
    compilation written to it (a benchmark's inits that compile in under a second too)."""
    env = {"JAX_COMPILATION_CACHE_DIR": path, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    if _keep_xla_caches_off(path):
        env["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] = "none"
    return env


def _keep_xla_caches_off(path: str) -> bool:
    """Whether to keep XLA's own caches out of `path`: JAX would also point XLA's GPU
    autotuning cache into the directory, through a local-path API that cannot write to an
    object store (gs://); unless the environment chose."""
    return "://" in path and not os.environ.get("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES")


@contextlib.contextmanager
def counted(path: str | None) -> Iterator[Usage]:
    """Counts the use of the cache JAX is configured with (at `path`; None: no cache) inside
    the block, changing nothing: what a benchmark whose environment set the cache reports."""
    usage = Usage(path)
    jax.monitoring.register_event_listener(usage.on_event)
    jax.monitoring.register_event_duration_secs_listener(usage.on_duration)
    try:
        yield usage
    finally:
        jax.monitoring.unregister_event_listener(usage.on_event)
        jax.monitoring.unregister_event_duration_listener(usage.on_duration)
