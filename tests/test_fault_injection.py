"""CI runs the fault-injection script (tests/fault_injection.py) in full: SIGKILLs at random
steps, a SIGKILL during a save, SIGTERM, three kinds of damaged checkpoint and a disk
that fills up during a save, each ending on the uninterrupted run's parameters."""

import json
import subprocess
import sys

import pytest

from tests import fault_injection


@pytest.mark.slow(370)  # seconds on the 2-core CI machine
def test_fault_injection_survives_everything():
    result = subprocess.run(
        [sys.executable, "-m", "tests.fault_injection", "--kills=3", "--seed=1"],
        cwd=fault_injection.ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(report["sigkill"]["killed_at"]) == 3
    damaged = report["corruption"]["damaged"]  # {step: damage}; JSON keys are strings
    assert set(damaged.values()) == {"delete_array_file", "truncate_array_file", "delete_iterator_state"}
    assert report["corruption"]["resumed_from"] < min(int(step) for step in damaged)
    assert report["sigterm"]["exit_code"] == 0
    assert "last complete checkpoint" in report["disk_full"]["error"]
