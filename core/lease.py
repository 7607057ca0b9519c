"""One run per workdir: the lease a live run holds on its workdir (`WORKDIR/lease.json`).

Two processes writing one workdir corrupt it quietly: duplicate rows in metrics.jsonl, two
TensorBoard files, checkpoints and data positions of two runs mixed, a failed save. A
scheduler that relaunches a job whose old process is still alive does exactly that, and on
a pod two launches can share one gs:// workdir. So every tool that writes a workdir
(pretrain.train, finetune.glue, interop.convert import, the demo) holds its lease while it
runs:

    {"host", "pid", "machine", "tool", "launch_id", "started", "renewed"}

- **Taking it.** No lease: it is created (create-if-absent). A lease of a live run: the
  launch is refused with one line naming the holder (host, pid, tool, launch, when it was
  last renewed) and what to do; it writes nothing. A lease of a dead run is taken over
  (compare-and-swap on what was read), with a line that says so.
- **Alive or dead.** The holder rewrites `renewed` every `RENEW_SECONDS` from a daemon
  thread. A holder on this machine (the same host, boot and pid namespace: `machine`) is
  alive while its process exists, so a run killed with SIGKILL is taken over at once. A
  holder elsewhere is alive if it renews: it is watched, alive as soon as it renews, dead
  when it does not for `TIMEOUT_SECONDS` of this process's clock (so a restart on another
  host right after a preemption waits at most that long). Its own `renewed` time is
  trusted only when it is `STALE_FACTOR` timeouts old (a lease left yesterday), since the
  other machine's clock may be behind ours.
- **Losing it.** A holder that cannot renew for longer than the timeout (paused, cut off
  from the bucket) may have been taken over. `check()`, which the trainer calls on every
  process before every log line and checkpoint, renews there and then when the last
  renewal is older than half the timeout, and raises LeaseLostError on every process of a
  pod when the lease is another launch's (or could not be confirmed for the whole
  timeout), so the run stops without writing over the other run's files. A write that
  failed only in its reply (a retried conditional write on gs://) is recognised by the
  launch id read back, and a removed lease file is written again.
- **Letting go.** A run that ends (finished, stopped, failed with an error) deletes the
  lease if it is still its own. A process killed outright leaves it, to be taken over.
- **Pods.** Process 0 holds the cluster's one lease; the others learn its outcome from the
  JAX coordination service (the same refusal line on every process), so the processes of
  one launch never refuse each other.

Storage: a local (or NFS) file is replaced under an exclusive `flock` of `WORKDIR/.lease.lock`
held only for the read-compare-write, so a dead process never keeps it; on gs:// the
object store's generation preconditions (`if_generation_match`) make create, renew,
take over and release compare-and-swap operations (google-cloud-storage).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from core.errors import UserError, one_line

log = logging.getLogger(__name__)

LEASE_FILE = "lease.json"
LOCK_FILE = ".lease.lock"
RENEW_SECONDS = 10.0
TIMEOUT_SECONDS = 60.0
# A lease another machine renewed longer ago than this many timeouts, on our clock, is dead
# at once (its clock would have to be that far behind ours); a fresher one is watched.
STALE_FACTOR = 10


class LeaseError(UserError):
    """The workdir is held by another live run (one line, user-facing)."""


class LeaseLostError(UserError):
    """This run's lease was taken over by another launch while it ran."""


def _this_machine() -> str:
    """Where a pid means the same process: the host, its boot and this pid namespace (two
    containers with one hostname, or a reboot, are other machines)."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    return ":".join(parts)


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), so that
    a pid reused by another process is not taken for the holder; None without /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive_here(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        pass
    return started is None or _process_start(pid) in (None, started)


@dataclasses.dataclass(frozen=True)
class Holder:
    """One lease's record: who holds the workdir, since when, and its last renewal (seconds
    since the epoch, on the holder's clock)."""

    host: str
    pid: int
    machine: str
    process_start: str | None
    tool: str
    launch_id: str
    started: float
    renewed: float

    @classmethod
    def me(cls, tool: str, launch_id: str) -> Holder:
        now = time.time()
        pid = os.getpid()
        return cls(socket.gethostname(), pid, _this_machine(), _process_start(pid), tool, launch_id, now, now)

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        """The record, or None when it is not one (a torn or foreign file: taken over)."""
        try:
            fields = json.loads(data)
            return cls(**{f.name: fields[f.name] for f in dataclasses.fields(cls)})
        except (ValueError, KeyError, TypeError):
            return None

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=1).encode()

    def renewed_now(self) -> Holder:
        return dataclasses.replace(self, renewed=time.time())

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        ago = max(0.0, time.time() - self.renewed)
        return (
            f"{self.tool} (pid {self.pid} on {self.host}, launch {self.launch_id}, started {started}, "
            f"renewed {ago:.0f} s ago)"
        )


