"""The workdir lease (core/lease.py): one live run per workdir, dead holders taken over, a
lost lease noticed; on a local disk and through the object store's generation preconditions.

A holder "elsewhere" is a record with another machine id, written by the test: what a run on
another host of a shared disk or bucket leaves there."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from google.api_core import exceptions
from google.cloud import storage

from core import lease

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _elsewhere(renewed_ago: float = 0.0) -> lease.Holder:
    now = time.time()
    return lease.Holder(
        "tpu-vm-7", 4242, "tpu-vm-7:boot:1", None, "pretraining", "a1b2c3", now - 600, now - renewed_ago
    )


def _write(workdir, holder: lease.Holder) -> None:
    (workdir / lease.LEASE_FILE).write_bytes(holder.encode())


def test_a_second_launch_is_refused_while_the_first_lives_and_writes_nothing(tmp_path):
    with lease.held(str(tmp_path), "pretraining"):
        before = (tmp_path / lease.LEASE_FILE).read_bytes()
        with pytest.raises(lease.LeaseError) as refused:
            lease.acquire(str(tmp_path), "finetune.glue")
        assert (tmp_path / lease.LEASE_FILE).read_bytes() == before
    message = str(refused.value)
    assert message.startswith(f"workdir '{tmp_path}' is in use by pretraining (pid {os.getpid()} on ")
    assert "renewed 0 s ago): wait for it to end, stop it" in message and "\n" not in message
    assert not (tmp_path / lease.LEASE_FILE).exists()  # released at the end
    lease.acquire(str(tmp_path), "pretraining").release()  # and free again


def test_a_holder_killed_on_this_machine_is_taken_over_at_once(tmp_path, caplog):
    code = (
        "import sys, time; from core import lease; "
        f"lease.acquire({str(tmp_path)!r}, 'pretraining'); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(lease.LeaseError, match=f"in use by pretraining \\(pid {holder.pid} "):
            lease.acquire(str(tmp_path), "pretraining")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="core.lease"):
        taken = lease.acquire(str(tmp_path), "pretraining")
    taken.release()
    assert time.monotonic() - start < 5
    assert f"took over the lease of pretraining (pid {holder.pid}" in caplog.text
    assert "whose process has ended" in caplog.text


def test_a_holder_elsewhere_that_renews_is_alive(tmp_path):
    _write(tmp_path, _elsewhere())
    store = lease.LocalStore(str(tmp_path / lease.LEASE_FILE))
    stop = threading.Event()

    def renew():
        while not stop.wait(0.2):
            data, generation = store.read()
            store.replace(lease.Holder.parse(data).renewed_now().encode(), generation)

    renewer = threading.Thread(target=renew)
    renewer.start()
    start = time.monotonic()
    try:
        with pytest.raises(
            lease.LeaseError, match="in use by pretraining \\(pid 4242 on tpu-vm-7, launch a1b2c3"
        ):
            lease.take(str(tmp_path), "pretraining", timeout=5, poll=0.05)
    finally:
        stop.set()
        renewer.join()
    assert time.monotonic() - start < 2  # refused at its first renewal, not after the timeout


def test_a_holder_elsewhere_that_stops_renewing_is_taken_over_after_the_timeout(tmp_path, caplog):
    _write(tmp_path, _elsewhere())
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="core.lease"):
        record, _ = lease.take(str(tmp_path), "pretraining", timeout=1.0, poll=0.05)
    assert time.monotonic() - start >= 1.0
    assert "waiting up to 1 s for it to renew (alive) or not (dead)" in caplog.text
    assert "took over the lease of pretraining (pid 4242 on tpu-vm-7" in caplog.text
    assert "not renewed for over 1 s" in caplog.text
    assert lease.Holder.parse((tmp_path / lease.LEASE_FILE).read_bytes()) == record
    assert record.pid == os.getpid()


def test_a_lease_not_renewed_for_longer_than_the_timeout_is_taken_at_once(tmp_path):
    _write(tmp_path, _elsewhere(renewed_ago=3600))
    start = time.monotonic()
    lease.take(str(tmp_path), "pretraining", timeout=60, poll=0.05)
    assert time.monotonic() - start < 1


def test_an_unreadable_lease_file_is_taken_over(tmp_path, caplog):
    (tmp_path / lease.LEASE_FILE).write_text('{"host": "half a reco')
    with caplog.at_level(logging.WARNING, logger="core.lease"):
        lease.take(str(tmp_path), "pretraining")
    assert "took over the lease of an unreadable lease file" in caplog.text


def test_a_run_whose_lease_was_taken_over_stops_and_leaves_the_other_runs(tmp_path):
    held = lease.acquire(str(tmp_path), "pretraining", renew_every=0.05)
    held.check()
    usurper = dataclasses.replace(_elsewhere(), launch_id="d4e5f6")
    _write(tmp_path, usurper)  # another launch took it while this one was paused
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            held.check()
        except lease.LeaseLostError as e:
            lost = str(e)
            break
        time.sleep(0.05)
    else:
        pytest.fail("the lost lease was not noticed")
    held.release()
    assert (
        "is no longer this run's: its lease is held by pretraining (pid 4242 on tpu-vm-7, launch d4e5f6"
        in lost
    )
    assert "stops without writing more" in lost
    assert lease.Holder.parse((tmp_path / lease.LEASE_FILE).read_bytes()) == usurper  # not deleted


def test_a_run_paused_past_the_timeout_checks_before_it_writes(tmp_path):
    """A holder whose renewals stopped (paused, cut off) does not wait for its thread: its
    next check renews there and then, and finds the launch that took the workdir over."""
    held = lease.acquire(str(tmp_path), "pretraining", timeout=2, renew_every=3600)
    held.check()  # fresh: nothing to do
    _write(tmp_path, dataclasses.replace(_elsewhere(), launch_id="d4e5f6"))
    held._renewed -= 10  # as if paused for 10 s of a 2 s timeout
    with pytest.raises(lease.LeaseLostError, match="its lease is held by pretraining \\(pid 4242"):
        held.check()
    held.release()
    assert lease.Holder.parse((tmp_path / lease.LEASE_FILE).read_bytes()).launch_id == "d4e5f6"


class _LostReplies(lease.LocalStore):
    """A store whose writes land but whose next `lost` replies say they failed: what a
    retried conditional write on gs:// reports when its first attempt had landed."""

    def __init__(self, path, lost: int):
        super().__init__(path)
        self.lost = lost

    def _reply(self, generation):
        if generation is not None and self.lost:
            self.lost -= 1
            return None
        return generation

    def create(self, data):
        return self._reply(super().create(data))

    def replace(self, data, generation):
        return self._reply(super().replace(data, generation))


