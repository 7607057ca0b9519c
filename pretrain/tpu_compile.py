r"""Compile a recipe's real train step for a TPU slice that is not here, and say whether it fits.

    python -m pretrain.tpu_compile --topology=v5litepod-16 --gin_file=configs/models/bert_base.gin \
        --gin_file=configs/recipes/bert.gin [--mesh=data:-1] [--batch_size=256] [--microbatches=1] \
        [--gin_bindings="EncoderConfig.attention_implementation = 'flash'"]

`--topology` is a Cloud TPU accelerator type (v5p-64, v5litepod-16, v6e-16, v4-32) or a
libtpu topology (v5p:2x4x4). The step is the one `pretrain.train` runs: the recipe's model,
objective, optimizer, dropout, attention path (chosen for the TPU, not this machine),
microbatches and mesh, with the state and the batch abstract (nothing is allocated, no data
is read), compiled by libtpu's own compiler on this machine (`pip install libtpu==0.0.42.1`,
x86-64 Linux). Per chip it prints the HBM the program holds (arguments, outputs,
temporaries, code) against what the compiler lets a program use, the compile time, the
collectives by kind with their bytes, and XLA's cost-model estimate of the step's time
with the MFU it implies, labelled as the estimate it is, with what the cost model cannot
see. The last line is one JSON object.

A step that does not fit, or does not compile for that chip, is one `error:` line (status
2) naming the chip, the bytes needed and the bytes available; `pretrain.train
--compile_for=SLICE` and `launch_tpu.sh run --type SLICE` run the same check first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
import time
from typing import Any

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli, tpu_slices
from core.errors import UserError
from core.tpu_chips import GIB


class CompileCheckError(UserError):
    """The step does not fit the slice's chips, or does not compile for them."""


def build_parser():
    parser = cli.parser(__doc__, "pretrain.tpu_compile")
    cli.add_gin_flags(parser)
    add_slice_flag(parser, "--topology", required=True)
    parser.add_argument(
        "--mesh",
        default=None,
        help="e.g. 'data:4,fsdp:4' over the slice's devices; default every device on data",
    )
    parser.add_argument(
        "--batch_size", type=cli.positive_int, default=None, help="global batch (default: run.batch_size)"
    )
    parser.add_argument(
        "--microbatches", type=cli.positive_int, default=None, help="default: run.microbatches"
    )
    return parser


def add_slice_flag(parser, flag: str, *, required: bool = False, purpose: str = "") -> None:
    """The slice flag (`--topology` here, `pretrain.train --compile_for`)."""
    parser.add_argument(
        flag,
        required=required,
        default=None,
        metavar="SLICE",
        help=f"{purpose}a TPU slice: accelerator type (v5p-64, v5litepod-16, v6e-16, v4-32) or topology "
        "(v5p:2x4x4)",
    )