class Store(Protocol):
    """Compare-and-swap access to one small file. A generation names one written version;
    every write that names a generation succeeds only if the file is still that version."""

    def read(self) -> tuple[bytes | None, object]: ...  # (data, generation); (None, None): absent

    def create(self, data: bytes) -> object | None: ...  # the new generation; None: exists

    def replace(self, data: bytes, generation: object) -> object | None: ...  # None: changed

    def delete(self, generation: object) -> bool: ...  # False: changed or gone


class LocalStore:
    """A file on a local or network disk; generations are the file's bytes, compared under an
    exclusive flock of a lock file beside it (released by the kernel when a holder dies)."""

    def __init__(self, path: str):
        self.path = path
        self._lock_path = os.path.join(os.path.dirname(path), LOCK_FILE)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _current(self) -> bytes | None:
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _write(self, data: bytes) -> bytes:
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, self.path)  # readers never see half a record
        return data

    def read(self) -> tuple[bytes | None, object]:
        with self._locked():
            data = self._current()
        return data, data

    def create(self, data: bytes) -> object | None:
        with self._locked():
            return None if self._current() is not None else self._write(data)

    def replace(self, data: bytes, generation: object) -> object | None:
        with self._locked():
            return self._write(data) if self._current() == generation else None

    def delete(self, generation: object) -> bool:
        with self._locked():
            if self._current() != generation:
                return False
            os.remove(self.path)
            return True


class GcsStore:
    """An object on Google Cloud Storage; generations are the object's, and every write is
    conditional on one (`if_generation_match`; 0 means "does not exist")."""

    def __init__(self, path: str, bucket=None):
        from google.api_core import exceptions

        bucket_name, _, self.name = path.removeprefix("gs://").partition("/")
        self._changed = (exceptions.PreconditionFailed, exceptions.NotFound)
        if bucket is None:
            from google.cloud import storage

            bucket = storage.Client().bucket(bucket_name)
        self.bucket = bucket

    def read(self) -> tuple[bytes | None, object]:
        for _ in range(5):  # a write between the listing and the download: read again
            blob = self.bucket.get_blob(self.name)
            if blob is None:
                return None, None
            try:
                return blob.download_as_bytes(if_generation_match=blob.generation), blob.generation
            except self._changed:
                continue
        raise LeaseError(f"gs://{self.bucket.name}/{self.name} changes faster than it can be read")

    def _upload(self, data: bytes, generation: int) -> object | None:
        blob = self.bucket.blob(self.name)
        try:
            blob.upload_from_string(data, content_type="application/json", if_generation_match=generation)
        except self._changed:
            return None
        return blob.generation

    def create(self, data: bytes) -> object | None:
        return self._upload(data, 0)

    def replace(self, data: bytes, generation: object) -> object | None:
        return self._upload(data, generation)

    def delete(self, generation: object) -> bool:
        try:
            self.bucket.blob(self.name).delete(if_generation_match=generation)
        except self._changed:
            return False
        return True


def store_for(workdir: str) -> Store:
    path = os.path.join(workdir, LEASE_FILE)
    if workdir.startswith("gs://"):
        return GcsStore(path)
    if "://" in workdir:
        raise LeaseError(
            f"workdir '{workdir}': a lease can be held on a local or network disk or on gs:// only; "
            "use one of those for the workdir"
        )
    return LocalStore(path)


