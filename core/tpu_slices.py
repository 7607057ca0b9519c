"""A TPU slice that is not here: its name, its chips, and devices to compile for.

`python -m pretrain.tpu_compile --topology=...` and `pretrain.train --compile_for=...` name a
slice as Cloud TPU's accelerator type (`v5p-64`, `v5litepod-16`, `v6e-16`, `v4-32`: what
`launch_tpu.sh create --type` takes) or as libtpu's topology (`v5p:2x4x4`, `v5e:4x4`).
`devices(slice_)` asks libtpu for compile-only devices of that slice
(`jax.experimental.topologies.get_topology_desc`, as MaxText's `train_compile.py` does), so
that `jit(...).lower(...).compile()` runs the real TPU compiler on this machine, a CPU,
allocating nothing. That needs the `libtpu` wheel (requirements-tpu.txt; x86-64 Linux).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re

from core.errors import UserError
from core.tpu_chips import CHIPS, Chip, by_generation

#: The libtpu that jax 0.10.2 names (`jax[tpu]`), pinned in requirements-tpu.txt.
LIBTPU_PIN = "libtpu==0.0.42.1"
_ACCELERATOR_TYPE = re.compile(r"^([a-z0-9]+)-(\d+)$")
_TOPOLOGY = re.compile(r"^([a-z0-9]+):(\d+(?:x\d+)+)$")


class SliceError(UserError):
    """A slice name that does not parse, or one this machine cannot compile for."""


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice: its generation and the chips' shape (torus dimensions).

    Attributes:
      chip: the generation (core/tpu_chips.py).
      shape: chips along each torus dimension, e.g. (2, 4, 4) for v5p-64.
    """

    chip: Chip
    shape: tuple[int, ...]

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def devices(self) -> int:
        """JAX devices: chips, or TensorCores on v3."""
        return self.chips * self.chip.devices_per_chip

    @property
    def topology(self) -> str:
        """libtpu's name, e.g. 'v5p:2x4x4'."""
        return f"{self.chip.generation}:{'x'.join(map(str, self.shape))}"

    @property
    def accelerator_type(self) -> str:
        """Cloud TPU's name, e.g. 'v5p-64' (cores where the name counts them)."""
        per_chip = 2 if self.chip.cores_in_name else 1
        return f"{self.chip.accelerator_prefix}-{self.chips * per_chip}"

    def __str__(self) -> str:
        return f"{self.accelerator_type} ({self.topology}, {self.devices} devices)"


def parse(name: str) -> Slice:
    """A slice from an accelerator type ('v5p-64') or a topology ('v5p:2x4x4'); SliceError
    (one line: the forms it takes) otherwise."""
    known = ", ".join(c.generation for c in CHIPS)
    match = _TOPOLOGY.match(name) or _ACCELERATOR_TYPE.match(name)
    chip = by_generation(match.group(1)) if match else None
    if chip is None:
        raise SliceError(
            f"unknown TPU slice {name!r}: give an accelerator type such as v5p-64, v5litepod-16, v6e-16 or "
            f"v4-32, or a topology such as v5p:2x4x4 or v5e:4x4 (generations: {known})"
        )
    if ":" in name:
        shape = tuple(int(x) for x in match.group(2).split("x"))
        if len(shape) != chip.torus_dims or min(shape) < 1:
            raise SliceError(
                f"TPU {chip.generation} slices have {chip.torus_dims} torus dimensions: {name!r}"
            )
    else:
        shape = _shape_of(chip, int(match.group(2)), name)
    slice_ = Slice(chip, shape)
    if slice_.chips > chip.max_chips:
        raise SliceError(f"{name}: a TPU {chip.generation} pod has at most {chip.max_chips} chips")
    return slice_


def _shape_of(chip: Chip, count: int, name: str) -> tuple[int, ...]:
    """The torus shape of Cloud TPU's slice of `count` (cores or chips, as the name counts).

    Cloud TPU's slices of 4 chips and more double one dimension at a time, the last of the
    smallest: 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8 ... and 2x2, 2x4, 4x4, 4x8 ...
    """
    chips, odd = divmod(count, 2) if chip.cores_in_name else (count, 0)
    if chips == 1 and not odd:
        return (1,) * chip.torus_dims
    if odd or chips < 4 or chips & (chips - 1):
        raise SliceError(
            f"{name}: no slice shape is known for it; name its topology instead, e.g. "
            f"--topology={chip.generation}:{'x'.join(['4'] * chip.torus_dims)}"
        )
    shape = [2, 2] + [1] * (chip.torus_dims - 2)
    while math.prod(shape) < chips:
        smallest = min(shape)
        last = max(i for i, size in enumerate(shape) if size == smallest)
        shape[last] *= 2
    return tuple(shape)


def check_libtpu() -> None:
    """SliceError (one line, how to install it) when the libtpu wheel is missing."""
    if importlib.util.find_spec("libtpu") is None:
        raise SliceError(
            f"compiling for a TPU slice on this machine needs the libtpu wheel, which is not installed: "
            f"pip install {LIBTPU_PIN} (as requirements-tpu.txt pins it; x86-64 Linux only)"
        )


def prepare_process(slice_: Slice) -> None:
    """Sets up a process that compiles for `slice_` and runs nothing: call it before JAX
    starts its backends. JAX runs on the CPU (with libtpu installed, it would otherwise look
    for a TPU here and warn), and libtpu, which looks for a TPU VM's metadata when it loads
    and warns on stderr when it finds none, is told what to assume; a TPU VM's own settings
    win. libtpu also lets one process at a time load it (a lock file in /tmp), for the chips'
    sake: a process that only compiles holds no chip, so several may (tests, the table's
    rows, a check while another runs)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", slice_.accelerator_type)


def devices(slice_: Slice) -> list:
    """Compile-only JAX devices of the slice (libtpu's; nothing runs on them).

    Hosts hold 2x2 chips (MaxText's `chips_per_host_bounds`), or the whole slice when it
    is smaller: the host count changes which process a device belongs to, not the program.
    """
    check_libtpu()
    prepare_process(slice_)
    from jax.experimental import topologies

    host = [2, 2, 1] if slice_.shape[0] % 2 == 0 and slice_.shape[1] % 2 == 0 else [1, 1, 1]
    options = {"chips_per_host_bounds": tuple(host)}
    if slice_.chip.megacore:
        options["chip_config_name"] = "megacore"
    try:
        found = topologies.get_topology_desc(topology_name=slice_.topology, platform="tpu", **options)
    except Exception as e:  # libtpu's JaxRuntimeError: a shape it does not offer
        raise SliceError(f"libtpu cannot describe {slice_}: {' '.join(str(e).split())[:300]}") from None
    return list(found.devices)
