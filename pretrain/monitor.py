"""The step metrics between log lines: kept on device, fetched at log and checkpoint steps,
checked for non-finite values (the divergence policy), and summed into window means."""

from __future__ import annotations

import logging

import jax
import numpy as np

from core.checkpointing import Checkpointer
from core.errors import UserError
from pretrain.objectives import Objective

log = logging.getLogger(__name__)

# Per-step values that are not metric sums of the objective.
STEP_VALUES = ("loss", "grad_norm", "learning_rate", "finite")


class DivergedError(UserError):
    """A non-finite loss or gradient norm beyond the skip budget (one line, user-facing)."""


class StepMonitor:
    """Holds the per-step metrics on device until they are needed, and checks them.

    Metrics are fetched (a host sync) only at log and checkpoint steps. Every fetched
    step is checked: a non-finite loss or gradient norm is skipped and logged while the
    skip budget lasts, and otherwise stops the run before anything else is saved.
    """

    def __init__(self, objective: Objective, max_skipped_steps: int, ckpt: Checkpointer, workdir: str):
        self.objective = objective
        self.max_skipped_steps = max_skipped_steps
        self.skipped = 0
        self._ckpt = ckpt
        self._workdir = workdir
        self._on_device: list[dict[str, jax.Array]] = []
        self._window: list[dict[str, np.ndarray]] = []

    def add(self, metrics: dict[str, jax.Array]) -> None:
        self._on_device.append(metrics)

    def check(self, step: int) -> None:
        """Fetches the metrics of the steps up to `step` (a sync: they are complete
        afterwards) and checks each one."""
        fetched = jax.device_get(self._on_device)
        self._on_device = []
        first = step - len(fetched) + 1
        for offset, metrics in enumerate(fetched):
            if metrics["finite"]:
                self._window.append(metrics)
                continue
            at = first + offset
            what = f"loss {float(metrics['loss']):.4g}, gradient norm {float(metrics['grad_norm']):.4g}"
            if self.skipped < self.max_skipped_steps:
                self.skipped += 1
                log.warning(
                    "step %d: non-finite %s: update skipped (%d of at most %d)",
                    at,
                    what,
                    self.skipped,
                    self.max_skipped_steps,
                )
                continue
            self._ckpt.wait()
            last = self._ckpt.latest_step()
            where = f"step {last} in {self._workdir}/checkpoints" if last is not None else "none yet"
            budget = (
                f"after {self.skipped} skipped steps (run.max_skipped_steps = {self.max_skipped_steps})"
                if self.max_skipped_steps
                else "(set run.max_skipped_steps to skip such steps)"
            )
            raise DivergedError(
                f"non-finite {what} at step {at} {budget}; nothing after it was saved; "
                f"last good checkpoint: {where}: lower the learning rate or check the data"
            )

    def summary(self, step: int) -> dict[str, float]:
        """Means over the finite steps since the last summary (objective.summarize), plus the
        last gradient norm and learning rate. Fetches (syncs) up to `step` first."""
        self.check(step)
        window, self._window = self._window, []
        if not window:
            return {"skipped_steps": self.skipped}
        sums = {k: float(np.sum([m[k] for m in window])) for k in window[0] if k not in STEP_VALUES}
        out = self.objective.summarize(sums)
        out.update(
            grad_norm=float(window[-1]["grad_norm"]),
            learning_rate=float(window[-1]["learning_rate"]),
            skipped_steps=self.skipped,
        )
        return out
