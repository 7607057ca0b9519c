"""Model stage: Flax encoder, heads and pretraining model. Takes arrays, not pipelines."""