def test_a_write_whose_reply_was_lost_is_recognised_as_this_runs_own(tmp_path):
    store = _LostReplies(str(tmp_path / lease.LEASE_FILE), lost=1)
    record, _ = lease.take(str(tmp_path), "pretraining", store=store)  # not "in use by" itself
    held = lease.Lease(str(tmp_path), store, record, store.read()[1])
    store.lost = 1
    held._renew()  # the renewal landed, its reply was lost: adopted, not taken for a takeover
    held.check()
    assert lease.Holder.parse((tmp_path / lease.LEASE_FILE).read_bytes()).launch_id == record.launch_id
    held.release()
    assert not (tmp_path / lease.LEASE_FILE).exists()


def test_a_removed_lease_file_is_written_again(tmp_path, caplog):
    held = lease.acquire(str(tmp_path), "pretraining", renew_every=3600)
    os.remove(tmp_path / lease.LEASE_FILE)
    with caplog.at_level(logging.WARNING, logger="core.lease"):
        held._renew()
    held.check()
    assert "the lease file was removed; this run wrote it again" in caplog.text
    assert (tmp_path / lease.LEASE_FILE).exists()
    held.release()


def test_the_refusal_says_how_to_stop_the_holder(tmp_path):
    """SIGTERM stops pretraining with a checkpoint; the other tools just end."""
    glue = dataclasses.replace(
        _elsewhere(), tool="finetune.glue", machine=lease._this_machine(), pid=os.getpid()
    )
    message = str(lease._refusal("W", glue))
    assert "stop it (kill " in message and "SIGTERM" not in message
    assert "stop it (SIGTERM stops it with a checkpoint: kill " in str(lease._refusal("W", _elsewhere()))


