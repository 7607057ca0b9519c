"""Device mesh, logical-axis rules, and the shardings of state and batches (pjit style).

The mesh has three named axes: `data` (pure data parallelism), `fsdp` (data parallel
*and* parameters / optimizer state sharded, ZeRO-3 style) and `tensor` (heads, FFN and
vocab split across devices). Batches are split over `data` x `fsdp`. Models name their
dimensions (core/axes.py); `logical_axis_rules()` maps those names to mesh axes. A
mesh axis is used at most once per array: flax skips a rule whose mesh axis is already
taken, so `embed -> fsdp` shards parameters but not activations (whose batch already
uses fsdp).

`Partitioner` holds the mesh and the rules together: `with partitioner:` makes both active
(every jitted call of a step and every sharded init runs inside it), and it turns logical
partition specs into shardings and host rows into global batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, ClassVar, Sequence

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from core import axes
from core.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


class MeshError(UserError):
    """A mesh or batch size that does not fit the devices (one line, user-facing)."""


@gin.configurable
def logical_axis_rules(fsdp_embed: bool = True) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """The one table from logical dimension names to mesh axes."""
    return (
        (axes.BATCH, BATCH_AXES),
        (axes.EMBED, "fsdp" if fsdp_embed else None),
        (axes.MLP, "tensor"),
        (axes.HEADS, "tensor"),
        (axes.VOCAB, "tensor"),
        (axes.FACTORIZED, None),  # ALBERT's E = 128: too small to be worth splitting
        (axes.LENGTH, None),
        (axes.KV, None),
        (axes.PREDICTIONS, None),
    )


def parse_mesh(spec: str | None, num_devices: int) -> dict[str, int]:
    """'data:4,fsdp:2,tensor:1' -> sizes; one size may be -1 ("the rest"). None: all on data."""
    sizes = {"data": -1, "fsdp": 1, "tensor": 1}
    if spec:
        sizes = {"data": 1, "fsdp": 1, "tensor": 1}
        for part in spec.split(","):
            name, _, value = part.partition(":")
            name = name.strip()
            if name not in sizes or not value.strip().lstrip("-").isdigit():
                raise MeshError(
                    f"bad --mesh entry {part!r}: use e.g. 'data:4,fsdp:2,tensor:1' with axes {MESH_AXES}"
                )
            sizes[name] = int(value)
    rest = [n for n, s in sizes.items() if s == -1]
    known = math.prod(s for s in sizes.values() if s != -1)
    if len(rest) > 1 or any(s == 0 or s < -1 for s in sizes.values()):
        raise MeshError(f"bad --mesh {spec!r}: sizes must be positive, at most one may be -1")
    if rest:
        if num_devices % known:
            raise MeshError(f"--mesh {spec!r}: {num_devices} devices are not divisible by {known}")
        sizes[rest[0]] = num_devices // known
    if math.prod(sizes.values()) != num_devices:
        raise MeshError(
            f"--mesh {spec!r} has {_devices(math.prod(sizes.values()))} but {num_devices} "
            f"{'is' if num_devices == 1 else 'are'} available: the product of the axis sizes must equal "
            "the device count"
        )
    return sizes


def _devices(count: int) -> str:
    return f"{count} device" if count == 1 else f"{count} devices"


def make_mesh(spec: str | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh with Auto axes (linen's logical constraints need them).

    `devices`: jax.devices() by default; a slice's compile-only devices (core/tpu_slices.py)
    are laid out along its torus as jax.make_mesh lays out a pod's own; any other list is
    taken in order."""
    devices = list(devices or jax.devices())
    sizes = parse_mesh(spec, len(devices))
    shape = tuple(sizes[a] for a in MESH_AXES)
    if devices == list(jax.devices()) or devices[0].platform == "tpu":
        return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension split over data x fsdp, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def check_batch_size(global_batch: int, mesh: Mesh, process_count: int, microbatches: int = 1) -> int:
    """Validates the global batch against the mesh, hosts and microbatches; returns rows per host."""
    dp = data_parallel_size(mesh)
    if global_batch % dp:
        raise MeshError(
            f"batch size {global_batch} is not divisible by the data-parallel size {dp} "
            f"(data x fsdp of mesh {dict(mesh.shape)}): change train batch_size or --mesh"
        )
    if microbatches < 1 or global_batch % (microbatches * dp):
        raise MeshError(
            f"batch size {global_batch} is not divisible by microbatches x data-parallel size = "
            f"{microbatches} x {dp}: change run.batch_size or run.microbatches"
        )
    if global_batch % process_count:
        raise MeshError(f"batch size {global_batch} is not divisible by the {process_count} hosts")
    return global_batch // process_count


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This host's rows -> global jax.Arrays sharded over the batch axes of the mesh."""
    sharding = batch_sharding(mesh)
    # Every host holds the same number of rows; the explicit global shape makes a host
    # with a wrong row count fail here instead of producing a silently smaller batch.
    return {
        k: jax.make_array_from_process_local_data(
            sharding, v, (v.shape[0] * jax.process_count(), *v.shape[1:])
        )
        for k, v in local_batch.items()
    }


