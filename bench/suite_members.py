"""The suite's rows: each family member at its recipe's training shape, and the levers to try.

A Member is one run of `bench.pretrain`: a model's gin files and its recipe's, at the batch
and length the recipe trains (MEMBERS); an arm (ARMS) changes one thing of a member, its
base, and is measured against it. `--tiny` (TINY_BINDINGS) keeps every member's structure
at a size a CPU compiles in seconds.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Member:
    """One row of the suite: our step for these gin files at batch x seq."""

    name: str
    gin_files: tuple[str, ...]
    batch: int
    seq: int
    peer: bool = False  # also time HF Flax BERT at this shape
    bindings: tuple[str, ...] = ()  # gin bindings after the files (an ablation arm)
    options: tuple[str, ...] = ()  # bench.pretrain's own flags (e.g. --dropout_prng=rbg)
    xla_flags: tuple[str, ...] = ()  # added to XLA_FLAGS of the member's process
    base: str | None = None  # an arm: the member it is measured against


BERT_BASE = ("configs/models/bert_base.gin", "configs/recipes/bert.gin")
BERT_LARGE = ("configs/models/bert_large.gin", "configs/recipes/bert.gin")
BERT_BASE_128 = Member("bert_base_128", BERT_BASE, 256, 128, peer=True)
BERT_LARGE_512 = Member("bert_large_512", BERT_LARGE, 32, 512, peer=True)
MEMBERS = (
    BERT_BASE_128,
    BERT_LARGE_512,
    # What BERT's attention dropout costs: without it 'auto' takes the platform's fused kernel.
    Member(
        "bert_large_512_no_attention_dropout",
        BERT_LARGE,
        32,
        512,
        bindings=("EncoderConfig.attention_dropout_rate = 0.0",),
    ),
    # BERT's attention dropout in our flash kernel (opt-in until this row beats bert_large_512).
    Member(
        "bert_large_512_flash",
        BERT_LARGE,
        32,
        512,
        bindings=("EncoderConfig.attention_implementation = 'flash'",),
    ),
    Member(
        "roberta_large_512",
        ("configs/models/roberta_large.gin", "configs/recipes/roberta_large.gin"),
        32,
        512,
    ),
    Member(
        "albert_xxlarge_512", ("configs/models/albert_xxlarge.gin", "configs/recipes/albert.gin"), 32, 512
    ),
    Member(
        "electra_base_512", ("configs/models/electra_base.gin", "configs/recipes/electra_base.gin"), 32, 512
    ),
    Member(
        "spanbert_large_512", ("configs/models/spanbert_large.gin", "configs/recipes/spanbert.gin"), 32, 512
    ),
    Member(
        "deberta_v3_base_512",
        ("configs/models/deberta_v3_base.gin", "configs/recipes/deberta_v3.gin"),
        32,
        512,
    ),
    # Both streams and the recipe's 384 memory positions; 80 targets per row (bench.pretrain's
    # P at 512, where the recipe has 85).
    Member("xlnet_base_512", ("configs/models/xlnet_base.gin", "configs/recipes/xlnet.gin"), 32, 512),
)


def _arm(base: Member, name: str, **change) -> Member:
    """`base` with one thing changed, measured against it."""
    return dataclasses.replace(base, name=name, peer=False, base=base.name, **change)


# The levers to try on an accelerator, each alone against the member it changes (`--arms`
# runs them with their bases; --only names any). XLA's flags need a process of their own.
ARMS = (
    _arm(BERT_BASE_128, "bert_base_128_triton_gemm_off", xla_flags=("--xla_gpu_enable_triton_gemm=false",)),
    _arm(
        BERT_BASE_128,
        "bert_base_128_cudnn_layer_norm",
        xla_flags=("--xla_gpu_enable_cudnn_layer_norm=true",),
    ),
    _arm(BERT_BASE_128, "bert_base_128_batch_512", batch=512),
    _arm(BERT_BASE_128, "bert_base_128_rbg_dropout", options=("--dropout_prng=rbg",)),
    # Remat costs recomputation; it pays only where it lets a larger batch fit.
    _arm(
        BERT_LARGE_512,
        "bert_large_512_remat",
        bindings=BERT_LARGE_512.bindings + ("EncoderConfig.remat_policy = 'dots_saveable'",),
    ),
    _arm(BERT_LARGE_512, "bert_large_512_batch_64", batch=64),
)
# --tiny: every member's structure (objective, embeddings, attention kind) at a size a CPU
# compiles in seconds.
TINY_BINDINGS = (
    "EncoderConfig.num_layers = 1",
    "EncoderConfig.hidden_size = 64",
    "EncoderConfig.num_heads = 2",
    "EncoderConfig.intermediate_size = 128",
    "EncoderConfig.vocab_size = 512",
    "REUSE_LEN = 16",  # XLNet's reused part, within the tiny rows (a macro the others leave unread)
)
TINY_BATCH, TINY_SEQ = 2, 32
BY_NAME = {m.name: m for m in MEMBERS + ARMS}


def lever(arm: Member) -> str:
    """What an arm changes in its base member, in words for the table."""
    base = BY_NAME[arm.base]
    changes = list(arm.xla_flags) + list(arm.options)
    changes += [b for b in arm.bindings if b not in base.bindings]
    if (arm.batch, arm.seq) != (base.batch, base.seq):
        changes.append(f"batch {arm.batch} x {arm.seq}")
    return ", ".join(changes)
