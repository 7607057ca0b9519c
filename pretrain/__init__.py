"""Pretraining stage: optimizer, losses, sharding, checkpoints and the train loop."""
