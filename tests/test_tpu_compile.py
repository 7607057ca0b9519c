"""Compiling for TPU slices that are not here (pretrain/tpu_compile.py, core/tpu_slices.py,
core/compiled_program.py): slice names, the one-line errors (a mesh the slice's devices do not
fill, no libtpu), the reading of a compiled program's collectives; and, with libtpu (`make
test-extended` installs it), the tiny model's real step compiled for a one-host and a
two-host slice on a data x fsdp x tensor mesh through the flash kernel, its report read from
the compiled program, a step too large for its chips refused in one line through
launch_tpu.sh, and the flash kernel compiled by Mosaic for every TPU generation at every
head width and length the recipes train."""

import glob
import importlib.util
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from core import compiled_program, sharding, tpu_chips, tpu_slices
from models import attention, flash_attention
from models.attention import KeyMask
from pretrain import tpu_compile
from tests import cli_run
from tests.tiny import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "name, topology, accelerator_type, devices",
    [
        ("v4-32", "v4:2x2x4", "v4-32", 16),  # the name counts TensorCores, two per chip
        ("v5p-64", "v5p:2x4x4", "v5p-64", 32),
        ("v5p-8", "v5p:2x2x1", "v5p-8", 4),
        ("v5litepod-16", "v5e:4x4", "v5litepod-16", 16),
        ("v5e-8", "v5e:2x4", "v5litepod-8", 8),
        ("v6e-256", "v6e:16x16", "v6e-256", 256),
        ("v3-8", "v3:2x2", "v3-8", 8),  # a device per TensorCore
        ("v5e:1x1", "v5e:1x1", "v5litepod-1", 1),
        ("v4:4x4x12", "v4:4x4x12", "v4-384", 192),
    ],
)
def test_slice_names_give_their_topology_and_devices(name, topology, accelerator_type, devices):
    slice_ = tpu_slices.parse(name)
    assert (slice_.topology, slice_.accelerator_type, slice_.devices) == (topology, accelerator_type, devices)


@pytest.mark.parametrize(
    "name, message",
    [
        ("v9-8", "unknown TPU slice 'v9-8': give an accelerator type such as v5p-64"),
        (
            "v5p-48",
            "v5p-48: no slice shape is known for it; name its topology instead, e.g. --topology=v5p:4x4x4",
        ),
        ("v5e:4x4x4", "TPU v5e slices have 2 torus dimensions"),
        ("v5litepod-512", "a TPU v5e pod has at most 256 chips"),
    ],
)
def test_bad_slice_names_are_one_line(name, message, capsys):
    result = cli_run.run(tpu_compile.main, [f"--topology={name}", "--gin_file=configs/runs/demo.gin"], capsys)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.errors()[0].startswith("error: ") and message in result.errors()[0]


def test_a_mesh_that_does_not_fill_the_slice_is_one_line_before_libtpu(capsys, monkeypatch):
    monkeypatch.setattr(tpu_slices, "devices", lambda slice_: pytest.fail("libtpu asked for a bad mesh"))
    argv = ["--topology=v5litepod-16", "--mesh=data:3,fsdp:2", "--gin_file=configs/runs/demo.gin"]
    result = cli_run.run(tpu_compile.main, argv, capsys)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --mesh 'data:3,fsdp:2' has 6 devices but 16 are available: the product of the axis sizes "
        "must equal the device count"
    )


def test_without_libtpu_the_error_says_how_to_install_it(capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else find_spec(name, *a)
    )
    result = cli_run.run(
        tpu_compile.main, ["--topology=v5litepod-4", "--gin_file=configs/runs/demo.gin"], capsys
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: compiling for a TPU slice on this machine needs the libtpu wheel, which is not installed: "
        "pip install libtpu==0.0.42.1 (as requirements-tpu.txt pins it; x86-64 Linux only)"
    )


def test_libtpu_pin_is_the_one_requirements_tpu_and_jax_name():
    with open(os.path.join(ROOT, "requirements-tpu.txt")) as f:
        assert tpu_slices.LIBTPU_PIN in f.read().split()
    jax_wants = [r for r in importlib.metadata.requires("jax") if r.startswith("libtpu") and "tpu" in r]
    version = tpu_slices.LIBTPU_PIN.split("==")[1]
    assert any(re.match(r"libtpu==([\d.]+)\.\*", r).group(1) == version.rsplit(".", 1)[0] for r in jax_wants)


def test_every_generation_names_its_source_and_device_kind():
    assert [c.generation for c in tpu_chips.CHIPS] == ["v3", "v4", "v5e", "v5p", "v6e"]
    for chip in tpu_chips.CHIPS:
        assert chip.source.startswith("https://cloud.google.com/tpu/docs/")
        assert tpu_chips.by_device_kind(chip.device_kind) is chip
        assert 0.9 * chip.hbm_bytes < chip.usable_hbm_bytes <= 1.01 * chip.hbm_bytes


