"""Data stage: corpora -> tokenized shards -> tf.data batches. Knows nothing of models."""