class Lease:
    """A lease this process holds (or, on a pod's other processes, that process 0 holds)."""

    def __init__(
        self,
        workdir: str,
        store: Store | None,
        record: Holder | None,
        generation: object,
        timeout: float = TIMEOUT_SECONDS,
    ):
        self.workdir, self.timeout = workdir, timeout
        self._store, self._record, self._generation = store, record, generation
        self._lost: str | None = None
        self._renewed = time.monotonic()  # of the last renewal that reached the store
        self._lock = threading.Lock()  # one compare-and-swap at a time: the thread's or check()'s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def launch_id(self) -> str | None:
        return self._record.launch_id if self._record else None

    def start_renewing(self, every: float) -> None:
        if self._store is None:
            return
        self._thread = threading.Thread(
            target=self._renew_every, args=(every,), name="workdir_lease", daemon=True
        )
        self._thread.start()

    def _renew_every(self, every: float) -> None:
        warned = False
        while not self._stop.wait(every) and self._lost is None:
            try:
                self._renew()
                warned = False
            except Exception as e:  # pylint: disable=broad-except  (a network or disk hiccup: try again)
                if not warned:
                    warned = True
                    log.warning(
                        "workdir %s: cannot renew the lease (%s); trying again", self.workdir, one_line(e)
                    )

    def _renew(self) -> None:
        """One renewal: a compare-and-swap on the generation this run wrote last. When it
        fails, the record is read back: this run's own (a retried write that had landed)
        is adopted, a missing file recreated, another launch's means the lease is lost."""
        with self._lock:
            if self._lost is not None:
                return
            record = self._record.renewed_now()
            generation = self._store.replace(record.encode(), self._generation)
            if generation is None:
                data, current = self._store.read()
                other = Holder.parse(data) if data is not None else None
                if data is None:
                    generation = self._store.create(record.encode())
                    log.warning(
                        "workdir %s: the lease file was removed; this run wrote it again", self.workdir
                    )
                elif other is not None and other.launch_id == record.launch_id:
                    record, generation = other, current
                if generation is None:
                    self._lost = other.describe() if other else "another launch"
                    log.error("workdir %s: this run's lease is now held by %s", self.workdir, self._lost)
                    return
            self._record, self._generation, self._renewed = record, generation, time.monotonic()

    def check(self) -> None:
        """Raises LeaseLostError once another launch has taken the workdir over, on every
        process of a pod (process 0 holds the lease; the others learn from it: call on every
        process, at the same points). A renewal older than the timeout allows is made here and
        now, so that a run paused or cut off for that long never writes before it knows."""
        lost = self._lost
        if self._store is not None and lost is None and time.monotonic() - self._renewed > self.timeout / 2:
            try:
                self._renew()
            except Exception as e:  # pylint: disable=broad-except
                if time.monotonic() - self._renewed > self.timeout:
                    failed = f"renewing failed for over {self.timeout:g} s: {one_line(e)}"
                    self._lost = f"nobody it could confirm ({failed})"
            lost = self._lost
        lost = _share_lost(lost)
        if lost is not None:
            raise LeaseLostError(
                f"workdir '{self.workdir}' is no longer this run's: its lease is held by {lost} (this run "
                f"was paused or cut off for over {self.timeout:g} s): this process stops without writing "
                "more; see who holds it, then run the same command again if it should go on"
            )

    def release(self) -> None:
        """Stops renewing and deletes the lease if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._store is not None and self._lost is None:
            with contextlib.suppress(Exception):  # the run's own outcome matters more than this
                self._store.delete(self._generation)


def _share_lost(lost: str | None) -> str | None:
    """Process 0's verdict on every process of a cluster (the others hold no store); outside
    one, `lost` itself. A collective: every process calls it at the same point."""
    from core import cluster

    if not cluster.in_cluster():
        return lost
    from jax.experimental import multihost_utils

    text = (lost or "").encode()[:1024]
    buffer = np.zeros(1025, np.uint8)
    buffer[0] = lost is not None
    buffer[1 : 1 + len(text)] = np.frombuffer(text, np.uint8)
    shared = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
    if not shared[0]:
        return None
    return bytes(shared[1:]).rstrip(b"\0").decode(errors="replace") or "another launch"


def _refusal(workdir: str, holder: Holder) -> LeaseError:
    # Pretraining stops after its step with a checkpoint on SIGTERM; the other tools just end.
    how = "SIGTERM stops it with a checkpoint: " if holder.tool == "pretraining" else ""
    return LeaseError(
        f"workdir '{workdir}' is in use by {holder.describe()}: wait for it to end, stop it ({how}kill "
        f"{holder.pid} on {holder.host}), or choose another --workdir"
    )


def take(
    workdir: str,
    tool: str,
    *,
    store: Store | None = None,
    timeout: float = TIMEOUT_SECONDS,
    poll: float = 1.0,
) -> tuple[Holder, object]:
    """Takes the lease of `workdir` for this process (see the module docstring): returns the
    record written and its generation. Raises LeaseError when a live run holds it."""
    store = store if store is not None else store_for(workdir)
    mine = Holder.me(tool, uuid.uuid4().hex[:12])
    watched: tuple[bytes, float] | None = None  # a fresh lease of another machine, since when
    while True:
        data, generation = store.read()
        if data is None:
            created = store.create(mine.encode())
            if created is not None:
                return mine, created
            continue  # another launch created it first: judge that one
        holder = Holder.parse(data)
        if holder is not None and holder.launch_id == mine.launch_id:
            return holder, generation  # our own write, which a retry reported as failed
        if holder is None:
            reason = "an unreadable lease file"
        elif holder.machine == mine.machine:
            if _alive_here(holder.pid, holder.process_start):
                raise _refusal(workdir, holder)
            reason = f"{holder.describe()}, whose process has ended"
        else:
            if watched is not None and watched[0] != data:
                raise _refusal(workdir, holder)  # renewed while we watched: alive
            if watched is None:
                watched = (data, time.monotonic())
                log.info(
                    "workdir %s is leased by %s: waiting up to %.0f s for it to renew (alive) or not (dead)",
                    workdir,
                    holder.describe(),
                    timeout,
                )
            # Another machine's clock may run behind ours: its age on our clock is trusted
            # only when far beyond the timeout; otherwise it must not renew while we watch.
            stale = time.time() - holder.renewed > STALE_FACTOR * timeout
            if not stale and time.monotonic() - watched[1] <= timeout:
                time.sleep(poll)
                continue
            reason = f"{holder.describe()}, not renewed for over {timeout:g} s"
        mine = mine.renewed_now()
        taken = store.replace(mine.encode(), generation)
        if taken is not None:
            log.warning("workdir %s: took over the lease of %s", workdir, reason)
            return mine, taken
        watched = None  # someone else wrote it meanwhile (or our write landed): judge what is there


# Coordination-service keys of the leases process 0 took, one per call in this process.
_KEY_PREFIX = "workdir_lease/"
_calls = 0


def _share_with_the_cluster(outcome: str | None, timeout: float) -> str | None:
    """Process 0 publishes its outcome (None: taken; else the refusal's message); the other
    processes wait for it and return it. Outside a cluster, returns `outcome`."""
    global _calls
    from core import cluster

    if not cluster.in_cluster():
        return outcome
    import jax
    import orbax.checkpoint as ocp

    _calls += 1
    key = f"{_KEY_PREFIX}{_calls}"
    client = ocp.multihost.get_jax_distributed_client()
    if jax.process_index() == 0:
        client.key_value_set(key, "taken" if outcome is None else f"refused:{outcome}")
        return outcome
    value = client.blocking_key_value_get(key, int((timeout + 120) * 1000))
    return None if value == "taken" else value.removeprefix("refused:")


def acquire(
    workdir: str,
    tool: str,
    *,
    timeout: float = TIMEOUT_SECONDS,
    renew_every: float = RENEW_SECONDS,
    store: Store | None = None,
) -> Lease:
    """Takes the lease of `workdir` (process 0 for a whole cluster) and starts renewing it;
    the caller releases it. Raises LeaseError on every process when a live run holds it.
    The workdir is created if needed."""
    from core import cluster

    main = not cluster.in_cluster() or _process_index() == 0
    lease = Lease(workdir, None, None, None)
    refusal = None
    if main:
        try:
            if store is None and "://" not in workdir:
                os.makedirs(workdir, exist_ok=True)
            store = store if store is not None else store_for(workdir)
            record, generation = take(workdir, tool, store=store, timeout=timeout)
            lease = Lease(workdir, store, record, generation, timeout)
        except LeaseError as e:
            refusal = str(e)
        except Exception as e:  # pylint: disable=broad-except  (permissions, credentials, the network)
            refusal = (
                f"cannot take the lease of workdir '{workdir}' ({one_line(e)}): check that it is writable "
                "(and, on gs://, the credentials), or choose another --workdir"
            )
    refusal = _share_with_the_cluster(refusal, timeout)
    if refusal is not None:
        raise LeaseError(refusal)
    lease.start_renewing(renew_every)
    return lease


@contextlib.contextmanager
def held(workdir: str, tool: str, **options) -> Iterator[Lease]:
    """`acquire` for the body of a `with`, released at its end (see `acquire` for `options`)."""
    lease = acquire(workdir, tool, **options)
    try:
        yield lease
    finally:
        lease.release()


def _process_index() -> int:
    import jax

    return jax.process_index()
