"""Pretraining objectives: one module per family member (base.py has the interface).

`make_objective` is the one place a run, a benchmark or pretrain.summary gets its
objective from: a recipe chooses it with `make_objective.objective = @MaskedLM` (the
default), `@ElectraRTD` (configs/recipes/electra.gin), `@SpanBoundary`
(configs/recipes/spanbert.gin), `@DebertaMLM` (configs/recipes/deberta.gin), `@DebertaRTD`
(configs/recipes/deberta_v3.gin), `@PermutationLM` (configs/recipes/xlnet.gin) or
`@XLNetMLM` (MLM on XLNet's encoder: configs/ablations/xlnet). Importing the package
registers every objective with gin.
"""

from __future__ import annotations

from collections.abc import Callable

import gin

from data.pipeline_config import PipelineConfig
from models.encoder import EncoderConfig
from pretrain.objectives.base import Objective
from pretrain.objectives.deberta import DebertaMLM, DebertaRTD
from pretrain.objectives.electra import ElectraRTD
from pretrain.objectives.masked_lm import MaskedLM
from pretrain.objectives.permutation_lm import PermutationLM
from pretrain.objectives.span_boundary import SpanBoundary
from pretrain.objectives.xlnet_mlm import XLNetMLM

__all__ = [
    "DebertaMLM",
    "DebertaRTD",
    "ElectraRTD",
    "MaskedLM",
    "Objective",
    "PermutationLM",
    "SpanBoundary",
    "XLNetMLM",
    "make_objective",
]


@gin.configurable
def make_objective(
    model_config: EncoderConfig,
    pipeline_config: PipelineConfig,
    objective: Callable[[EncoderConfig, PipelineConfig], Objective] = MaskedLM,
) -> Objective:
    """The recipe's objective for this model and data recipe (gin: make_objective.objective)."""
    return objective(model_config, pipeline_config)
