"""Checkpoints: the train state and each host's data position, as the items of one orbax step.

Layout of a workdir:

    checkpoints/<step>/state/                      the train state (orbax)
    checkpoints/<step>/data_iterator/process_<i>.*  host i's tf.data position (core/data_position.py)
    bad_checkpoints/<step>[-<n>]/                  checkpoints found unreadable at start, moved aside
                                                   (never deleted)

orbax writes both items into the step's temporary folder and finalises the step once every
host has written (atomic), and deletes both when it drops the step (`max_to_keep`).
Restoring both gives an exact resume: same step, parameters, optimizer state, schedule
position, and the next batch is the one the interrupted run would have seen. Steps saved by
versions before this layout keep their positions in `data_iterators/<step>/`, read from
there.

State an objective carries from step to step (`TrainState.carry`, XLNet's memories) belongs
to the rows of the data stream it was saved with. It is saved unless the run says not to
(`save_carry=False`); it is restored only with that stream's position: a checkpoint without
it, or a stream that restarts (`reset_iterator`), gives a state whose carry is None, which
the caller starts from its initial value; a checkpoint whose carry has another number of
rows (another global batch size) is an error, or with `reset_iterator` a restart of both;
one of the same rows but another shape (another memory length) restarts with a warning.

A save killed half-way leaves only orbax's temporary folder, which is never a step, so
"latest" is always a complete checkpoint. A finalised checkpoint that is damaged later
(truncated or deleted files) fails to restore: `restore_latest` reports it in one line,
moves it to bad_checkpoints/ and falls back to the one before. A checkpoint that is
intact but does not fit the current config (other model or optimizer) is an error
instead, and nothing is moved: that is a config problem, not a damaged file.

A save that fails (a full disk, often in orbax's background writes, surfacing at the next
save or at the end) is one CheckpointError naming that step and the last complete one;
orbax's own tracebacks of the failure go to the DEBUG log (`_SaveReports`).

Files are read and written through etils.epath, as orbax does: local paths directly, gs://
through TensorFlow's file system when TensorFlow is installed (as for training, whose input
pipeline is tf.data). TensorFlow is imported only for that and to save or restore a tf.data
iterator: a step without an input pipeline (iterator None) checkpoints a local workdir with
no TensorFlow installed.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import shutil
import sys
import threading
import types
import warnings
from typing import TYPE_CHECKING, Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from orbax.checkpoint._src.metadata import array_metadata_store

from core import cluster, data_position
from core.errors import UserError, one_line

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger(__name__)

BAD_CHECKPOINTS = "bad_checkpoints"

# Orbax writes an array held whole by several replicas (data parallelism) in slices, each
# replica its own ("replica-parallel"), at the cost of one slicing program per array, slice
# and shape, compiled on first use. That pays for an embedding table, not for a bias or a
# LayerNorm scale: arrays whose slice would be smaller than this are written whole by one
# replica (BERT-large's word embeddings, 125 MB, still split into slices of >= 256 KiB on up to
# 488 replicas). The files are the same either way; only which host writes which chunk differs.
MIN_REPLICA_SLICE_BYTES = 256 * 1024


class CheckpointError(UserError):
    """A checkpoint that cannot be written or restored (one line, user-facing)."""


class IteratorMismatchError(CheckpointError):
    """An intact checkpoint whose data-iterator state another input pipeline wrote, or whose
    carried state belongs to other rows."""


def _absolute(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


def check_writable(workdir: str) -> None:
    """Fails before anything is built when the workdir cannot be created or written."""
    # One probe per host: on a pod every host probes the same workdir at the same moment.
    probe = os.path.join(workdir, f".write_probe_{jax.process_index()}")
    try:
        epath.Path(workdir).mkdir(parents=True, exist_ok=True)
        epath.Path(probe).write_text("ok")
        epath.Path(probe).unlink()
    except Exception as e:  # pylint: disable=broad-except  (OSError; on gs:// the backend's own errors)
        raise CheckpointError(
            f"workdir '{workdir}' is not writable ({one_line(e)}): "
            "choose another --workdir or fix its permissions"
        ) from None


def check_free_space(workdir: str, checkpoint_bytes: int, max_to_keep: int) -> None:
    """Fails when one checkpoint cannot fit on the workdir's disk; warns when the kept ones cannot.

    checkpoint_bytes: size of the train state (parameters + optimizer state) in bytes.
    Local disks only (object stores such as gs:// have no such limit).
    """
    if "://" in workdir:
        return
    free = shutil.disk_usage(workdir).free
    if free < checkpoint_bytes:
        raise CheckpointError(
            f"only {free / 1e9:.2f} GB free under '{workdir}' but one checkpoint needs about "
            f"{checkpoint_bytes / 1e9:.2f} GB: free space or use another --workdir"
        )
    if free < checkpoint_bytes * (max_to_keep + 1):
        log.warning(
            "%.2f GB free under %s: less than the %d checkpoints of %.2f GB this run keeps, plus one",
            free / 1e9,
            workdir,
            max_to_keep,
            checkpoint_bytes / 1e9,
        )


@contextlib.contextmanager
def _without_orbax_warnings():
    """Reading one item of a step warns that the step's metadata file is not in the item's
    folder (CheckpointManager writes it one level up): noise on the user's console."""
    orbax_logger = logging.getLogger("absl")  # orbax logs through absl
    level = orbax_logger.level
    orbax_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        orbax_logger.setLevel(level)


with _without_orbax_warnings():  # orbax warns that a handler replaces its default one
    ocp.type_handlers.register_type_handler(
        jax.Array,
        ocp.type_handlers.ArrayHandler(
            min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES,
            array_metadata_store=array_metadata_store.Store(),  # as orbax's default handler
        ),
        override=True,
    )


def saved_tree(state_dir: str) -> Any:
    """The tree a checkpoint's `state` item holds, as orbax metadata (shapes and dtypes, no
    arrays). Raises what orbax raises for a missing or unreadable item."""
    with _without_orbax_warnings():
        metadata = ocp.PyTreeCheckpointer().metadata(state_dir)
    return metadata.item_metadata.tree if hasattr(metadata, "item_metadata") else metadata


def _all_hosts_ok(ok: bool) -> bool:
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """{'/'-joined path: shape} of the leaves of a (metadata or abstract) tree."""
    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }


