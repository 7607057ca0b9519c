"""What every benchmark here reports, computed the same way for ours and for the peer.

Only jax and numpy are imported, so the peer's separate virtualenv can use this file
too: the matmul peak, peak memory and the result line are measured identically.
"""

from __future__ import annotations

import collections
import functools
import glob
import json
import os
import re
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np


@functools.cache
def matmul_peak_flops(dtype: str, repeats: int = 10) -> float:
    """This device's dense matmul FLOP/s in `dtype` (bf16 inputs accumulate in f32).

    A square matmul of 2048 (CPU) or 8192 (accelerators), best of `repeats`: the
    denominator of MFU. Benchmarks measure it first thing in their process, before the
    model and its data exist: measured after them, the same CPU gave less than half the
    bf16 peak (136 vs 327 GFLOP/s), which made MFU swing with whatever ran before. So it is
    measured once per process and dtype (bench.suite times several models in one process).
    """
    n = 2048 if jax.default_backend() == "cpu" else 8192
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
    b = jnp.asarray(np.random.default_rng(1).standard_normal((n, n)), dtype)
    matmul = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    matmul(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def peak_memory_bytes() -> int:
    """Peak device memory on an accelerator; peak host RSS on CPU (where the arrays live)."""
    device = jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        return int(stats.get("peak_bytes_in_use", 0))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


WARMUP_STEPS = 2  # untimed steps after the compiling one, before the timed ones


def time_steps(step, state, batch, steps: int, warmup: int = WARMUP_STEPS) -> tuple[float, float]:
    """(compile + first step seconds, steady seconds per step) of `step` on one batch.

    `step(state, batch) -> (state, metrics)`; the state is threaded through so donated
    buffers stay valid. Warm-up steps after compilation are not timed.
    """
    return time_alternately([(step, state, batch)], steps, rounds=1, warmup=warmup)[0]


def time_alternately(
    runs, steps: int, rounds: int = 1, warmup: int = WARMUP_STEPS
) -> list[tuple[float, float]]:
    """[(compile + first step seconds, steady seconds per step)] for each (step, state, batch).

    All runs are compiled and warmed up first; then each round times `steps` steps of
    every run in turn, so that drift on a shared machine affects them alike.
    """
    states, compiled = [], []
    for step, state, batch in runs:
        start = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready((state, metrics))
        compiled.append(time.perf_counter() - start)
        for _ in range(warmup):
            state, metrics = step(state, batch)
        jax.block_until_ready((state, metrics))
        states.append(state)
    totals = [0.0] * len(runs)
    for _ in range(rounds):
        for i, (step, _, batch) in enumerate(runs):
            start = time.perf_counter()
            for _ in range(steps):
                states[i], metrics = step(states[i], batch)
            jax.block_until_ready((states[i], metrics))
            totals[i] += time.perf_counter() - start
    return [(c, t / (steps * rounds)) for c, t in zip(compiled, totals)]


def profile_steps(step, state, batch, steps: int, directory: str, top: int = 15) -> list[dict]:
    """Traces `steps` steps of `step` with jax.profiler into `directory` and sums its events.

    The trace (TensorBoard's profile plugin opens it) has one event per executed XLA
    operation (a fusion, a dot, a copy ...) on CPU and, through CUPTI, per kernel on GPU; it
    is read back with `jax.profiler.ProfileData` (the same figures as the perfetto JSON's,
    to the nanosecond). Events are grouped by name with instance numbers dropped
    (`fusion.12` -> `fusion`); returns the `top` groups as [{"op", "ms_per_step",
    "share"}], share = fraction of the summed time of the step's XLA operations.
    """
    state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    jax.profiler.start_trace(directory)
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    jax.profiler.stop_trace()
    (path,) = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True))[-1:]
    per_op = collections.Counter()
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            for event in line.events:
                # Host-side runtime events (PjRt, thread pools, Python) are not operations of the step.
                if re.search(r"::|\$|PjitFunction|^end: |Thunk", event.name):
                    continue
                per_op[re.sub(r"[._]\d+$", "", event.name)] += event.duration_ns / 1e3  # microseconds
    total = sum(per_op.values()) or 1.0
    return [
        {"op": op, "ms_per_step": round(us / steps / 1e3, 3), "share": round(us / total, 4)}
        for op, us in per_op.most_common(top)
    ]


