"""How many threads the tokenizer libraries may start in this process.

By default the `tokenizers` library encodes a batch on a Rayon pool of one thread per core,
and SentencePiece's batch encode on one thread per core too. `data.preprocess` runs one
worker process per core already, so each worker caps its libraries at its share of the
cores (`limit`): a worker per core with a pool per core each would run cores x cores threads.
"""

from __future__ import annotations

import os

_limit: int | None = None


def limit(n: int) -> None:
    """Caps both libraries at `n` threads in this process. The Rayon pool reads
    RAYON_NUM_THREADS when it first starts: call this before the first batch is encoded."""
    global _limit
    if n < 1:
        raise ValueError(f"a thread limit must be >= 1, got {n}")
    _limit = n
    os.environ["RAYON_NUM_THREADS"] = str(n)


def sentencepiece_threads() -> int:
    """SentencePiece's `num_threads` for a batch: the limit, or -1 (one per core)."""
    return -1 if _limit is None else _limit
