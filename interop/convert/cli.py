"""Checkpoint import and export between our workdirs and transformers folders / original
TF1 checkpoints.

    python -m interop.convert import --from=hf:DIR --workdir=OUT   # config.json + model.safetensors
    python -m interop.convert import --from=tf:DIR --workdir=OUT   # {bert,albert}_config.json + model.ckpt
    python -m interop.convert export --workdir=W --to=hf:OUT
    # ELECTRA: the discriminator (ElectraForPreTraining) and, optionally, the generator
    # (ElectraForMaskedLM), published as two folders, are one workdir here
    python -m interop.convert import --from=hf:DISC --generator_from=hf:GEN --workdir=OUT
    python -m interop.convert export --workdir=W --to=hf:DISC --generator_to=hf:GEN

Families: HF model_type bert, roberta, albert, electra, deberta, deberta-v2 (DeBERTa-v2
and v3) and xlnet; TF1 checkpoints of google-research/bert and google-research/albert. An imported
workdir is what fine-tuning (`finetune.glue --init_from`), `interop.encode` and
`interop.predict` read as it is.
"""

from __future__ import annotations

import logging
import os

import core.tf_env  # noqa: F401  (TensorFlow's environment, before TensorFlow is imported)

from core import cli
from interop.convert.format import read_json
from interop.convert.hf import export_hf, import_hf
from interop.convert.layout import ConversionError
from interop.convert.tf1 import import_tf
from interop.convert.workdir import Imported, write_workdir


def _source(spec: str, flag: str = "--from") -> tuple[str, str]:
    kind, sep, path = spec.partition(":")
    if not sep or kind not in ("hf", "tf") or not path:
        raise ConversionError(
            f"{flag}={spec!r}: write hf:DIR (a transformers folder) or tf:DIR (a TF1 checkpoint)"
        )
    return kind, path


def run_import(source: str, workdir: str, generator_source: str | None = None) -> Imported:
    """Imports `source` ("hf:DIR" / "tf:DIR"; ELECTRA's generator "hf:DIR") into a new workdir."""
    kind, path = _source(source)
    if generator_source is None:
        imported = import_hf(path) if kind == "hf" else import_tf(path)
    else:
        generator_kind, generator_path = _source(generator_source, "--generator_from")
        if (kind, generator_kind) != ("hf", "hf"):
            raise ConversionError(
                "ELECTRA imports from transformers folders only: --from=hf:DIR --generator_from=hf:DIR"
            )
        imported = import_hf(path, generator_path)
    write_workdir(workdir, imported)
    return imported


def build_parser():
    parser = cli.parser(__doc__, "interop.convert")
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        help="import (a published checkpoint -> a workdir) or export (a workdir -> transformers)",
    )
    imp = commands.add_parser(
        "import", help="a published checkpoint -> a workdir", formatter_class=parser.formatter_class
    )
    imp.add_argument(
        "--from",
        dest="source",
        required=True,
        help="hf:DIR (a transformers folder) or tf:DIR (a TF1 checkpoint); for ELECTRA the "
        "discriminator (ElectraForPreTraining)",
    )
    imp.add_argument(
        "--generator_from",
        dest="generator_source",
        default=None,
        help="ELECTRA only: hf:DIR, the generator (ElectraForMaskedLM) to import with the "
        "discriminator (optional; fill-mask needs it)",
    )
    imp.add_argument("--workdir", required=True, help="new workdir to write")
    exp = commands.add_parser(
        "export", help="a workdir -> a transformers folder", formatter_class=parser.formatter_class
    )
    exp.add_argument("--workdir", required=True, help="pretraining or imported workdir")
    exp.add_argument(
        "--to",
        dest="target",
        required=True,
        help="hf:DIR, the folder to write (ELECTRA: the discriminator, ElectraForPreTraining)",
    )
    exp.add_argument(
        "--generator_to",
        dest="generator_target",
        default=None,
        help="ELECTRA and DeBERTa-v3 only: hf:DIR, a second folder for the generator "
        "(ElectraForMaskedLM / DebertaV2ForMaskedLM); "
        "without it the generator is not exported",
    )
    exp.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    return parser


def _hf_target(spec: str, flag: str) -> str:
    kind, _, path = spec.partition(":")
    if kind != "hf" or not path:
        raise ConversionError(f"{flag}={spec!r}: write hf:DIR (export to TF1 is not supported)")
    return path


def _run(args) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "import":
        imported = run_import(args.source, args.workdir, args.generator_source)
        c = imported.config
        print(
            f"imported {imported.model_type} ({c.num_layers} layers, hidden {c.hidden_size}, "
            f"vocab {c.vocab_size}; parts: encoder, {', '.join(imported.groups) or 'no heads'}) "
            f"-> {args.workdir}"
        )
        return
    path = _hf_target(args.target, "--to")
    generator_path = (
        None if args.generator_target is None else _hf_target(args.generator_target, "--generator_to")
    )
    architecture = export_hf(args.workdir, path, args.step, generator_path)
    generator = ""
    if generator_path is not None:  # ElectraForMaskedLM or DebertaV2ForMaskedLM
        written = read_json(os.path.join(generator_path, "config.json"), generator_path)
        generator = f"; generator -> {generator_path} ({written['architectures'][0]})"
    print(f"exported {args.workdir} -> {path} ({architecture}, model.safetensors){generator}")


main = cli.entry(build_parser, _run)
