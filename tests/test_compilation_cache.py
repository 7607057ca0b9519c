"""A restarted run reads its compiled steps from the workdir's persistent compilation cache
(core/compilation_cache.py), as `pretrain.train` runs it."""

import json
import os
import re

import jax
import pytest

from bench import restart
from core import compilation_cache
from tests import fault_injection


def test_the_setting_names_the_directory(monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert compilation_cache.directory("workdir", "/runs/a") == "/runs/a/compilation_cache"
    assert compilation_cache.directory("off", "/runs/a") is None
    assert compilation_cache.directory("gs://bucket/cache", "/runs/a") == "gs://bucket/cache"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/shared/cache")  # the environment's is kept
    assert compilation_cache.directory("workdir", "/runs/a") == "/shared/cache"
    assert compilation_cache.directory("/mine", "/runs/a") == "/mine"


@pytest.mark.slow(90)
@pytest.mark.extended
def test_a_restart_reads_its_steps_from_the_workdirs_cache(tmp_path, monkeypatch, capsys):
    """bench.restart: preempted (SIGTERM) and started again with the same command, the run
    reads its train step from <workdir>/compilation_cache instead of compiling it."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")  # conftest's shared cache: use the workdir's
    # Every compilation is written (conftest's setting; JAX's default writes those over 1 s,
    # which the steps are on an accelerator and not always on a CPU at -O0).
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    gin_file = fault_injection.write_setup(str(tmp_path))
    assert restart.main([f"--gin_file={gin_file}", f"--workdir={tmp_path}", "--caches=workdir"]) == 0
    cached = json.loads(capsys.readouterr().out)
    cache = os.path.join(tmp_path, "workdir", "compilation_cache")
    assert cached["exit_status"] == 0 and cached["first_step_seconds"] > 0
    assert re.fullmatch(
        rf"compilation cache {re.escape(cache)}: [1-9]\d* of \d+ compilations read from it .*",
        cached["cache"],
    )
    assert "train_step" in cached["steps_read_from_cache"]  # (it stopped before its first evaluation)


def test_off_turns_the_cache_off_and_workdir_turns_it_back_on(tmp_path):
    with compilation_cache.enabled("off", str(tmp_path)) as usage:
        assert not jax.config.jax_enable_compilation_cache and usage.summary() == "compilation cache: off"
    with compilation_cache.enabled("workdir", str(tmp_path)) as usage:  # conftest's, from the environment
        assert (
            jax.config.jax_enable_compilation_cache and usage.path == os.environ["JAX_COMPILATION_CACHE_DIR"]
        )
        jax.jit(lambda x: x * 3 + 1)(1.0)
    assert usage.requests == 1 and not os.listdir(tmp_path)
