"""CI runs the fault-injection script (tests/fault_injection.py): a SIGKILL at a random step,
a SIGKILL during a save, SIGTERM, a disk that fills up during a save and three kinds of
damaged checkpoint, each ending on the uninterrupted run's parameters. One kill: each kill
is the same resume, which the later scenarios repeat; the script's default (3) is for a
longer hunt by hand."""

import json
import subprocess
import sys

import pytest

from tests import fault_injection


@pytest.mark.slow(280)  # seconds on the 2-core CI machine
@pytest.mark.extended
def test_fault_injection_survives_everything():
    result = subprocess.run(
        [sys.executable, "-m", "tests.fault_injection", "--kills=1", "--seed=1"],
        cwd=fault_injection.ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(report["sigkill"]["killed_at"]) == 1
    damaged = report["corruption"]["damaged"]  # {step: damage}; JSON keys are strings
    assert set(damaged.values()) == {"delete_array_file", "truncate_array_file", "delete_iterator_state"}
    assert report["corruption"]["resumed_from"] < min(int(step) for step in damaged)
    assert report["sigterm"]["exit_code"] == 0
    assert report["sigterm"]["stopped_at"] > report["sigkill"]["killed_at"][-1]  # one chain
    assert "last complete checkpoint" in report["disk_full"]["error"]
