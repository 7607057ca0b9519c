"""The one table of TPU generations: each chip's peak, memory and how its slices are named.

Peaks and memory are the vendor's figures per chip (Cloud TPU's system-architecture pages,
cited per row); `usable_hbm_bytes` is what libtpu's compiler lets a program use per device
(`RESOURCE_EXHAUSTED: ... exceeds available HBM (15.75G)`; G = GiB), measured with
libtpu 0.0.42.1 by compiling a program too large for each generation: the rest is the
runtime's. A device is a chip on every generation here but v3, whose two TensorCores are a
device each (its row is per core). v4 and v5p chips also have two TensorCores, which JAX
drives as one device ("megacore").

Nothing here imports JAX: bench/, the docs and the compile check read the same numbers.
"""

from __future__ import annotations

import dataclasses

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation, per device (a chip; v3: a TensorCore).

    Attributes:
      generation: the name users write ("v5e"), the prefix of its accelerator types and
        of its topology names for libtpu ("v5e:4x4").
      accelerator_prefix: Cloud TPU's accelerator-type prefix ("v5litepod" for v5e-16).
      device_kind: `jax.Device.device_kind` of its devices ("TPU v5 lite").
      peak_flops: dense bf16 peak, FLOP/s.
      hbm_bytes: the vendor's HBM capacity.
      usable_hbm_bytes: the compiler's limit for one program (what a step must fit in).
      hbm_bandwidth: bytes/s.
      torus_dims: 2 (v3, v5e, v6e) or 3 (v4, v5p): the slice's shape, e.g. 4x4 or 2x2x4.
      cores_in_name: the accelerator type counts TensorCores, two per chip (v3, v4, v5p:
        "v4-32" is 16 chips), not chips (v5e, v6e: "v5litepod-16" is 16 chips).
      devices_per_chip: 2 on v3 (a device per TensorCore), else 1.
      megacore: JAX drives the chip's two TensorCores as one device (v4, v5p).
      max_chips: the largest slice of the generation (one pod).
      source: the vendor page of the figures.
    """

    generation: str
    accelerator_prefix: str
    device_kind: str
    peak_flops: float
    hbm_bytes: int
    usable_hbm_bytes: int
    hbm_bandwidth: float
    torus_dims: int
    cores_in_name: bool
    devices_per_chip: int
    megacore: bool
    max_chips: int
    source: str


CHIPS = (
    # v3: 123 TFLOP/s and 32 GiB per chip of two TensorCores, each core a device.
    Chip("v3", "v3", "TPU v3", 61.5e12, 16 * GIB, int(15.48 * GIB), 450e9, 2, True, 2, False, 1024,
         "https://cloud.google.com/tpu/docs/v3"),
    Chip("v4", "v4", "TPU v4", 275e12, 32 * GIB, int(30.75 * GIB), 1200e9, 3, True, 1, True, 4096,
         "https://cloud.google.com/tpu/docs/v4"),
    Chip("v5e", "v5litepod", "TPU v5 lite", 197e12, 16 * GIB, int(15.75 * GIB), 819e9, 2, False, 1, False,
         256,
         "https://cloud.google.com/tpu/docs/v5e"),
    Chip("v5p", "v5p", "TPU v5", 459e12, 95 * GIB, int(95.74 * GIB), 2765e9, 3, True, 1, True, 8960,
         "https://cloud.google.com/tpu/docs/v5p"),
    Chip("v6e", "v6e", "TPU v6 lite", 918e12, 32 * GIB, int(31.25 * GIB), 1640e9, 2, False, 1, False, 256,
         "https://cloud.google.com/tpu/docs/v6e"),
)  # fmt: skip


def by_generation(name: str) -> Chip | None:
    """The chip named "v5e" (or by its accelerator prefix, "v5litepod"), else None."""
    return next((c for c in CHIPS if name in (c.generation, c.accelerator_prefix)), None)


def by_device_kind(kind: str) -> Chip | None:
    """The chip of a `jax.Device.device_kind`, else None."""
    return next((c for c in CHIPS if c.device_kind == kind), None)