@dataclasses.dataclass(frozen=True)
class Result:
    """One phase's compiled step on the slice (per chip, or per device on v3)."""

    slice: tpu_slices.Slice
    hosts: int
    mesh: dict[str, int]
    batch: int
    seq_len: int
    predictions: int
    microbatches: int
    attention: str
    lower_seconds: float
    compile_seconds: float
    model_flops: float  # per step, all devices (core/flops.py's count)
    program: Any  # core.compiled_program.Program
    compiled: Any = dataclasses.field(repr=False, default=None)  # the jax.stages.Compiled it was read from

    @property
    def fits(self) -> bool:
        """The program's buffers within what the compiler allows a program (its code apart,
        as the compiler counts). A step over it compiled all the same is reported, not refused:
        the compiler's own check, which passed, is the one a device applies."""
        return self.program.memory.buffers <= self.slice.chip.usable_hbm_bytes

    @property
    def estimated_mfu(self) -> float | None:
        """Model FLOPs / (devices x peak x XLA's estimated seconds): implied by the estimate."""
        seconds = self.program.estimate.seconds
        if not seconds:
            return None
        return self.model_flops / (self.slice.devices * self.slice.chip.peak_flops * seconds)

    def lines(self) -> list[str]:
        """The report, for people."""
        chip, memory, estimate = self.slice.chip, self.program.memory, self.program.estimate
        usable = chip.usable_hbm_bytes
        verdict = (
            f"fits, {_gib(usable - memory.buffers)} headroom"
            if self.fits
            else f"compiled, yet its buffers exceed that by {_gib(memory.buffers - usable)} as the memory "
            "analysis counts them: tight, only a device shows whether it runs"
        )
        lines = [
            f"{self.slice}, {_count(self.hosts, 'host')}; mesh {_mesh(self.mesh)}; batch {self.batch} x "
            f"{self.seq_len} ({self.predictions} predictions per row, "
            f"{_count(self.microbatches, 'microbatch')}); attention {self.attention}",
            f"HBM per device: {_gib(memory.total)}, its buffers {_gib(memory.buffers)} of the "
            f"{_gib(usable)} the compiler allows a program (TPU {chip.generation}: {_gib(chip.hbm_bytes)}): "
            f"{verdict}",
            f"  arguments {_gib(memory.arguments)}, outputs {_gib(memory.outputs)} "
            f"({_gib(memory.aliased)} of them in donated arguments' buffers), "
            f"temporaries {_gib(memory.temporaries)}, code {_gib(memory.code)}",
            f"compile: {self.compile_seconds:.1f} s (lowering {self.lower_seconds:.1f} s) on this machine",
            "collectives per device (loop bodies once): "
            + (
                ", ".join(f"{c.kind} {c.count} ({_gib(c.bytes)})" for c in self.program.collectives) or "none"
            ),
        ]
        if estimate.seconds is None:
            lines.append(f"XLA's cost-model estimate: none (optimal_seconds {estimate.raw_seconds})")
        else:
            lines.append(
                "XLA's cost-model estimate (an estimate, not a measurement): "
                f"{1e3 * estimate.seconds:.2f} ms per step, implying {100 * self.estimated_mfu:.1f}% MFU "
                "(model FLOPs / devices / "
                f"{chip.peak_flops / 1e12:g} TFLOP/s / the estimate)"
            )
        lines.append(
            "  what the estimate does not see: " + ("; ".join(estimate.blind_spots()) or "nothing counted")
        )
        return lines

    def as_json(self) -> dict[str, Any]:
        memory, estimate = self.program.memory, self.program.estimate
        return {
            "slice": self.slice.accelerator_type,
            "topology": self.slice.topology,
            "devices": self.slice.devices,
            "hosts": self.hosts,
            "mesh": self.mesh,
            "batch": self.batch,
            "seq": self.seq_len,
            "predictions": self.predictions,
            "microbatches": self.microbatches,
            "attention": self.attention,
            "fits": self.fits,
            "hbm_bytes_per_device": memory.total,
            "buffer_bytes_per_device": memory.buffers,
            "usable_hbm_bytes": self.slice.chip.usable_hbm_bytes,
            "memory": dataclasses.asdict(memory),
            "lower_seconds": round(self.lower_seconds, 2),
            "compile_seconds": round(self.compile_seconds, 2),
            "collectives": {c.kind: {"count": c.count, "bytes": c.bytes} for c in self.program.collectives},
            "xla_estimate": {
                "source": "XLA's cost model (compiled.cost_analysis()), an estimate, not a measurement",
                "seconds": estimate.seconds,
                "raw_optimal_seconds": estimate.raw_seconds,
                "unpriced_calls_added_back": estimate.unpriced_calls,
                "flops_per_device": estimate.flops,
                "bytes_accessed_per_device": estimate.bytes_accessed,
                "mfu": self.estimated_mfu,
                "blind_spots": estimate.blind_spots(),
            },
            "model_flops_per_step": self.model_flops,
        }


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('ch') else 's'}"


def _mesh(mesh: dict[str, int]) -> str:
    return ",".join(f"{axis}:{size}" for axis, size in mesh.items())


