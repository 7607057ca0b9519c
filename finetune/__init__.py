"""Fine-tuning stage: GLUE readers, heads, training loop, sweeps, metrics and submissions."""