HLO = """
  %all-gather.3 = bf16[128,2,64]{2,0,1:T(8,128)(2,1)} all-gather(%p), channel_id=1, dimensions={0}
  ROOT %all-reduce.1 = (f32[1024]{0}, f32[4,4]{1,0}) all-reduce(%a, %b), to_apply=%sum
  %all-gather-start = (f32[8]{0}, f32[32]{0}) all-gather-start(%x), dimensions={0}
  %all-gather-done = f32[32]{0} all-gather-done(%all-gather-start)
  %cp = s8[100]{0} collective-permute(%y), source_target_pairs={{0,1}}
  %add.1 = f32[9]{0} add(%q, %r)
"""


def test_collectives_are_read_from_the_programs_text_by_kind():
    found = {c.kind: (c.count, c.bytes) for c in compiled_program.collectives(HLO)}
    # A tuple all-reduce counts both arrays; an asynchronous all-gather its output, at its start.
    assert found == {
        "all-gather": (2, 128 * 2 * 64 * 2 + 32 * 4),
        "all-reduce": (1, 1024 * 4 + 16 * 4),
        "collective-permute": (1, 100),
    }


class _Compiled:
    """What `compiled_program.estimate` reads of a jax.stages.Compiled."""

    def __init__(self, analysis):
        self.analysis = analysis

    def cost_analysis(self):
        return self.analysis


UNPRICED = """
  %c.1 = f32[8,64]{0,1} custom-call(%s.1, %s.2), custom_call_target="ConcatBitcast"
  %c.2 = f32[8,64]{0,1} custom-call(%s.3, %s.4), custom_call_target="ConcatBitcast"
  %k.1 = bf16[2,4] custom-call(%q), custom_call_target="tpu_custom_call", backend_config={"cost_estimate": 1}
  %k.2 = bf16[2,4]{1,0} custom-call(%q), custom_call_target="tpu_custom_call", backend_config={}
  %w.1 = (s32[], f32[8]) while(%t), condition=%cond, body=%wide.windowed_dot_general_body_rs.clone
  %w.2 = (s32[], f32[8]) while(%t.2), condition=%cond.2, body=%scan_body
"""


def test_the_estimate_is_the_programs_own_with_its_sentinels_added_back_and_its_blind_spots_named():
    estimate = compiled_program.estimate(_Compiled({"optimal_seconds": -1.75, "flops": 3e9}), UNPRICED)
    assert (estimate.raw_seconds, estimate.seconds, estimate.unpriced_calls, estimate.flops) == (
        -1.75,
        0.25,
        2,
        3e9,
    )
    assert (estimate.kernels, estimate.kernels_without_cost, estimate.loops, estimate.windowed_loops) == (
        2,
        1,
        2,
        1,
    )
    assert estimate.blind_spots() == [
        "1 of 2 Pallas kernels have no cost estimate (priced 0)",
        "2 loops (1 of them XLA's windowed matmuls): each body priced once, whatever its trip count "
        "(a lower bound)",
    ]
    # An op it cannot price beyond the known sentinels: no estimate rather than a wrong one.
    still_negative = compiled_program.estimate(_Compiled({"optimal_seconds": -3.5}), UNPRICED)
    assert still_negative.seconds is None and "stays negative" in still_negative.blind_spots()[-1]


@pytest.fixture(autouse=True)
def _libtpu_environment(monkeypatch):
    """The variables `tpu_slices.prepare_process` sets, restored after each test."""
    for name in (
        "JAX_PLATFORMS",
        "ALLOW_MULTIPLE_LIBTPU_LOAD",
        "TPU_SKIP_MDS_QUERY",
        "TPU_WORKER_HOSTNAMES",
        "TPU_ACCELERATOR_TYPE",
    ):
        monkeypatch.setenv(name, os.environ[name]) if name in os.environ else monkeypatch.delenv(
            name, raising=False
        )


def _tiny_step(topology: str, mesh: str, capsys, monkeypatch) -> tuple[list, cli_run.Result]:
    """The tiny model (tests/tiny.py) with attention dropout through 'flash', compiled for the
    slice by the CLI; returns its results too."""
    sizes = (
        "vocab_size",
        "hidden_size",
        "num_layers",
        "num_heads",
        "intermediate_size",
        "max_position_embeddings",
    )
    bindings = [f"EncoderConfig.{name} = {getattr(TINY, name)}" for name in sizes]
    bindings += [
        "EncoderConfig.attention_implementation = 'flash'",
        "EncoderConfig.attention_dropout_rate = 0.1",
        "PipelineConfig.max_seq_length = 32",
        "PipelineConfig.max_predictions_per_seq = 5",
    ]
    argv = ["--gin_file=configs/models/bert_tiny.gin", "--gin_file=configs/recipes/bert.gin"]
    argv += [f"--gin_bindings={b}" for b in bindings]
    argv += [f"--topology={topology}", f"--mesh={mesh}", "--batch_size=16"]
    results = []
    check = tpu_compile.check_and_report
    monkeypatch.setattr(
        tpu_compile, "check_and_report", lambda *a, **k: results.extend(check(*a, **k)) or results
    )
    return results, cli_run.run(tpu_compile.main, argv, capsys)