def target_device() -> jax.Device:
    """A device of what the program being built runs on: the innermost open Partitioner's
    mesh (a TPU slice compiled for ahead of time, on a CPU: core/tpu_slices.py), else this
    process's first device. Code that picks a kernel by platform asks this, at trace time."""
    if Partitioner._open:
        return Partitioner._open[-1].mesh.devices.flat[0]
    return jax.devices()[0]


def divisible_spec(spec: PartitionSpec, shape: tuple[int, ...], mesh) -> PartitionSpec:
    """`spec` with each dimension's mesh axes dropped (replicated) where they do not divide
    it: arrays on a mesh must split evenly. `mesh`: a Mesh or an AbstractMesh."""

    def ways(axes) -> int:
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        return int(np.prod([mesh.shape[a] for a in names]))

    return PartitionSpec(*(axes if size % ways(axes) == 0 else None for axes, size in zip(spec, shape)))


@dataclasses.dataclass(eq=False)
class Partitioner:
    """A mesh and its logical-axis rules, used together everywhere.

    `with partitioner:` sets the mesh (jax.set_mesh) and the rules (flax's
    nn.logical_axis_rules) for the block: sharded init, the jitted steps and anything
    that applies logical constraints run inside it.
    """

    mesh: Mesh
    rules: tuple
    _active: list = dataclasses.field(default_factory=list, init=False, repr=False)
    # The partitioners whose blocks are open, innermost last (`active_devices`).
    _open: ClassVar[list[Partitioner]] = []

    @classmethod
    def create(cls, spec: str | None = None, devices: Sequence[jax.Device] | None = None) -> Partitioner:
        """The mesh of `spec` (parse_mesh) with the gin-configured logical_axis_rules()."""
        return cls(make_mesh(spec, devices), logical_axis_rules())

    def __enter__(self) -> Partitioner:
        stack = contextlib.ExitStack()  # one per `with`, so that blocks may nest
        stack.enter_context(jax.set_mesh(self.mesh))
        stack.enter_context(nn.logical_axis_rules(self.rules))
        self._active.append(stack)
        Partitioner._open.append(self)
        return self

    def __exit__(self, *exc) -> None:
        Partitioner._open.pop()
        self._active.pop().close()

    def shardings(self, boxed_tree: Any) -> Any:
        """NamedShardings of a tree of nn.Partitioned boxes (e.g. jax.eval_shape of an init).

        A dimension that its mesh axes do not divide is replicated instead (e.g. the single
        attention head of ELECTRA-Small's generator on a `tensor:2` mesh): arrays on a
        mesh must split evenly, and such a dimension is small.
        """
        shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed_tree), self.mesh, self.rules)
        # boxed_tree has a box (or a plain array) wherever `shardings` has a leaf.
        return jax.tree.map(
            lambda sharding, array: self._divisible(sharding, getattr(array, "value", array).shape),
            shardings,
            boxed_tree,
        )

    def _divisible(self, sharding: NamedSharding, shape: tuple[int, ...]) -> NamedSharding:
        return NamedSharding(self.mesh, divisible_spec(sharding.spec, shape, self.mesh))

    @property
    def batch_sharding(self) -> NamedSharding:
        return batch_sharding(self.mesh)

    @property
    def data_parallel_size(self) -> int:
        return data_parallel_size(self.mesh)

    def global_batch(self, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        return global_batch(local_batch, self.mesh)