def check(
    slice_name: str,
    mesh_spec: str | None = None,
    *,
    batch_size: int | None = None,
    microbatches: int | None = None,
) -> list[Result]:
    """Compiles the gin config's train step (every phase's length) for the slice.

    The gin files are parsed already. Raises a one-line UserError for a bad slice or mesh,
    a missing libtpu, and CompileCheckError for a step that does not fit or compile.
    """
    import jax

    from core import compiled_program, sharding
    from pretrain import step as step_lib
    from pretrain import trainer
    from pretrain.objectives import make_objective

    slice_ = tpu_slices.parse(slice_name)
    sharding.parse_mesh(mesh_spec, slice_.devices)  # a mesh that does not fit: one line, before libtpu
    devices = tpu_slices.devices(slice_)
    # The data is not read: a run file's data_dir may be a bucket this machine cannot see.
    unbound = {} if _bound("run.data_dir") else {"data_dir": "(not read by the compile check)"}
    settings = trainer.RunSettings(**unbound)
    batch = batch_size or settings.batch_size
    k = microbatches or settings.microbatches
    partitioner = sharding.Partitioner.create(mesh_spec, devices)
    hosts = len({d.process_index for d in devices})
    sharding.check_batch_size(batch, partitioner.mesh, hosts, k)
    objective = make_objective(settings.model_config, settings.pipeline_config)
    optimizer, schedule = settings.optimizer_fn(total_steps=settings.steps)
    steps = step_lib.build(
        objective=objective,
        optimizer=optimizer,
        schedule=schedule,
        partitioner=partitioner,
        batch_size=batch,
        microbatches=k,
        skip_nonfinite=settings.max_skipped_steps > 0,
        dropout_prng=settings.dropout_prng,
    )
    rng = jax.eval_shape(lambda: jax.random.key(0))
    phases = [settings.pipeline_config] + [c for c in [settings.phase2_pipeline_config] if c is not None]
    results = []
    for config in phases:
        length, predictions = config.max_seq_length, config.max_predictions_per_seq
        spec = objective.batch_spec(batch, length, predictions)
        abstract_batch = {
            key: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=partitioner.batch_sharding)
            for key, s in spec.items()
        }
        start = time.perf_counter()
        with partitioner:
            attention, _ = settings.model_config.attention_choice(length, dropout=True)
            lowered = steps.train_step.lower(steps.states.abstract, abstract_batch, rng)
        lowered_at = time.perf_counter()
        try:
            with no_persistent_cache():
                compiled = lowered.compile()
        except Exception as e:  # libtpu's JaxRuntimeError: out of memory, or a kernel it rejects
            raise _compile_error(e, slice_, batch, length) from None
        results.append(
            Result(
                slice=slice_,
                hosts=hosts,
                mesh=dict(partitioner.mesh.shape),
                batch=batch,
                seq_len=length,
                predictions=predictions,
                microbatches=k,
                attention=attention,
                lower_seconds=lowered_at - start,
                compile_seconds=time.perf_counter() - lowered_at,
                model_flops=objective.flops_per_row(length, predictions) * batch,
                program=compiled_program.analyse(compiled),
                compiled=compiled,
            )
        )
    return results


@contextlib.contextmanager
def no_persistent_cache():
    """JAX's persistent compilation cache off for the block: a compile-only client cannot
    read back what it writes there (`PjRtCompiler must be constructed with a Client to call
    DeserializeLoadedExecutable`), so every read would warn and compile again, and every
    write would fill the cache with programs no process can load."""
    import jax

    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)


def _bound(name: str) -> bool:
    """Whether the parsed gin config binds `name`."""
    import gin

    try:
        gin.query_parameter(name)
    except ValueError:
        return False
    return True


# libtpu's words for a program larger than the chip's HBM.
_OUT_OF_MEMORY = re.compile(r"\(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)")


def _compile_error(e: Exception, slice_: tpu_slices.Slice, batch: int, length: int) -> CompileCheckError:
    message = " ".join(str(e).split())
    found = _OUT_OF_MEMORY.search(message)
    chip = slice_.chip
    if found:
        return CompileCheckError(
            f"the step (batch {batch} x {length}) does not fit a TPU {chip.generation} chip of {slice_}: "
            f"it needs {found.group(1)} GiB of HBM per chip and the compiler has {found.group(2)} GiB (of "
            f"{chip.hbm_bytes / GIB:g} GiB): lower the batch, raise run.microbatches, shard over fsdp in "
            "--mesh, or take a larger slice"
        )
    return CompileCheckError(
        f"the step does not compile for TPU {chip.generation} ({slice_}): {message[:400]}"
    )


def check_and_report(
    slice_name: str, mesh_spec: str | None, *, batch_size: int | None = None, microbatches: int | None = None
) -> list[Result]:
    """`check`, each phase's report printed, then one JSON line (a step the compiler refuses
    is a CompileCheckError from `check`)."""
    results = check(slice_name, mesh_spec, batch_size=batch_size, microbatches=microbatches)
    for result in results:
        print("\n".join(result.lines()))
    print(json.dumps([r.as_json() for r in results]))
    return results


def compile_check(slice_name: str, args, *, batch_size: int | None = None, microbatches: int | None = None):
    """The whole check in a fresh process, from a tool's gin and mesh flags (this tool's,
    `pretrain.train --compile_for`'s): the process compiles, and runs nothing."""
    tpu_slices.prepare_process(tpu_slices.parse(slice_name))  # before JAX starts its backends
    from pretrain import trainer  # noqa: F401  (registers what model and recipe files bind)

    cli.setup_logging()
    cli.parse_gin(cli.gin_files(args), args.gin_bindings)
    return check_and_report(slice_name, args.mesh, batch_size=batch_size, microbatches=microbatches)


def _run(args) -> None:
    compile_check(args.topology, args, batch_size=args.batch_size, microbatches=args.microbatches)


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