def _has_carry(saved: Any) -> bool:
    """Whether a checkpoint's metadata tree (`saved_tree`) holds a carried state (checkpoints
    of objectives that carry nothing, of runs that do not save it, and of versions before it
    existed do not)."""
    return isinstance(saved, dict) and saved.get("carry") is not None


def _without_carry(state: Any) -> Any:
    """A train state (or its abstract tree) without its carried state."""
    return state.replace(carry=None) if getattr(state, "carry", None) is not None else state


def state_bytes(state: Any) -> int:
    """Bytes of a (possibly abstract) train state: what one orbax checkpoint stores, uncompressed."""
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(state))


_ORBAX_DIR = os.path.dirname(os.path.abspath(ocp.__file__)) + os.sep
_ASYNCIO_BASE_EVENTS = os.path.abspath(asyncio.base_events.__file__)


def _through_orbax(tb: types.TracebackType | None) -> bool:
    """The traceback passes through orbax's code."""
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_ORBAX_DIR):
            return True
        tb = tb.tb_next
    return False


def _from_orbax(record: logging.LogRecord) -> bool:
    """An error orbax logged, or one logged about an exception raised in orbax's or
    tensorstore's code (asyncio's "Task exception was never retrieved" for orbax's write
    and read tasks)."""
    if record.levelno < logging.ERROR or getattr(record, "released", False):
        return False
    return os.path.abspath(record.pathname).startswith(_ORBAX_DIR) or (
        record.exc_info is not None
        and (_through_orbax(record.exc_info[2]) or _from_tensorstore(record.exc_info[1]))
    )


def _from_tensorstore(error: BaseException | None) -> bool:
    """An error tensorstore raised: its array errors end with the `tensorstore_spec` of the
    array, its OCDBT writes name the "OCDBT database". asyncio reports them for the reads of
    a damaged checkpoint and the writes of a failed save that orbax left unawaited, with a
    traceback that has no frame of orbax's (or none)."""
    message = str(error) if error is not None else ""
    return "tensorstore_spec=" in message or " in OCDBT database at " in message


def _on_a_closed_loop(unraisable: Any) -> bool:
    """The error of `call_soon_threadsafe` on a closed event loop (raised by asyncio's
    `_check_closed`), here in a callback without a caller: tensorstore's, when a write
    finishes after orbax has closed the event loop of a failed batch of writes."""
    frames = []
    tb = unraisable.exc_traceback
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((os.path.abspath(code.co_filename), code.co_name))
        tb = tb.tb_next
    return isinstance(unraisable.exc_value, RuntimeError) and frames[-2:] == [
        (_ASYNCIO_BASE_EVENTS, "call_soon_threadsafe"),
        (_ASYNCIO_BASE_EVENTS, "_check_closed"),
    ]