def test_renewal_rewrites_the_record(tmp_path):
    held = lease.acquire(str(tmp_path), "pretraining", renew_every=0.05)
    first = json.loads((tmp_path / lease.LEASE_FILE).read_text())
    time.sleep(0.3)
    second = json.loads((tmp_path / lease.LEASE_FILE).read_text())
    held.release()
    assert second["renewed"] > first["renewed"] and second["launch_id"] == first["launch_id"]


def test_an_unwritable_workdir_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(
        lease.LeaseError, match="cannot take the lease of workdir .*: check that it is writable"
    ):
        lease.acquire(str(blocker / "run"), "pretraining")


# ------------------------------------------------------------------------- gs://


class _Blob:
    """google.cloud.storage.Blob's generation semantics, in memory: every method the lease's
    GcsStore calls, with the real one's keyword (checked below against the library)."""

    def __init__(self, bucket: _Bucket, name: str, generation: int | None = None):
        self.bucket, self.name, self.generation = bucket, name, generation

    def _check(self, if_generation_match):
        current = self.bucket.objects.get(self.name, (None, 0))[1]
        if if_generation_match is not None and current != if_generation_match:
            raise exceptions.PreconditionFailed("conditionNotMet")

    def download_as_bytes(self, if_generation_match=None):
        if self.name not in self.bucket.objects:
            raise exceptions.NotFound("gone")
        self._check(if_generation_match)
        return self.bucket.objects[self.name][0]

    def upload_from_string(self, data, content_type=None, if_generation_match=None):
        self._check(if_generation_match)
        self.bucket.generation += 1
        self.bucket.objects[self.name] = (bytes(data), self.bucket.generation)
        self.generation = self.bucket.generation

    def delete(self, if_generation_match=None):
        if self.name not in self.bucket.objects:
            raise exceptions.NotFound("gone")
        self._check(if_generation_match)
        del self.bucket.objects[self.name]


class _Bucket:
    name = "my-bucket"

    def __init__(self):
        self.objects: dict[str, tuple[bytes, int]] = {}
        self.generation = 1000

    def blob(self, name):
        return _Blob(self, name)

    def get_blob(self, name):
        return _Blob(self, name, self.objects[name][1]) if name in self.objects else None


def test_the_gcs_store_calls_the_library_with_its_preconditions():
    """The fake's methods and keywords are the real library's (a renamed keyword would make
    every conditional write unconditional, or fail)."""
    for method, name in (
        (storage.Blob.upload_from_string, "if_generation_match"),
        (storage.Blob.download_as_bytes, "if_generation_match"),
        (storage.Blob.delete, "if_generation_match"),
        (storage.Blob.upload_from_string, "content_type"),
    ):
        assert name in inspect.signature(method).parameters, (method, name)
    assert "blob_name" in inspect.signature(storage.Bucket.get_blob).parameters


def test_leases_on_gcs_are_compare_and_swap():
    bucket = _Bucket()
    workdir = "gs://my-bucket/runs/bert"
    store = lease.GcsStore(f"{workdir}/{lease.LEASE_FILE}", bucket=bucket)
    assert store.read() == (None, None)
    held = lease.acquire(workdir, "pretraining", store=store, renew_every=0.05)
    name = f"runs/bert/{lease.LEASE_FILE}"
    first_generation = bucket.objects[name][1]
    with pytest.raises(lease.LeaseError, match=f"workdir '{workdir}' is in use by pretraining"):
        lease.acquire(
            workdir, "pretraining", store=lease.GcsStore(f"{workdir}/{lease.LEASE_FILE}", bucket=bucket)
        )
    time.sleep(0.3)
    assert bucket.objects[name][1] > first_generation  # renewed
    assert store.create(b"{}") is None  # exists: not overwritten
    assert store.replace(b"{}", first_generation) is None  # stale generation: refused
    held.release()
    assert name not in bucket.objects
    # a dead holder elsewhere: taken over by one generation-conditional write
    bucket.objects[name] = (_elsewhere(renewed_ago=3600).encode(), 7)
    record, generation = lease.take(workdir, "pretraining", store=store)
    assert bucket.objects[name] == (record.encode(), generation) and generation > 7
    assert not store.delete(7) and store.delete(generation)
