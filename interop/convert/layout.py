"""How a parameter is named and laid out in another framework: the rows of a family's name
table (`Module`), and one array of it (`Param`) with the conversion of its layout.

A table has one row per module: its group (the encoder, or an optional head), our path,
its kind, its HF name ("{base}" = the `bert.` / `roberta.` / ... prefix that HF models
with heads put before the encoder) and its TF1 name (None: the family has no TF1
checkpoints). `{i}` is the layer index. How a module's arrays are laid out differs by
framework:

    ours             HF (torch)                 TF1
    dense kernel     [in, out]                  weight [out, in]          kernel [in, out]
    q/k/v kernel     [H, N, D]                  weight [N*D, H]           kernel [H, N*D]
    attn out kernel  [N, D, H]                  weight [H, N*D]           kernel [N*D, H]
    q/k/v bias       [N, D]                     bias [N*D]                bias [N*D]
    LayerNorm        scale, bias                weight, bias              gamma, beta
    NSP/SOP head     kernel [H, 2]              weight [2, H]             output_weights [2, H]
    DeBERTa conv     kernel [K, H_in, H_out]    weight [H_out, H_in, K]
    DeBERTa v1 q/k/v 3 kernels [H, N, D]        in_proj.weight [3*N*D, H], rows [q_n; k_n; v_n] per head n
    XLNet arrays     any (q/k/v/r [H, N, D])    the same
    XLNet attn out   kernel [N, D, H]           o [H, N, D]
    XLNet mask_emb   [H]                        [1, 1, H]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np

from core.errors import UserError


class ConversionError(UserError):
    """A checkpoint, config or tokenizer that cannot be converted (one line, user-facing)."""


# Module kinds: how a module's parameters are named and laid out.
EMBED = "embed"  # ours: embedding [rows, H]
DENSE = "dense"  # ours: kernel [in, out], bias [out]
HEADS_IN = "heads_in"  # q/k/v projection, ours: kernel [H, N, D], bias [N, D]
HEADS_OUT = "heads_out"  # attention output projection, ours: kernel [N, D, H], bias [H]
NORM = "norm"  # ours: scale, bias
BIAS = "bias"  # a lone vector (the MLM output bias)
CLASSIFIER = "classifier"  # DENSE, but TF names it output_weights [out, in] / output_bias
KERNEL = "kernel"  # DENSE without a bias (DeBERTa's embed_proj, v1's pos_proj)
# DeBERTa v1's query/key/value: one HF `in_proj.weight` [3*N*D, H] (no bias) holding head n's
# query, key and value rows at n*3D + {0, D, 2D} + d, and separate `q_bias`, `v_bias` [N*D]
# (the key has no bias). Ours: attention/{query, key, value}/kernel [H, N, D], query and
# value bias [N, D].
FUSED_QKV = "fused_qkv"
CONV1D = "conv1d"  # DeBERTa-v2's convolution, ours: kernel [K, H_in, H_out]; torch [H_out, H_in, K]
ARRAY = "array"  # one array of the same shape in both, our path given in full (XLNet's parameters)
ROLLED = "rolled"  # ours [..., H], theirs [H, ...] (XLNet's attention output kernel [N, D, H] / [H, N, D])
UNIT_AXES = "unit_axes"  # ours [H], theirs [1, 1, H] (XLNet's mask_emb, shaped for time x batch)


@dataclasses.dataclass(frozen=True)
class Module:
    """One row of a name table.

    ours: path in the pretraining parameter tree; hf: name in an HF state dict, where
    "{base}" stands for the encoder prefix ("bert." in models with heads, "" in BertModel);
    tf: variable name in the original TF checkpoint (None: the family has none, e.g.
    RoBERTa). "{i}" is the layer index.
    """

    group: str  # "encoder" (required) or one of format.OPTIONAL_GROUPS
    ours: str
    kind: str
    hf: str
    tf: str | None


def rows(group: str, ours: str, hf: str, tf_: str | None, suffixes: Iterable[tuple]) -> list[Module]:
    """Modules from (our suffix, kind, HF suffix[, TF suffix]) rows under common prefixes."""
    return [
        Module(group, ours + o, kind, hf + h, None if tf_ is None else tf_ + t[0])
        for o, kind, h, *t in suffixes
    ]


def heads(*suffixes: tuple) -> list[Module]:
    """Modules from full (group, our path, kind, HF name, TF name) rows."""
    return [Module(*row) for row in suffixes]


@dataclasses.dataclass(frozen=True)
class Param:
    """One array: our path, its name in the other framework, and how it is laid out there.

    layout: "table" (same shape), "vector" (flattened), "in_out" (2-D kernel [in, out]),
    "out_in" (2-D kernel [out, in]), "reversed" (axes in reverse order: torch's Conv1d
    weight [H_out, H_in, K] for our [K, H_in, H_out]), "rolled" (our last axis first),
    "unit_axes" (two leading axes of 1 before ours) or "fused_qkv" (our [H, N, D] kernel is
    part `part` (0 query, 1 key, 2 value) of DeBERTa v1's in_proj.weight [3*N*D, H], whose
    rows are [q_n; k_n; v_n] per head n); in_axes: how many leading axes of ours form `in`.
    """

    group: str
    ours: tuple[str, ...]
    theirs: str
    layout: str
    in_axes: int = 1
    part: int = 0

    def their_shape(self, our_shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.layout == "table":
            return tuple(our_shape)
        if self.layout == "vector":
            return (math.prod(our_shape),)
        if self.layout == "reversed":
            return tuple(our_shape)[::-1]
        if self.layout == "rolled":
            return (our_shape[-1], *our_shape[:-1])
        if self.layout == "unit_axes":
            return (1, 1, *our_shape)
        if self.layout == "fused_qkv":
            hidden, heads, head_dim = our_shape
            return (3 * heads * head_dim, hidden)
        shape = (math.prod(our_shape[: self.in_axes]), math.prod(our_shape[self.in_axes :]))
        return shape if self.layout == "in_out" else shape[::-1]

    def to_ours(self, array: np.ndarray, our_shape: tuple[int, ...]) -> np.ndarray:
        if self.layout == "reversed":
            array = np.transpose(array)
        elif self.layout == "rolled":
            array = np.moveaxis(array, 0, -1)
        elif self.layout == "fused_qkv":
            hidden, heads, head_dim = our_shape
            # [N, 3, D, H][:, part] = this projection's [N, D, H] -> [H, N, D]
            array = array.reshape(heads, 3, head_dim, hidden)[:, self.part].transpose(2, 0, 1)
        elif self.layout == "out_in":
            array = array.T
        return np.ascontiguousarray(array.reshape(our_shape), dtype=np.float32)

    def to_theirs(self, array: np.ndarray, into: np.ndarray | None = None) -> np.ndarray:
        """Their array of ours. A "fused_qkv" part is written into `into` (the fused array of
        the parts converted so far; None: zeros), which is returned."""
        array = np.asarray(array, np.float32)
        shape = self.their_shape(array.shape)
        if self.layout == "reversed":
            return np.ascontiguousarray(np.transpose(array))
        if self.layout == "rolled":
            return np.ascontiguousarray(np.moveaxis(array, -1, 0))
        if self.layout == "fused_qkv":
            hidden, heads, head_dim = array.shape
            fused = np.zeros(shape, np.float32) if into is None else np.array(into, np.float32)
            fused.reshape(heads, 3, head_dim, hidden)[:, self.part] = array.transpose(1, 2, 0)
            return fused
        if self.layout == "out_in":  # [in, out] first, then transposed
            return np.ascontiguousarray(array.reshape(shape[::-1]).T)
        return np.ascontiguousarray(array.reshape(shape))


def expand(
    table: Iterable[Module], model_type: str, framework: str, num_layers: int, hf_base: str = ""
) -> list[Param]:
    """A name table as one `Param` per array, for "hf" or "tf", layers 0..num_layers-1."""
    params = []
    for module in table:
        indices = range(num_layers) if "{i}" in module.ours else [None]
        for i in indices:
            ours = module.ours.format(i=i)
            name = module.hf if framework == "hf" else module.tf
            if name is None:
                raise ConversionError(f"{model_type} has no {framework.upper()} checkpoints")
            name = name.format(i=i, base=hf_base)
            params.extend(_module_params(module.group, module.kind, tuple(ours.split("/")), name, framework))
    return params


def _module_params(group: str, kind: str, ours: tuple[str, ...], name: str, framework: str) -> list[Param]:
    hf = framework == "hf"
    join = (lambda leaf: f"{name}.{leaf}") if hf else (lambda leaf: f"{name}/{leaf}")
    if kind == EMBED:
        return [Param(group, (*ours, "embedding"), join("weight") if hf else name, "table")]
    if kind == BIAS:
        return [Param(group, ours, name, "vector")]
    if kind in (ARRAY, ROLLED, UNIT_AXES):
        return [Param(group, ours, name, {ARRAY: "table", ROLLED: "rolled", UNIT_AXES: "unit_axes"}[kind])]
    if kind == NORM:
        return [
            Param(group, (*ours, "scale"), join("weight" if hf else "gamma"), "vector"),
            Param(group, (*ours, "bias"), join("bias" if hf else "beta"), "vector"),
        ]
    if kind == KERNEL:
        return [Param(group, (*ours, "kernel"), join("weight"), "out_in")]
    if kind == CONV1D:
        return [
            Param(group, (*ours, "kernel"), join("weight"), "reversed"),
            Param(group, (*ours, "bias"), join("bias"), "vector"),
        ]
    if kind == FUSED_QKV:  # ours: the attention module; name: HF's attention.self
        kernels = [
            Param(group, (*ours, proj, "kernel"), join("in_proj.weight"), "fused_qkv", part=part)
            for part, proj in enumerate(("query", "key", "value"))
        ]
        return [
            *kernels,
            Param(group, (*ours, "query", "bias"), join("q_bias"), "vector"),
            Param(group, (*ours, "value", "bias"), join("v_bias"), "vector"),
        ]
    in_axes = 2 if kind == HEADS_OUT else 1
    if kind == CLASSIFIER and not hf:
        return [
            Param(group, (*ours, "kernel"), join("output_weights"), "out_in"),
            Param(group, (*ours, "bias"), join("output_bias"), "vector"),
        ]
    return [
        Param(
            group,
            (*ours, "kernel"),
            join("weight" if hf else "kernel"),
            "out_in" if hf else "in_out",
            in_axes,
        ),
        Param(group, (*ours, "bias"), join("bias"), "vector"),
    ]
