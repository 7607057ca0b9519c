"""Each host's data position (its tf.data iterator's state) as an item of an orbax
checkpoint step: `checkpoints/<step>/data_iterator/process_<i>.*`.

An item of the step, beside `state`, rather than files of our own: orbax writes both into
the step's temporary folder and renames it once every host has written (atomic on local
disks; `commit_success.txt` on object stores), its `max_to_keep` deletes both, and a
damaged step is one folder to set aside. MaxText checkpoints its Grain iterators the same
way.

Every host writes and reads its own `process_<i>` files (a `tf.train.Checkpoint` of the
iterator), so orbax's primary-host rule does not apply here. The write happens when the
save is called, before orbax returns: the position is that of the step being saved.
TensorFlow is imported only here and only when there is an iterator to save or restore.

Checkpoints of versions before this layout kept the positions in
`WORKDIR/data_iterators/<step>/`: `legacy_prefix` names them, and they are read from there.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import jax
import orbax.checkpoint as ocp
from etils import epath

if TYPE_CHECKING:
    import tensorflow as tf

ITEM = "data_iterator"
LEGACY_DIR = "data_iterators"


def file_prefix(directory: epath.PathLike, process_index: int | None = None) -> str:
    """The prefix of one host's files in an item (or legacy) folder."""
    index = jax.process_index() if process_index is None else process_index
    return os.path.join(str(directory), f"process_{index}")


def legacy_prefix(workdir: str, step: int) -> str:
    """Where a version before this layout kept this host's position at `step`."""
    return file_prefix(os.path.join(workdir, LEGACY_DIR, str(step)))


def hosts_saved(directory: epath.PathLike) -> int:
    """How many hosts' positions a folder holds (0 when none, or no folder)."""
    return len(list(epath.Path(directory).glob("process_*.index")))


def write(iterator: tf.data.Iterator, prefix: str) -> None:
    import tensorflow as tf  # the input pipeline's

    tf.train.Checkpoint(iterator=iterator).write(prefix)


def read(iterator: tf.data.Iterator, prefix: str) -> None:
    """Restores `iterator` in place. Raises FileNotFoundError without the files, and what
    TensorFlow raises for a position it cannot read into this iterator."""
    import tensorflow as tf  # the input pipeline's

    if not epath.Path(prefix + ".index").exists():
        raise FileNotFoundError(f"no data iterator state {prefix}.index")
    tf.train.Checkpoint(iterator=iterator).read(prefix).assert_consumed()


class DataPositionHandler(ocp.CheckpointHandler):
    """orbax's handler of the `data_iterator` item (see the module docstring)."""

    def save(self, directory: epath.Path, args: DataPositionSave) -> None:
        epath.Path(directory).mkdir(parents=True, exist_ok=True)
        write(args.iterator, file_prefix(directory))

    def restore(self, directory: epath.Path, args: DataPositionRestore) -> Any:
        read(args.iterator, file_prefix(directory))
        return args.iterator

    def metadata(self, directory: epath.Path) -> None:
        return None

    def finalize(self, directory: epath.Path) -> None:
        pass

    def close(self) -> None:
        pass


@ocp.args.register_with_handler(DataPositionHandler, for_save=True)
@dataclasses.dataclass
class DataPositionSave(ocp.args.CheckpointArgs):
    iterator: Any


@ocp.args.register_with_handler(DataPositionHandler, for_restore=True)
@dataclasses.dataclass
class DataPositionRestore(ocp.args.CheckpointArgs):
    iterator: Any
