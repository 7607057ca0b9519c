"""What a compiled XLA program says about itself, per device: memory, collectives, and the
compiler's cost-model estimate of its time.

Everything here is read from the executable (`jax.stages.Compiled`): its memory analysis,
its optimized HLO text and its cost analysis. Nothing is computed by a formula of ours, so
the figures are the compiler's own, for the platform it compiled for (a TPU slice compiled
for on a CPU: core/tpu_slices.py).

The estimate is XLA's cost model, not a measurement, and it has blind spots, which the
report counts rather than hides:
- a loop's body is priced once, whatever its trip count (the microbatches' `lax.scan`,
  scanned layers, and the loops XLA's TPU compiler makes of a sharded matmul whose result is
  reduce-scattered, its "windowed" collective matmuls, as under fsdp), so with loops the
  estimate is a lower bound;
- a Pallas kernel is priced only by the cost estimate its author gives `pallas_call`
  (`pl.CostEstimate`), and at 0 without one;
- on TPU, libtpu prices its `ConcatBitcast` custom call (a view joining asynchronously
  sliced pieces of an array, which moves no data) at the sentinel -1 s, so the raw
  `optimal_seconds` of a training step is negative; `estimate_seconds` adds those
  sentinels back, and is None when the sum is still negative (another unpriced op).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

# Collectives by their HLO opcode; an asynchronous one is counted at its "-start".
COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
    "collective-broadcast",
)
# libtpu's custom calls priced at the sentinel -1 s (see the module docstring).
_UNPRICED_CALLS = ("ConcatBitcast",)
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+(?P<op>"
    + "|".join(COLLECTIVES)
    + r")(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b(pred|[a-z]+\d+(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_BITS = {"pred": 8, "s4": 4, "u4": 4}


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per device, as `compiled.memory_analysis()` gives them.

    Attributes:
      arguments: the inputs (the state and the batch).
      outputs: the results; `aliased` of them reuse their donated arguments' buffers.
      temporaries: everything else the program holds at its peak.
      code: the compiled program itself.
    """

    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    code: int

    @property
    def buffers(self) -> int:
        """The program's buffers: arguments, outputs that do not reuse an argument's buffer,
        and temporaries; what libtpu's compiler holds against a chip's usable HBM (probed:
        arguments + temporaries of 15.5 GiB compile for a v5e, 16.0 are refused)."""
        return self.arguments + self.outputs - self.aliased + self.temporaries

    @property
    def total(self) -> int:
        """What the device holds for the program: its buffers and its code."""
        return self.buffers + self.code


@dataclasses.dataclass(frozen=True)
class Collective:
    """One kind of collective: how many instructions of it the program has, and the bytes
    of their results per device (an asynchronous one's output buffer). A loop body's
    instructions are counted once."""

    kind: str
    count: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class Estimate:
    """XLA's cost-model estimate per device: an estimate, not a measurement.

    Attributes:
      raw_seconds: `optimal_seconds` as the cost analysis gives it (None: not given).
      seconds: raw_seconds with the unpriced custom calls' -1 sentinels added back; None
        when that is still negative or nothing was given.
      flops: the program's FLOPs as XLA counts them (every op, loop bodies once).
      bytes_accessed: memory traffic as XLA counts it.
      unpriced_calls: custom calls priced at the -1 sentinel (added back in `seconds`).
      kernels: Pallas kernels (Mosaic or Triton custom calls) in the program.
      kernels_without_cost: of them, those with no cost estimate of their own (priced 0).
      loops: while loops in the program (each body priced once).
      windowed_loops: of them, XLA's windowed matmuls (a matmul and its collective split
        into steps over the shards).
    """

    raw_seconds: float | None
    seconds: float | None
    flops: float | None
    bytes_accessed: float | None
    unpriced_calls: int
    kernels: int
    kernels_without_cost: int
    loops: int
    windowed_loops: int = 0

    def blind_spots(self) -> list[str]:
        """What the estimate does not see in this program, in words (empty: nothing)."""
        spots = []
        if self.kernels_without_cost:
            spots.append(
                f"{self.kernels_without_cost} of {self.kernels} Pallas kernels have no cost estimate "
                "(priced 0)"
            )
        if self.loops:
            windowed = (
                f" ({self.windowed_loops} of them XLA's windowed matmuls)" if self.windowed_loops else ""
            )
            spots.append(
                f"{self.loops} loops{windowed}: each body priced once, whatever its trip count "
                "(a lower bound)"
            )
        if self.raw_seconds is not None and self.seconds is None:
            spots.append(f"optimal_seconds {self.raw_seconds:.4g} stays negative: an op it cannot price")
        return spots


@dataclasses.dataclass(frozen=True)
class Program:
    memory: Memory
    collectives: tuple[Collective, ...]
    estimate: Estimate


def analyse(compiled: Any) -> Program:
    """The memory, collectives and estimate of a `jax.stages.Compiled` (one device's share)."""
    text = compiled.as_text()
    return Program(memory(compiled), collectives(text), estimate(compiled, text))


def memory(compiled: Any) -> Memory:
    stats = compiled.memory_analysis()
    return Memory(
        arguments=int(stats.argument_size_in_bytes),
        outputs=int(stats.output_size_in_bytes),
        aliased=int(stats.alias_size_in_bytes),
        temporaries=int(stats.temp_size_in_bytes),
        code=int(stats.generated_code_size_in_bytes),
    )


def array_bytes(shape: str) -> list[int]:
    """The bytes of each array in an HLO shape ('bf16[128,2,64]{...}' or a tuple of them)."""
    sizes = []
    for dtype, dims in _ARRAY.findall(shape):
        bits = _BITS.get(dtype) or int(re.search(r"\d+", dtype).group())
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        sizes.append(count * bits // 8)
    return sizes


def collectives(hlo_text: str) -> tuple[Collective, ...]:
    """The collectives of an optimized HLO module's text, by kind (those it has)."""
    counts: dict[str, list[int]] = {}
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        sizes = array_bytes(match.group("shape"))
        # "-start" returns (operands..., output, contexts...): its largest buffer is the output.
        size = max(sizes, default=0) if match.group("start") else sum(sizes)
        counts.setdefault(match.group("op"), []).append(size)
    return tuple(Collective(kind, len(sizes), sum(sizes)) for kind, sizes in sorted(counts.items()))


def estimate(compiled: Any, hlo_text: str) -> Estimate:
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per program
        analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    raw = analysis.get("optimal_seconds")
    unpriced = sum(hlo_text.count(f'custom_call_target="{name}"') for name in _UNPRICED_CALLS)
    seconds = None if raw is None or raw + unpriced < 0 else raw + unpriced
    kernel_lines = [
        line
        for line in hlo_text.splitlines()
        if 'custom_call_target="tpu_custom_call"' in line or "__gpu$xla.gpu.triton" in line
    ]
    return Estimate(
        raw_seconds=raw,
        seconds=seconds,
        flops=analysis.get("flops"),
        bytes_accessed=analysis.get("bytes accessed"),
        unpriced_calls=unpriced,
        kernels=len(kernel_lines),
        kernels_without_cost=sum("cost_estimate" not in line for line in kernel_lines),
        loops=len(re.findall(r"\bwhile\(", hlo_text)),
        windowed_loops=len(re.findall(r"\bwhile\(.*body=%[\w.]*windowed_dot_general", hlo_text)),
    )