@pytest.mark.slow(60)
@pytest.mark.extended
@pytest.mark.parametrize(
    "topology, mesh, hosts",
    [("v5e:2x2", "data:1,fsdp:2,tensor:2", 1), ("v4:2x2x2", "data:2,fsdp:2,tensor:2", 2)],
    ids=["v5e-one-host", "v4-two-hosts"],
)
def test_the_tiny_step_compiles_for_a_slice_and_reports_what_the_program_says(
    topology, mesh, hosts, capsys, monkeypatch
):
    (result,), run = _tiny_step(topology, mesh, capsys, monkeypatch)
    assert run.returncode == 0, run.stderr
    assert (result.hosts, result.slice.topology, result.attention) == (hosts, topology, "flash")
    # The path followed the slice, not this CPU: Mosaic kernels (forward, dk/dv, dq), each
    # priced by its own cost estimate.
    estimate = result.program.estimate
    assert estimate.kernels >= 3 and estimate.kernels_without_cost == 0
    # The HBM report is the compiled program's own memory analysis.
    stats = result.compiled.memory_analysis()
    memory = result.program.memory
    assert (memory.arguments, memory.outputs, memory.aliased, memory.temporaries, memory.code) == (
        stats.argument_size_in_bytes,
        stats.output_size_in_bytes,
        stats.alias_size_in_bytes,
        stats.temp_size_in_bytes,
        stats.generated_code_size_in_bytes,
    )
    # The estimate is the compiled program's cost analysis (its -1 sentinels added back), and
    # says so in the report and the JSON line.
    raw = result.compiled.cost_analysis()["optimal_seconds"]
    assert estimate.raw_seconds == raw and estimate.seconds == raw + estimate.unpriced_calls > 0
    assert result.estimated_mfu == pytest.approx(
        result.model_flops / (result.slice.devices * result.slice.chip.peak_flops * estimate.seconds)
    )
    assert "XLA's cost-model estimate (an estimate, not a measurement)" in run.stdout
    line = json.loads(run.stdout.strip().splitlines()[-1])[0]
    assert line["xla_estimate"]["source"].startswith("XLA's cost model") and line["fits"] is True
    assert line["hbm_bytes_per_device"] == memory.total and line["mesh"] == dict(
        zip(("data", "fsdp", "tensor"), map(int, re.findall(r"\d+", mesh)))
    )
    assert any(kind in line["collectives"] for kind in ("all-gather", "all-reduce", "reduce-scatter"))