class _SaveReports(logging.Filter):
    """orbax's own reports of an asynchronous save that fails, kept off the user's console.

    When a background write fails (a full disk), orbax logs the exception with its
    traceback from every thread it passes through, asyncio logs the write tasks that
    nobody awaited, and tensorstore prints "Event loop is closed" for each write still
    pending: dozens of tracebacks on stderr, around and after the one `error:` line. The
    failure itself is raised again by `wait_until_finished`, and Checkpointer reports it
    as a CheckpointError. So while a save is in flight, these reports are held: when it
    succeeds (or the process exits without waiting for it) they go out as they came;
    when it fails they go to the DEBUG log, as does what the failed save reports later.
    Anything else (every other logger, orbax's warnings, orbax outside a save) passes.
    """

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._in_flight = False
        self._failed = False
        self._held: list[Any] = []
        self._previous_hook: Callable[[Any], Any] = sys.unraisablehook
        self._exit_registered = False

    def begin(self) -> None:
        """A save starts: hold its reports."""
        for name in ("absl", "asyncio"):  # orbax logs through absl
            if self not in logging.getLogger(name).filters:
                logging.getLogger(name).addFilter(self)
        if sys.unraisablehook != self._unraisable:  # (again after pytest restores its own)
            self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        with self._lock:
            self._in_flight, self._failed = True, False
            if not self._exit_registered:
                atexit.register(self._release)  # a save nobody waited for: its reports go out
                self._exit_registered = True

    def end(self, failed: bool) -> None:
        """The save is complete on disk, or failed (and is reported by the caller)."""
        with self._lock:
            self._in_flight, self._failed = False, failed
        if failed:
            # The failed save's write coroutines are never awaited, and Python warns about
            # each when it collects them, maybe only at exit ("coroutine
            # 'async_serialize_from_host.<locals>.write_fragment' was never awaited", seen on
            # a loaded machine): the same failure, which the caller reports once.
            warnings.filterwarnings(
                "ignore", message=r"coroutine '[^']*serializ[^']*' was never awaited", category=RuntimeWarning
            )
            self._to_debug()
        else:
            self._release()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_from_orbax(record) and self._take(record))

    def _unraisable(self, unraisable: Any) -> None:
        if not (_on_a_closed_loop(unraisable) and self._take(unraisable)):
            self._previous_hook(unraisable)

    def _take(self, report: Any) -> bool:
        """Holds the report or sends it to DEBUG (True), or leaves it to go out (False)."""
        with self._lock:
            if self._in_flight:
                self._held.append(report)
                return True
            if not self._failed:
                return False
            self._held.append(report)
        self._to_debug()
        return True

    def _pop_held(self) -> list[Any]:
        with self._lock:
            held, self._held = self._held, []
        return held

    def _to_debug(self) -> None:
        for report in self._pop_held():
            if isinstance(report, logging.LogRecord):
                log.debug("orbax, of the failed save: %s", report.getMessage(), exc_info=report.exc_info)
            else:
                exc_info = (report.exc_type, report.exc_value, report.exc_traceback)
                log.debug("orbax, of the failed save: %s", report.exc_value, exc_info=exc_info)

    def _release(self) -> None:
        for report in self._pop_held():
            if isinstance(report, logging.LogRecord):
                report.released = True
                logging.getLogger(report.name).handle(report)
            else:
                self._previous_hook(report)


_save_reports = _SaveReports()


@contextlib.contextmanager
def orbax_reports_held():
    """Reading a checkpoint outside Checkpointer (core/workdir.py's `load_params`): orbax's
    and tensorstore's reports of a damaged checkpoint ("Event loop is closed" for each
    pending read) are held as a failed save's are, so the caller's one error line is all
    the user sees; after a good read they go out as they came."""
    _save_reports.begin()
    failed = True
    try:
        yield
        failed = False
    finally:
        _save_reports.end(failed)


