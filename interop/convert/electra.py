"""ELECTRA: HF model_type "electra" (models/electra.py). The discriminator
(ElectraForPreTraining) and the generator (ElectraForMaskedLM) are published as two folders;
here they are one workdir: `encoder` + `discriminator_head` are the discriminator,
`generator` + `generator_head` the generator, which reads the discriminator's embedding
block. A generator folder holds its own copy of that block: the import keeps the
discriminator's (and warns if the copies differ), the export writes the copy.
model_config.json is the discriminator's; the generator's shape is read from its parameters
(models/electra.py `generator_masked_lm`). With a generator only hidden_act='gelu' converts:
transformers' generator head applies the exact GELU whatever the config says. No TF1 names
(google-research/electra's checkpoints are not read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from interop.convert.bert import EMBEDDINGS, LAYER
from interop.convert.format import ModelFormat, log, tree_shapes
from interop.convert.hf_files import read_hf_config, read_hf_tensors
from interop.convert.layout import BIAS, DENSE, NORM, ConversionError, Module, heads, rows
from models import electra
from models.encoder import EncoderConfig

# ELECTRA's encoder (HF ElectraModel): BERT's with an E -> H projection, `embeddings_project`,
# which exists only when E != H (the rows of arrays a config lacks are skipped). No pooler.
_ENCODER = (
    *rows("encoder", "encoder/embeddings/", "{base}embeddings.", None, EMBEDDINGS),
    Module("encoder", "encoder/embedding_projection", DENSE, "{base}embeddings_project", None),
    *rows("encoder", "encoder/layer_{i}/", "{base}encoder.layer.{i}.", None, LAYER),
)
# What the generator takes from the discriminator (models/electra.py generator_config): the
# embedding block and the settings its own config copies. A generator folder must agree.
_GENERATOR_SHARED_SETTINGS = (
    "vocab_size",
    "embedding_width",
    "max_position_embeddings",
    "type_vocab_size",
    "hidden_act",
    "layer_norm_eps",
)


def _check_generator_activation(config: EncoderConfig) -> None:
    """transformers' ElectraGeneratorPredictions applies the exact GELU whatever hidden_act
    says; our generator head (as google-research/electra's) applies hidden_act."""
    if config.hidden_act != "gelu":
        raise ConversionError(
            f"hidden_act={config.hidden_act!r} with a generator: transformers' ELECTRA generator head "
            "always applies the exact GELU, so only hidden_act='gelu' converts"
        )


def _warn_if_embeddings_differ(copy: Mapping[str, Any], shared: Mapping[str, Any], where: str) -> None:
    """Logs the largest difference between a generator folder's embeddings and the shared block."""
    theirs, ours = traverse_util.flatten_dict(copy), traverse_util.flatten_dict(shared)
    diffs = {"/".join(("embeddings", *k)): float(np.abs(theirs[k] - ours[k]).max()) for k in ours}
    name, diff = max(diffs.items(), key=lambda item: item[1])
    if diff > 0:
        log.warning(
            "%s: the generator's embeddings differ from the discriminator's (max abs diff %.3g in %s): "
            "ELECTRA shares one embedding block, the discriminator's is kept",
            where,
            diff,
            name,
        )


@dataclasses.dataclass(frozen=True)
class ElectraFormat(ModelFormat):
    def describes(self, config: EncoderConfig) -> bool:
        return (
            config.classifier_head == "electra" and config.sharing == "none" and config.position_offset == 0
        )

    def hf_options(self, hf: Mapping[str, Any], where: str) -> dict[str, Any]:
        # No pooler; fine-tuning reads the first token through ELECTRA's head. E = H is
        # written as no embedding_size (no projection), as configs/models/electra_base.gin.
        embedding_size = hf.get("embedding_size", 128)  # ElectraConfig's default
        return {
            "embedding_size": None if embedding_size == hf.get("hidden_size") else embedding_size,
            "pooler": False,
            "classifier_head": "electra",
        }

    def our_shapes(self, config: EncoderConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
        """BERT's, plus the discriminator head (dense H -> H, prediction H -> 1)."""
        hidden = jax.ShapeDtypeStruct((1, 1, config.hidden_size), jnp.float32)
        head = jax.eval_shape(electra.DiscriminatorHead(config).init, jax.random.key(0), hidden)["params"]
        return {**super().our_shapes(config), **tree_shapes({"discriminator_head": head})}

    def check_hf_tensors(self, tensors: Mapping[str, np.ndarray], where: str) -> None:
        if any(k.startswith("generator_predictions.") for k in tensors):
            # An ElectraForMaskedLM: its encoder is the generator, not the model a workdir's
            # `encoder` is (the discriminator).
            raise ConversionError(
                f"{where} is an ELECTRA generator (ElectraForMaskedLM): import the discriminator "
                f"(ElectraForPreTraining) folder as --from=hf:DIR, with this one as --generator_from={where}"
            )

    def read_generator(
        self, directory: str, config: EncoderConfig, params: Mapping[str, Any], where: str
    ) -> dict[str, Any]:
        """The `generator` and `generator_head` subtrees of an ElectraPretrainingModel tree from
        an HF ElectraForMaskedLM folder. The folder's own copy of the embeddings is only
        compared with the discriminator's block (`params`' encoder/embeddings): ELECTRA trains
        one block, so the copies should be equal; a warning when they are not (the
        discriminator's is kept)."""
        where = f"hf:{directory}"  # from here on, errors name the generator's folder
        hf = read_hf_config(directory, where)
        if hf.get("model_type") != self.model_type:
            raise ConversionError(
                f"{where}: model_type {hf.get('model_type')!r}: --generator_from takes an ELECTRA "
                "generator (ElectraForMaskedLM) folder"
            )
        generator = self.config_from_hf(hf, where)
        for name in _GENERATOR_SHARED_SETTINGS:
            theirs, ours = getattr(generator, name), getattr(config, name)
            if theirs != ours:
                raise ConversionError(
                    f"{where}: the generator's {name} is {theirs!r}, the discriminator's {ours!r}: "
                    "ELECTRA's generator shares the discriminator's embeddings and settings"
                )
        try:
            _check_generator_activation(generator)
        except ConversionError as e:
            raise ConversionError(f"{where}: {e}") from None
        tree, groups = ELECTRA_GENERATOR.params_from_hf(generator, read_hf_tensors(directory, where), where)
        if "mlm_head" not in groups:
            raise ConversionError(
                f"{where}: no generator head (generator_predictions.*): --generator_from takes an "
                "ElectraForMaskedLM folder"
            )
        _warn_if_embeddings_differ(tree["encoder"].pop("embeddings"), params["encoder"]["embeddings"], where)
        return {"generator": tree["encoder"], "generator_head": tree["mlm_head"]}

    def generator_model(
        self, config: EncoderConfig, params: Mapping[str, Any]
    ) -> tuple[ModelFormat, EncoderConfig, dict[str, Any]]:
        """An ElectraForMaskedLM with its copy of the shared embeddings."""
        if "generator" not in params:
            raise ConversionError(f"has no {self.generator_family} generator to write to --generator_to")
        _check_generator_activation(config)
        generator_config, tree = electra.generator_masked_lm(config, params)
        return ELECTRA_GENERATOR, generator_config, tree

    def hf_config_keys(self, config: EncoderConfig, groups: set[str]) -> dict[str, Any]:
        # ElectraConfig has learned absolute positions only.
        return {"embedding_size": config.embedding_width}


# The discriminator: our `encoder` and `discriminator_head`; an ELECTRA folder is read as it.
ELECTRA = ElectraFormat(
    model_type="electra",
    hf_base="electra.",
    table=(
        *_ENCODER,
        *heads(
            (
                "discriminator_head",
                "discriminator_head/dense",
                DENSE,
                "discriminator_predictions.dense",
                None,
            ),
            (
                "discriminator_head",
                "discriminator_head/prediction",
                DENSE,
                "discriminator_predictions.dense_prediction",
                None,
            ),
        ),
    ),
    hf_tied={},
    hf_classes={"discriminator_head": "ElectraForPreTraining", None: "ElectraModel"},
    layout="electra classifier_head='electra' with sharing='none'",
    generator_family="ELECTRA",
)
# The generator, as the standalone masked-LM tree of models.electra.generator_masked_lm
# (encoder = the shared embeddings + the generator's projection and layers, mlm_head =
# generator_head): the layout of an ElectraForMaskedLM folder.
ELECTRA_GENERATOR = ElectraFormat(
    model_type="electra",
    hf_base="electra.",
    table=(
        *_ENCODER,
        *heads(
            ("mlm_head", "mlm_head/transform", DENSE, "generator_predictions.dense", None),
            ("mlm_head", "mlm_head/transform_layer_norm", NORM, "generator_predictions.LayerNorm", None),
            ("mlm_head", "mlm_head/output_bias", BIAS, "generator_lm_head.bias", None),
        ),
    ),
    hf_tied={"generator_lm_head.weight": "{base}embeddings.word_embeddings.weight"},
    hf_classes={"mlm_head": "ElectraForMaskedLM", None: "ElectraModel"},
)