def result_line(
    name: str,
    *,
    batch: int,
    seq: int,
    real_tokens_per_row: float,
    flops_per_row: float,
    dtype: str,
    compile_seconds: float,
    seconds_per_step: float,
    peak_flops: float,
    **extra,
) -> str:
    """The benchmark's last output line: one JSON object with the fields make bench compares.
    peak_flops: `matmul_peak_flops(dtype)` as the process measured it before building anything."""
    model_flops = flops_per_row * batch / seconds_per_step
    return json.dumps(
        {
            "name": name,
            "device": jax.devices()[0].device_kind,
            "num_devices": jax.device_count(),
            "batch": batch,
            "seq": seq,
            "dtype": dtype,
            "compile_seconds": round(compile_seconds, 2),
            "seconds_per_step": round(seconds_per_step, 6),
            "steps_per_second": round(1 / seconds_per_step, 4),
            "tokens_per_second": round(real_tokens_per_row * batch / seconds_per_step, 1),
            "model_tflops_per_second": round(model_flops / 1e12, 4),
            "peak_tflops_per_second": round(peak_flops / 1e12, 4),
            "mfu": round(model_flops / peak_flops, 4),
            "peak_memory_bytes": peak_memory_bytes(),
            **extra,
        }
    )


def synthetic_batch(
    batch: int, seq: int, predictions: int, vocab: int, seed: int = 0
) -> dict[str, np.ndarray]:
    """Full-length rows with P distinct masked positions, as `data.pipeline` emits them.

    input_ids [B, L] int32 (ids in the upper part of the vocab, clear of special tokens),
    input_mask [B, L] all 1, positions [B, L] 0..L-1,
    segment_ids [B, L] (second half 1), masked_lm_positions/ids [B, P] int32,
    masked_lm_weights [B, P] float32 all 1, sentence_label [B] int32; for objectives that
    mask inside the step (ELECTRA): maskable [B, L] int32 (all but the first and last
    token) and mask_id [B] int32 (BERT's [MASK], 103); for SpanBERT's span boundary objective:
    sbo_left, sbo_right [B, P] int32 (each masked position a one-token span between its
    neighbours), sbo_offset [B, P] int32 (0) and sbo_weights [B, P] float32 (all 1); for
    XLNet's permutation LM: functional [B, L] int32 (<sep> at 3L/4, <sep> <cls> at the end),
    target_positions [B, P] int32 (the masked positions), target_weights [B, P] float32 (all
    1; the objective drops a slot on a functional token) and direction [B] int32 (+1, -1, ...).
    """
    rng = np.random.default_rng(seed)
    functional = np.zeros((batch, seq), np.int32)
    functional[:, [seq * 3 // 4, seq - 2, seq - 1]] = 1
    input_ids = rng.integers(min(1000, vocab // 2), vocab, (batch, seq), dtype=np.int32)
    positions = np.sort(
        np.stack([rng.choice(np.arange(1, seq - 1), predictions, replace=False) for _ in range(batch)])
    )
    return {
        "input_ids": input_ids,
        "input_mask": np.ones((batch, seq), np.int32),
        "positions": np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq)).copy(),
        "segment_ids": (np.arange(seq)[None, :] >= seq // 2).astype(np.int32).repeat(batch, 0),
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": np.take_along_axis(input_ids, positions, axis=1),
        "masked_lm_weights": np.ones((batch, predictions), np.float32),
        "sentence_label": rng.integers(0, 2, batch, dtype=np.int32),
        "maskable": np.pad(np.ones((batch, seq - 2), np.int32), ((0, 0), (1, 1))),
        "mask_id": np.full((batch,), 103, np.int32),
        "sbo_left": (positions - 1).astype(np.int32),
        "sbo_right": (positions + 1).astype(np.int32),
        "sbo_offset": np.zeros((batch, predictions), np.int32),
        "sbo_weights": np.ones((batch, predictions), np.float32),
        "functional": functional,
        "target_positions": positions.astype(np.int32),
        "target_weights": np.ones((batch, predictions), np.float32),
        "direction": np.where(np.arange(batch) % 2 == 0, 1, -1).astype(np.int32),
    }


def all_positions_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same batch with the MLM head run at every position (P = L), like the peer.

    masked_lm_positions become 0..L-1, masked_lm_ids the original token at each masked
    position (any id elsewhere) and masked_lm_weights 1 only at the masked positions, so
    the loss is the masked-only batch's while the head decodes [B, L, V] logits: what
    masked-position decoding saves, measured (`bench.pretrain --without=masked_decoding`).
    """
    batch_size, seq = batch["input_ids"].shape
    rows = np.arange(batch_size)[:, None]
    positions = batch["masked_lm_positions"]
    ids = batch["input_ids"].copy()
    ids[rows, positions] = batch["masked_lm_ids"]
    weights = np.zeros((batch_size, seq), np.float32)
    weights[rows, positions] = batch["masked_lm_weights"]
    return dict(
        batch,
        masked_lm_positions=np.broadcast_to(np.arange(seq, dtype=np.int32), (batch_size, seq)).copy(),
        masked_lm_ids=ids,
        masked_lm_weights=weights,
    )
