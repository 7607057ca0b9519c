"""Logical axis names of every parameter and activation in models/.

Models name each array dimension by its role; `core/sharding.py` maps these
names onto mesh axes (`data`, `fsdp`, `tensor`) with one rules table, so a new
sharding layout is a change of rules, never of model code. A dimension that is
never sharded (e.g. the 2 NSP classes) is named `None`.
"""

BATCH = "batch"  # examples in a batch
LENGTH = "length"  # token positions in a sequence
EMBED = "embed"  # the model width H (residual stream)
MLP = "mlp"  # FFN width F, and the output side of square H->H projections
HEADS = "heads"  # attention heads
KV = "kv"  # per-head width H / heads
VOCAB = "vocab"  # vocabulary entries (embedding rows, MLM logits)
FACTORIZED = "factorized"  # ALBERT's embedding width E when E != H (tables, MLM decoder)
PREDICTIONS = "predictions"  # the P masked positions of the MLM head

ALL = (BATCH, LENGTH, EMBED, MLP, HEADS, KV, VOCAB, FACTORIZED, PREDICTIONS)