class Checkpointer:
    """Saves and restores (train state, data iterator) pairs in `workdir`."""

    def __init__(self, workdir: str, *, max_to_keep: int = 3, save_carry: bool = True):
        self.workdir = workdir
        self._save_carry = save_carry
        self.directory = os.path.join(_absolute(workdir), "checkpoints")
        self._max_to_keep = max_to_keep
        self._in_flight: int | None = None  # the step orbax is writing in the background
        self.manager = self._open()
        if jax.process_index() == 0 and epath.Path(workdir, data_position.LEGACY_DIR).is_dir():
            log.info(
                "%s/%s holds data positions in an older version's layout: they are read for their steps; "
                "delete the folder once none of those steps is left in checkpoints/",
                workdir,
                data_position.LEGACY_DIR,
            )

    def _open(self) -> ocp.CheckpointManager:
        return ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=self._max_to_keep, create=True)
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def _positions_dir(self, step: int) -> str:
        """The folder of step `step`'s data positions: its item, or an older version's folder."""
        item = os.path.join(self.directory, str(step), data_position.ITEM)
        if epath.Path(item).is_dir():
            return item
        return os.path.dirname(data_position.legacy_prefix(self.workdir, step))

    def save(self, step: int, state: Any, iterator: tf.data.Iterator | None) -> None:
        """Starts saving `step` (orbax finishes in the background), with the data position of
        `iterator` unless it is None; a failure of this save, or of the previous one, is a
        CheckpointError naming that step."""
        self.wait()  # surfaces a failure of the previous async save
        if not self._save_carry:
            state = _without_carry(state)
        items = {"state": ocp.args.StandardSave(state)}
        if iterator is not None:  # a step without an input pipeline has no position
            items[data_position.ITEM] = data_position.DataPositionSave(iterator)
        try:
            _save_reports.begin()
            self._in_flight = step
            self.manager.save(step, args=ocp.args.Composite(**items))
        except Exception as e:  # pylint: disable=broad-except  (disk full, permissions, GCS errors ...)
            if self._in_flight is not None:
                self._in_flight = None
                _save_reports.end(failed=True)
            raise self._save_error(step, e) from None

    def wait(self) -> None:
        """Blocks until the last save is complete on disk; a failure is a CheckpointError."""
        step, self._in_flight = self._in_flight, None
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # pylint: disable=broad-except
            if step is not None:
                _save_reports.end(failed=True)
            raise self._save_error(step, e) from None
        if step is not None:
            _save_reports.end(failed=False)

    def _complete_steps(self) -> list[int]:
        """The steps whose checkpoint is complete on disk (orbax's rule for a finalized step,
        on local disks and object stores), ascending. Read from the directory, not from the
        manager, which counts a save that is still in flight (or has failed)."""
        return sorted(ocp.utils.checkpoint_steps(self.directory))

    def _save_error(self, step: int | None, e: BaseException) -> UserError:
        complete = self._complete_steps()
        previous = complete[-1] if complete else None
        kept = (
            f"the last complete checkpoint is step {previous}"
            if previous is not None
            else "no checkpoint was completed"
        )
        what = f"checkpoint {step}" if step is not None else "a checkpoint"
        if cluster.peer_lost(e):
            return cluster.lost_peer_error(f"the save of {what}", e, kept)
        return CheckpointError(
            f"saving {what} in {self.directory} failed ({one_line(e)}); {kept}: "
            "free space or fix the workdir, then run the same command to resume"
        )

    def restore_latest(
        self,
        abstract_state: Any,
        iterator_for: Callable[[int], tf.data.Iterator | None],
        *,
        reset_iterator: bool = False,
        restart_stream: bool = False,
    ) -> tuple[Any, int | None]:
        """Restores the newest readable checkpoint into `abstract_state`'s shardings.

        iterator_for(step): the data iterator to restore that step's position into (the
        data stream can depend on the step, e.g. the phase of a two-phase run).
        Returns (state, step), or (None, None) when the workdir has no checkpoint. Damaged
        checkpoints are moved to bad_checkpoints/ (one log line each) and skipped.

        An intact iterator state written by another input pipeline (its config or our
        pipeline code changed) is not damage: IteratorMismatchError, nothing moved; or,
        with `reset_iterator`, the train state is restored and a second iterator_for(step)
        starts its stream afresh (one warning line). `restart_stream` does that without
        reading the data position at all: the caller knows that its stream is another one
        (another global batch or pipeline, pretrain/launches.py), whose position could not be
        read into this iterator (and its failure would look like damage).
        """
        while (step := self.latest_step()) is not None:
            saved = self._check_compatible(step, abstract_state)
            error = None
            try:
                if restart_stream:
                    state = self._restore_state(step, _without_carry(abstract_state), saved)
                    iterator_for(step)  # the stream from its beginning
                else:
                    self._check_host_count(step)
                    wanted = self._with_restorable_carry(step, saved, abstract_state)
                    state = self.restore(step, wanted, iterator_for(step), saved=saved)
            except IteratorMismatchError:
                if not reset_iterator:
                    raise
                log.warning(
                    "checkpoint step %d: the data stream restarts from its beginning, and any "
                    "carried state from its initial value (run.reset_data_iterator; the input "
                    "pipeline, host count or batch size changed since it was saved)",
                    step,
                )
                iterator_for(step)  # a new one: the failed read leaves the old one unusable
                return self._restore_state(step, _without_carry(abstract_state), saved), step
            except Exception as e:  # pylint: disable=broad-except  (tensorstore/TF errors of damaged files)
                error = e
            # Every host must take the same step, even when only one host's files are damaged.
            if _all_hosts_ok(error is None):
                return state, step
            moved = self._quarantine(step)
            log.warning(
                "checkpoint step %d is damaged (%s): moved to %s, resuming from the one before",
                step,
                one_line(error) if error else "damaged on another host",
                moved,
            )
        return None, None

    def _check_host_count(self, step: int) -> None:
        """IteratorMismatchError when the step's data positions were saved by another number
        of hosts: each host saved its own, and this run's hosts would read other rows (not
        damage: nothing is moved). No position at all is left to `restore` (damage)."""
        saved = data_position.hosts_saved(self._positions_dir(step))
        if saved and saved != jax.process_count():
            raise IteratorMismatchError(
                f"checkpoint step {step} in {self.directory} holds the data positions of {saved} "
                f"host(s), this run has {jax.process_count()}: resume with {saved} host(s), or bind "
                "run.reset_data_iterator = True to keep the model and optimizer state and restart "
                "the data stream"
            )

    def _with_restorable_carry(self, step: int, saved: Any, abstract_state: Any) -> Any:
        """`abstract_state`, or it without its carry when the step's carried state cannot
        continue. Another number of rows (another global batch size) is an
        IteratorMismatchError: attached to this run's rows, it would continue other rows'
        streams. The same rows but another shape (e.g. another XLNetOptions.mem_len): one
        warning, and the state is restored without it (the caller starts it from its initial
        value)."""
        if getattr(abstract_state, "carry", None) is None or not _has_carry(saved):
            return abstract_state
        saved_shapes, shapes = _shapes(saved["carry"]), _shapes(abstract_state.carry)
        saved_rows = min(shape[0] for shape in saved_shapes.values())
        rows = min(shape[0] for shape in shapes.values())
        if saved_rows != rows:
            raise IteratorMismatchError(
                f"checkpoint step {step} in {self.directory} carries state for global batches of "
                f"{saved_rows} rows, this run's have {rows}: resume with "
                f"run.batch_size = {saved_rows}, or bind run.reset_data_iterator = True to keep "
                "the model and optimizer state and restart the data stream and the carried state"
            )
        if saved_shapes == shapes:
            return abstract_state
        log.warning(
            "checkpoint step %d: its carried state has shapes %s, this run's %s: it restarts from "
            "its initial value (the model and optimizer state and the data position are restored)",
            step,
            sorted(saved_shapes.items()),
            sorted(shapes.items()),
        )
        return _without_carry(abstract_state)

    def restore(
        self, step: int, abstract_state: Any, iterator: tf.data.Iterator | None, *, saved: Any = None
    ) -> Any:
        """Restores step `step` into the shardings of `abstract_state`, and the iterator (unless
        None) in place. A carry is restored when the checkpoint holds one; otherwise the
        state's carry is None. saved: the step's metadata tree (`saved_tree`), when read."""
        if iterator is not None:
            self._restore_iterator(step, iterator)
        return self._restore_state(step, abstract_state, saved)

    def _restore_iterator(self, step: int, iterator: tf.data.Iterator) -> None:
        import tensorflow as tf  # the input pipeline's

        item = os.path.join(self.directory, str(step), data_position.ITEM)
        try:  # before the state: the cheap read, and a mismatch then costs no state restore
            if epath.Path(item).is_dir():
                self.manager.restore(
                    step,
                    args=ocp.args.Composite(
                        **{data_position.ITEM: data_position.DataPositionRestore(iterator)}
                    ),
                )
            else:  # an older version's layout
                data_position.read(iterator, data_position.legacy_prefix(self.workdir, step))
        except tf.errors.OpError as e:
            # tf.data's words for a state saved by a differently built dataset (or one whose
            # batches have another shape: another per-host batch).
            if "dataset definition has not changed" not in str(e) and "Incompatible shapes" not in str(e):
                raise
            raise IteratorMismatchError(
                f"checkpoint step {step} in {self.directory} holds the data position of another "
                "input pipeline (its PipelineConfig, or this code's pipeline, changed since it was "
                "saved): resume with the config and code that wrote it, or bind "
                "run.reset_data_iterator = True to keep the model and optimizer state and restart "
                "the data stream"
            ) from None

    def _restore_state(self, step: int, abstract_state: Any, saved: Any = None) -> Any:
        if saved is None:
            saved = saved_tree(os.path.join(self.directory, str(step), "state"))
        if not _has_carry(saved):  # saved without one: the state's carry is None too
            abstract_state = _without_carry(abstract_state)
        if hasattr(abstract_state, "carry") and (
            "carry" not in saved or (_has_carry(saved) and abstract_state.carry is None)
        ):
            # A checkpoint of a version before carried state existed, or a saved carry that is
            # not wanted (its stream restarts): orbax's partial restore reads the rest, with a
            # handler of its own (the manager's is the one its saves registered).
            return ocp.PyTreeCheckpointer().restore(
                os.path.join(self.directory, str(step), "state"),
                args=ocp.args.PyTreeRestore(
                    abstract_state,
                    restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state),
                    partial_restore=True,
                ),
            )
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
        )
        return restored["state"]

    def _check_compatible(self, step: int, abstract_state: Any) -> Any:
        """Raises CheckpointError when an intact checkpoint holds a differently shaped model or
        optimizer state (the carry is `_with_restorable_carry`'s). Returns the step's metadata tree
        (`saved_tree`), or None when it is unreadable.

        Reads only orbax's metadata (shapes); unreadable metadata is left to `restore`,
        which then treats the checkpoint as damaged.
        """
        try:
            saved = saved_tree(os.path.join(self.directory, str(step), "state"))
            saved_params = _shapes(saved["params"])
        except Exception:  # pylint: disable=broad-except
            return None
        wanted_params = _shapes(abstract_state.params)
        fix = "use a new --workdir, or the config this run was started with"
        if saved_params.keys() != wanted_params.keys():
            diff = sorted(saved_params.keys() ^ wanted_params.keys())
            raise CheckpointError(
                f"checkpoint step {step} in {self.directory} holds another model "
                f"({len(diff)} differing parameters, e.g. {diff[0]}): {fix}"
            )
        for key, shape in wanted_params.items():
            if saved_params[key] != shape:
                raise CheckpointError(
                    f"checkpoint step {step} in {self.directory} has parameter {key} of shape "
                    f"{saved_params[key]}, the config gives {shape}: {fix}"
                )
        if sorted(_shapes(saved["opt_state"]).values()) != sorted(_shapes(abstract_state.opt_state).values()):
            raise CheckpointError(
                f"checkpoint step {step} in {self.directory} holds another optimizer state: {fix}"
            )
        return saved

    def _quarantine(self, step: int) -> str:
        """Moves a damaged step (with its data positions: one folder, or an older version's
        two) to bad_checkpoints/; returns where."""
        target = os.path.join(_absolute(self.workdir), BAD_CHECKPOINTS, str(step))
        n = 0
        while epath.Path(target if n == 0 else f"{target}-{n}").exists():
            n += 1
        target = target if n == 0 else f"{target}-{n}"
        if jax.process_index() == 0:
            epath.Path(target).mkdir(parents=True, exist_ok=True)
            (epath.Path(self.directory) / str(step)).rename(os.path.join(target, "checkpoint"))
            legacy = epath.Path(self.workdir, data_position.LEGACY_DIR, str(step))
            if legacy.is_dir():
                legacy.rename(os.path.join(target, data_position.LEGACY_DIR))
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"quarantine checkpoint {step}")
        self.manager.close()
        self.manager = self._open()  # forget the moved step
        return target

    def close(self) -> None:
        self.wait()
        self.manager.close()
