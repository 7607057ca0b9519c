"""Training rates that agree with the wall clock.

JAX dispatches a step and returns before the device has run it, so a clock read right
after `train_step(...)` returns measures dispatch, not training. Every rate here is timed
from completed step to completed step: a window starts and ends at a moment when the
caller has just fetched something a step computed (its metrics), so the step is done.
Work inside `paused()` (evaluation) is excluded from the rates and from the training
time, and the ETA adds it back for the evaluations still to come.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator


class Throughput:
    """Steps, non-pad tokens and model FLOPs per second, measured by the wall clock.

        rates = Throughput(total_steps)
        rates.start()                 # before the first step is dispatched
        ... each step:                rates.add(tokens, flops)
        ... after the first step completes (a sync):      rates.begin()
        ... at a log step, right after the metrics fetch:  values = rates.close(step)
        ... around an evaluation (after a sync):           with rates.paused(): ...
        rates.totals()                # tokens trained / training wall time

    The first window starts at `begin()`, after the first step (which compiles) is done,
    so logged rates are steady-state; `totals()` counts every step and its time,
    compilation included, evaluations excluded.
    """

    def __init__(self, total_steps: int, clock: Callable[[], float] = time.perf_counter):
        self._total_steps = total_steps
        self._clock = clock
        self._start: float | None = None
        self._last_sync: float | None = None
        self._window_start: float | None = None
        self._window = [0, 0, 0.0]  # steps, tokens, flops since the window started
        self._window_paused = 0.0
        self._tokens = 0  # every step since start()
        self._paused = 0.0  # every pause since start()
        self._pauses: list[float] = []

    def start(self) -> None:
        self._start = self._last_sync = self._clock()

    @property
    def started(self) -> bool:
        """Whether `begin()` was called (a step of this run completed)."""
        return self._window_start is not None

    def add(self, tokens: int, flops: float) -> None:
        """Counts one dispatched step of `tokens` non-pad tokens and `flops` model FLOPs."""
        self._tokens += tokens
        if self._window_start is not None:
            self._window = [self._window[0] + 1, self._window[1] + tokens, self._window[2] + flops]

    def begin(self) -> float:
        """Starts the first window (call right after the first step is known complete);
        returns the seconds since start(): the first step, compilation included."""
        now = self._clock()
        self._window_start = self._last_sync = now
        return now - self._start

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Excludes the block from the rates and the training time (enter it after a sync)."""
        start = self._clock()
        try:
            yield
        finally:
            end = self._clock()  # an evaluation ends with a fetch: a sync point too
            seconds = end - start
            self._last_sync = end
            self._window_paused += seconds
            self._paused += seconds
            self._pauses.append(seconds)

    def close(self, step: int, pauses_left: int = 0) -> dict[str, float]:
        """Ends the window at completed step `step` (call right after a sync) and starts the next.

        Returns steps_per_second, tokens_per_second, model_tflops_per_second over the
        window, and eta_seconds: the steps left at this rate plus `pauses_left` more
        pauses (evaluations to come) at the mean length of those so far; {} when no step
        was counted in the window.
        """
        now = self._clock()
        if self._window_start is None:  # no step completed since start(): nothing to rate
            self.begin()
            return {}
        steps, tokens, flops = self._window
        if not steps:
            return {}
        seconds = max(now - self._window_start - self._window_paused, 1e-9)
        mean_pause = sum(self._pauses) / len(self._pauses) if self._pauses else 0.0
        values = {
            "steps_per_second": steps / seconds,
            "tokens_per_second": tokens / seconds,
            "model_tflops_per_second": flops / seconds / 1e12,
            "eta_seconds": (self._total_steps - step) * seconds / max(steps, 1) + pauses_left * mean_pause,
        }
        self._window_start = self._last_sync = now
        self._window = [0, 0, 0.0]
        self._window_paused = 0.0
        return values

    def totals(self) -> dict[str, float]:
        """tokens (non-pad, every step since start()), train_seconds (start() to the last
        sync, evaluations excluded) and tokens_per_second = tokens / train_seconds."""
        seconds = (self._last_sync or 0.0) - (self._start or 0.0) - self._paused
        return {
            "tokens": self._tokens,
            "train_seconds": seconds,
            "tokens_per_second": self._tokens / seconds if seconds > 0 else None,
        }


def format_duration(seconds: float) -> str:
    """A duration as the progress line shows it: `HH:MM:SS`, with days in front from 24 hours
    on (`3d 01:00:00`, where `%H:%M:%S` would wrap to `01:00:00`)."""
    total = max(0, round(seconds))
    days, rest = divmod(total, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}d {clock}" if days else clock
