"""Which pipeline config feeds each step: one phase, or BERT's two (length 128, then 512).

BERT trained 90% of its steps at length 128 (P = 20) and the last 10% at 512 (P = 80) in
one run: same parameters, optimizer state and learning-rate schedule; the data stream of
phase 2 starts at its beginning (configs/recipes/bert_two_phase.gin).
"""

from __future__ import annotations

from core.errors import ConfigError
from data.pipeline_config import PipelineConfig
from models.encoder import EncoderConfig


class Phases:
    """The pipeline config of each step. `step` arguments count completed steps: the
    config of the step that follows `step` completed ones is `config(step)`."""

    def __init__(
        self,
        first: PipelineConfig,
        phase2_start: int | None,
        second: PipelineConfig | None,
        steps: int,
        model_config: EncoderConfig,
    ):
        if (phase2_start is None) != (second is None):
            raise ConfigError("set both run.phase2_start and run.phase2_pipeline_config, or neither")
        if phase2_start is not None and not 0 < phase2_start < steps:
            raise ConfigError(f"run.phase2_start = {phase2_start} must be in (0, run.steps = {steps})")
        self.configs = [first] if second is None else [first, second]
        self.start = phase2_start
        # The objective is built from phase 1's config (e.g. whether there is a sentence
        # head): phase 2 must make the same kind of batch, only longer.
        for field in ("sentence_objective", "format"):
            if second is not None and getattr(first, field) != getattr(second, field):
                raise ConfigError(
                    f"phase 1 has PipelineConfig.{field} {getattr(first, field)!r} and phase 2 "
                    f"{getattr(second, field)!r}: bind it for both"
                )
        for config in self.configs:
            model_config.check_length(config.max_seq_length, "PipelineConfig.max_seq_length")

    def index(self, step: int) -> int:
        """Phase (0 or 1) of the step that follows `step` completed steps."""
        return int(self.start is not None and step >= self.start)

    def config(self, step: int) -> PipelineConfig:
        return self.configs[self.index(step)]

    def describe(self, step: int) -> str:
        config = self.config(step)
        return f"length {config.max_seq_length}, {config.max_predictions_per_seq} predictions per row"
