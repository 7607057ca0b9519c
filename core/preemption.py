"""Stopping cleanly when the machine is about to go away (TPU preemption, Ctrl-C, `kill`).

A TPU VM gets SIGTERM shortly before it is preempted. On one host, SIGTERM or SIGINT
sets a flag and the loop stops after the step in flight, saves a checkpoint and exits
0. On several hosts every host must stop at the *same* step, or the collective save
would hang: there JAX's preemption sync service (started by jax.distributed.initialize)
catches SIGTERM on any host and `reached_preemption_sync_point(step)` turns True on
all hosts at one agreed step (SIGINT keeps its default meaning there). On one host a
second SIGINT interrupts at once.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

import jax
from jax.experimental import multihost_utils

log = logging.getLogger(__name__)


class StopWatcher:
    """`should_stop(step)` is True once a stop was requested (and agreed on, on several hosts).

    Use as a context manager around the training loop; it restores the previous signal
    handlers on exit. Call `should_stop` after every step on every host.
    """

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopWatcher:
        if jax.process_count() == 1:
            # On a pod, JAX's preemption notifier owns SIGTERM; replacing its handler
            # would leave the other hosts running past the step this host saves.
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._request)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _request(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: the user does not want to wait
        self.signal_name = signal.Signals(signum).name
        log.warning("%s received: stopping after the current step and saving a checkpoint", self.signal_name)

    def should_stop(self, step: int) -> bool:
        if jax.process_count() > 1:
            if multihost_utils.reached_preemption_sync_point(step):
                self.signal_name = self.signal_name or "SIGTERM"
                return True
            return False
        return self.signal_name is not None