@pytest.mark.slow(120)
@pytest.mark.extended
def test_a_step_too_large_for_its_chips_is_refused_in_one_line_before_anything_starts(tmp_path):
    """launch_tpu.sh run --type v5litepod-4: the local check (pretrain.train --compile_for)
    refuses BERT-large at 1024 x 128 rows on four v5e chips; no gcloud command runs."""
    env = {**os.environ, "PYTHON": sys.executable, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    gcloud = tmp_path / "gcloud"
    gcloud.write_text(f"#!/bin/sh\ntouch {tmp_path}/gcloud_ran\n")
    gcloud.chmod(0o755)
    env.pop("DRY_RUN", None)
    argv = ["bash", os.path.join(ROOT, "launch_tpu.sh"), "run", "--name", "n", "--zone", "z"]
    argv += ["--type", "v5litepod-4", "--workdir", str(tmp_path / "run"), "--"]
    argv += ["--gin_file=configs/models/bert_large.gin", "--gin_file=configs/recipes/bert.gin"]
    argv += ["--gin_bindings=run.batch_size = 1024", "--gin_bindings=EncoderConfig.dtype = 'bfloat16'"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.fullmatch(
        r"error: the step \(batch 1024 x 128\) does not fit a TPU v5e chip of v5litepod-4 "
        r"\(v5e:2x2, 4 devices\): "
        r"it needs [\d.]+ GiB of HBM per chip and the compiler has 15.75 GiB \(of 16 GiB\): .*",
        errors[0],
    ), errors[0]
    assert not (tmp_path / "gcloud_ran").exists() and not (tmp_path / "run").exists()


def _recipe_attention_shapes() -> tuple[list[int], list[int]]:
    """The head widths of every model the configs define (ELECTRA's generators have heads of
    64 too: models/electra.py) and every length the recipes train at."""
    widths, lengths = set(), set()
    for path in glob.glob(os.path.join(ROOT, "configs/models/*.gin")):
        text = open(path).read()
        hidden = int(re.search(r"EncoderConfig.hidden_size = (\d+)", text).group(1))
        heads = int(re.search(r"EncoderConfig.num_heads = (\d+)", text).group(1))
        widths.add(hidden // heads)
    for path in glob.glob(os.path.join(ROOT, "configs/recipes/*.gin")):
        lengths.update(int(x) for x in re.findall(r"max_seq_length = (\d+)", open(path).read()))
    return sorted(widths), sorted(lengths)


@pytest.mark.slow(60)
@pytest.mark.extended
@pytest.mark.parametrize("accelerator_type", ["v4-8", "v5litepod-4", "v5p-8", "v6e-4"])
def test_the_flash_kernel_compiles_through_mosaic_for_every_generation(accelerator_type):
    """Through the encoder's own call (models/attention.py `attend`, under the slice's mesh:
    the kernel language follows the target), forward and backward, bf16, packed rows, with
    and without dropout, at every head width and length of the recipes; at 128 both the
    default wide key tiles and the quarter tiles. Mosaic's compilation is libtpu's, here."""
    widths, lengths = _recipe_attention_shapes()
    assert widths == [64, 128] and lengths == [128, 512]  # (ALBERT-xlarge: 128) a new shape joins the cases
    devices = tpu_slices.devices(tpu_slices.parse(accelerator_type))
    partitioner = sharding.Partitioner(
        sharding.make_mesh(f"data:{len(devices)}", devices), sharding.logical_axis_rules()
    )
    assert attention.platform() == "cpu"
    for width in widths:
        for length in lengths:
            tilings = [None, flash_attention.BlockSizes(wide_keys=False)] if length == 128 else [None]
            for rate in (0.1, 0.0):
                for tiles in tilings:
                    compiled = _flash_step(partitioner, len(devices) * 2, length, width, rate, tiles)
                    program = compiled_program.analyse(compiled)
                    assert program.estimate.kernels == 3 and program.estimate.kernels_without_cost == 0
                    assert program.estimate.flops > 4 * 2 * 4 * length * length * width  # the kernels' own


def _flash_step(partitioner, batch, length, width, rate, tiles):
    heads = 4
    batch_sharding = partitioner.batch_sharding
    shape = jax.ShapeDtypeStruct((batch, length, heads, width), jnp.bfloat16, sharding=batch_sharding)
    ids = jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=batch_sharding)

    def loss(q, k, v, input_mask, example_ids):
        mask = KeyMask(input_mask, example_ids, jnp.arange(batch, dtype=jnp.int32))
        assert attention.platform() == "tpu"  # traced under the slice's mesh
        out = attention.attend(
            "flash",
            q,
            k,
            v,
            mask,
            dropout_rate=rate,
            dropout_rng=jax.random.key(0) if rate else None,
            flash_block_sizes=tiles,
        )
        return out.astype(jnp.float32).sum()

    with partitioner:
        lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape, ids, ids)
    with tpu_compile.no_persistent_cache():
        return lowered.compile()


def _row(mesh: str, seconds: float, loops: bool = False, fits: bool = True) -> dict:
    spots = ["6 loops: each body priced once, whatever its trip count (a lower bound)"] if loops else []
    return {
        "member": "bert_base_128",
        "slice": "v5litepod-16",
        "mesh_spec": mesh,
        "flash": False,
        "recipe_batch": 256,
        "batch": 256,
        "attention": "explicit",
        "fits": fits,
        "hbm_bytes_per_device": 3 * 2**30,
        "buffer_bytes_per_device": 3 * 2**30,
        "usable_hbm_bytes": int(15.75 * 2**30),
        "xla_estimate": {"seconds": seconds, "mfu": 0.1, "blind_spots": spots},
        "collectives": {"all-reduce": {"count": 6, "bytes": 2**29}},
        "compile_seconds": 100.0,
    }


def test_the_table_favours_the_lowest_complete_estimate_and_marks_lower_bounds():
    from bench import tpu_table

    rows = [
        _row("data:-1", 0.035),
        _row("fsdp:-1", 0.030, loops=True),
        _row("data:4,fsdp:4", 0.020, fits=False),
    ]
    lines = tpu_table.table(rows).splitlines()[2:]
    assert "| data:-1 (favoured) |" in lines[0] and "| 35.0 | 10.0% |" in lines[0]
    assert "(favoured)" not in lines[1] and "| >= 30.0 | <= 10.0% |" in lines[1]
    assert "(favoured)" not in lines[2] and "| tight |" in lines[2] and "AR 6 / 0.50" in lines[0]
