"""DeBERTa's architecture options and its relative-position index (He et al. 2020,
arXiv 2006.03654; He et al. 2021, arXiv 2111.09543; microsoft/DeBERTa).

`DisentangledConfig` is what turns `EncoderConfig` into a DeBERTa encoder
(`EncoderConfig.disentangled`; the modules are in models/deberta.py). The relative
positions are a host-side table: the index of relative position rel = pos_query - pos_key
into the relative embedding table ([2S, H]) is looked up in a NumPy int32 constant built
once at trace time, so the log buckets are bit-for-bit those of the original's float
arithmetic (a `ceil` of a float ratio: recomputing it on a device in another precision
could move a bucket boundary).

Shapes: B batch, Q query positions, K key positions, S attention span (the relative
table has 2S rows).
"""

from __future__ import annotations

import dataclasses
import functools

import gin
import jax
import jax.numpy as jnp
import numpy as np

from core.errors import ConfigError

RELATIVE_TERMS = ("c2p", "p2c")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DisentangledConfig:
    """DeBERTa's options (the names are those of the original's / HF's config.json).

    Defaults are DeBERTa-v2/v3 (every published v2 and v3 model); v1 gin files set
    version 1, position_buckets 0, share_att_key False, norm_rel_ebd False.

    Attributes:
      version: 1 (DeBERTa: the key projection has no bias, the c2p position projection
        `pos_key` has none either; HF DebertaModel) or 2 (DeBERTa-v2/v3; HF DebertaV2Model).
      position_buckets: log-bucket the relative positions into this many buckets
        (v2/v3: 256); 0 = exact relative positions (v1).
      max_relative_positions: the farthest relative position the buckets reach (and
        v1's span); -1 = max_position_embeddings.
      share_att_key: the relative table is projected by the content query/key
        projections (v2/v3) instead of position projections of its own.
      norm_rel_ebd: LayerNorm the relative table once per forward pass (v2/v3's
        norm_rel_ebd = "layer_norm").
      position_biased_input: add absolute position embeddings to the input (False in
        every published DeBERTa: absolute positions then enter only in the enhanced
        mask decoder).
      pos_att_type: the relative terms, a subset of ("c2p", "p2c"): content-to-position
        and position-to-content. Scores are divided by sqrt(D * (1 + len)).
      conv_kernel_size: v2's convolution after the first layer (xlarge, xxlarge: 3);
        0 = none.
      conv_act: the convolution's activation (HF's default "tanh"; the published v2
        configs say "gelu").
    """

    version: int = 2
    position_buckets: int = 256
    max_relative_positions: int = -1
    share_att_key: bool = True
    norm_rel_ebd: bool = True
    position_biased_input: bool = False
    pos_att_type: tuple[str, ...] = ("p2c", "c2p")
    conv_kernel_size: int = 0
    conv_act: str = "tanh"

    def __post_init__(self):
        object.__setattr__(self, "pos_att_type", tuple(self.pos_att_type))

        def fail(name: str, requirement: str) -> None:
            raise ConfigError(f"DisentangledConfig.{name} must be {requirement}, got {getattr(self, name)!r}")

        if self.version not in (1, 2):
            fail("version", "1 (DeBERTa) or 2 (DeBERTa-v2/v3)")
        if self.position_buckets < 0:
            fail("position_buckets", ">= 0 (0 = no buckets)")
        if self.max_relative_positions == 0 or self.max_relative_positions < -1:
            fail("max_relative_positions", ">= 1, or -1 for max_position_embeddings")
        if len(set(self.pos_att_type)) != len(self.pos_att_type) or not set(self.pos_att_type) <= set(
            RELATIVE_TERMS
        ):
            fail("pos_att_type", f"distinct entries of {RELATIVE_TERMS}")
        if self.conv_kernel_size < 0 or (self.conv_kernel_size and self.conv_kernel_size % 2 == 0):
            fail("conv_kernel_size", "0 (no convolution) or odd")
        if self.conv_act not in ("gelu", "tanh"):
            fail("conv_act", "'gelu' or 'tanh'")
        if self.version == 1:
            for name in ("share_att_key", "norm_rel_ebd", "conv_kernel_size", "position_buckets"):
                if getattr(self, name):
                    fail(name, "off in version 1 (DeBERTa v1 has no such option)")

    @property
    def c2p(self) -> bool:
        return "c2p" in self.pos_att_type

    @property
    def p2c(self) -> bool:
        return "p2c" in self.pos_att_type

    @property
    def score_divisor_factor(self) -> int:
        """Scores are divided by sqrt(head_dim * this): 1 + the number of relative terms."""
        return 1 + len(self.pos_att_type)

    def max_relative(self, max_position_embeddings: int) -> int:
        return self.max_relative_positions if self.max_relative_positions > 0 else max_position_embeddings

    def span(self, max_position_embeddings: int) -> int:
        """S: the relative table has 2S rows (v2/v3: 2 x 256; v1: 2 x 512)."""
        return (
            self.position_buckets if self.position_buckets > 0 else self.max_relative(max_position_embeddings)
        )

    @functools.cache  # noqa: B019  (a frozen config: one table per config, built once per process)
    def index_table(self, max_position_embeddings: int) -> tuple[np.ndarray, int]:
        """(table, R): the relative-table row of every rel in [-R, R] is table[rel + R]
        (int32 [2R + 1]); a rel beyond R reads its end (R covers twice the longest
        sequence, so only rel of no real pair gets there)."""
        max_rel = self.max_relative(max_position_embeddings)
        span = self.span(max_position_embeddings)
        reach = 2 * max(max_rel, max_position_embeddings)
        rel = np.arange(-reach, reach + 1)
        bucketed = log_bucket(rel, self.position_buckets, max_rel) if self.position_buckets else rel
        return np.clip(bucketed + span, 0, 2 * span - 1).astype(np.int32), reach


def log_bucket(rel: np.ndarray, bucket_size: int, max_position: int) -> np.ndarray:
    """DeBERTa-v2's log buckets of relative positions (int64, same shape as `rel`).

    Exact within (-bucket_size/2, bucket_size/2), logarithmic beyond, odd in rel
    (HF modeling_deberta_v2.make_log_bucket_position; the original's da_utils.py builds its
    table with the same formula). The ratio is taken in float32, as torch does, so the
    ceil lands on the same side of every integer.
    """
    rel = np.asarray(rel, np.int64)
    mid = bucket_size // 2
    sign = np.sign(rel)
    abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    log_pos = (
        np.ceil(
            np.log(abs_pos.astype(np.float32) / np.float32(mid))
            / np.log(np.float32((max_position - 1) / mid))
            * np.float32(mid - 1)
        )
        + mid
    )
    return np.where(abs_pos <= mid, rel, log_pos * sign).astype(np.int64)


def relative_index(
    config: DisentangledConfig,
    max_position_embeddings: int,
    query_positions: jax.Array,
    key_positions: jax.Array,
) -> jax.Array:
    """Rows of the relative table for every (query, key) pair.

    Args:
      query_positions: [B, Q] int32 position ids of the queries.
      key_positions: [B, K] int32 position ids of the keys.
    Returns:
      [B, Q, K] int32 in [0, 2S). Packed examples restart their positions at 0, so a pair
      within one example gets the index it has when the example is alone in its row.
    """
    table, reach = config.index_table(max_position_embeddings)
    rel = query_positions[:, :, None] - key_positions[:, None, :]
    return jnp.asarray(table)[jnp.clip(rel, -reach, reach) + reach]
