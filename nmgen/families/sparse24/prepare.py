"""The weight as the sparse operand of the 2:4 MMAs (``wgmma.mma_async.sp`` and ``mma.sp``
m16n8k32; host side, NumPy), one layout for every configuration of both sparse-tensor-core
families (``sptc``, ``mmasp``).

Every output column ``j`` (a row of ``Bᵀ``, the MMA's A) keeps, in every aligned group of
four rows along K, at most two non-zero elements (-0.0 counts as zero); the weight is
refused, naming the group, where one holds more. The two slots of a group hold its
non-zero elements, or zeros at unused positions, in ascending position.

- ``values``: ``Np × Kp/2`` in the weight's dtype, K contiguous: column ``j``'s kept
  values in K order (``Kp`` = K padded to whole stages of ``STAGE_K``; ``Np`` = N padded
  to whole blocks of ``N_PAD``, the widest ``bm`` of either family, zero rows).
- ``meta``: the 2-bit positions as the MMA threads read them, a stage's metadata of a
  block contiguous (one bulk copy). A group's positions ``(i0, i1)`` make a nibble
  ``i0 | i1 << 2``; a row's 16 dense K of one ``wgmma.sp`` (four groups, the first in the
  low bits) make a half-word. The 32-bit operand of the thread ``(warp w, lane 4g + t)`` of
  an m64 tile (for ``mma.sp``: the warp of its m16 tile ``w``), ``t`` in {0, 1}, is row
  ``16w + g``'s half-word of K ``16t .. 16t + 15`` of the MMA's 32, below row
  ``16w + g + 8``'s. Stored ``[stage][m64 tile][w][g][t][mma]``:
  ``uint32`` ``(Kp/STAGE_K) × (Np/64) × 64 × 4``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...format import NMMatrix
from ..base import Config, PreparedWeight, check_weight

STAGE_K = 128  # dense K a stage of either family: 64 kept values (128 bytes) a weight row
MMA_K = 32  # dense K of one wgmma.sp or mma.sp
META_BYTES_PER_ROW = STAGE_K // 8  # 4 bits a group of four: 16 bytes a row a stage
N_PAD = 256  # N is padded to whole blocks of the widest bm of either family
COLUMN_CHUNK = 2048  # output columns made dense at a time (host memory)
GROUP = 4  # the hardware's 2:4 groups along K
MMAS_PER_STAGE = STAGE_K // MMA_K


def _slots(mask: int) -> list[int]:
    """The two positions a group of non-zero ``mask`` (bit p: position p) keeps: its
    non-zero ones first, then unused ones, each in ascending order; the two sorted."""
    return sorted(sorted(range(GROUP), key=lambda p: not mask >> p & 1)[:2])


# By a group's non-zero mask: its two slots' positions, and how many are non-zero.
SLOTS = np.array([_slots(mask) for mask in range(2**GROUP)], np.uint8)
NON_ZEROS = np.array([bin(mask).count("1") for mask in range(2**GROUP)], np.uint8)


@dataclass(frozen=True)
class LayoutKey:
    """One layout for the whole family."""

    family: str = "sptc"


def layout_key(config: Config) -> LayoutKey:
    return LayoutKey()


def ceil_to(a: int, b: int) -> int:
    return -(-a // b) * b


def padded_sizes(depth: int, cols: int) -> tuple[int, int]:
    """(Kp, Np): K to whole stages, N to whole blocks of the widest tile."""
    return ceil_to(depth, STAGE_K), ceil_to(cols, N_PAD)


def prepare(b: NMMatrix, config: Config) -> PreparedWeight:
    check_weight(b, config)
    start = time.perf_counter()
    depth, cols = b.shape
    kp, np_ = padded_sizes(depth, cols)
    values = np.zeros((np_, kp // 2), b._values.dtype)
    nibbles = np.full((np_, kp // GROUP), 0b0100, np.uint8)  # unused rows: positions 0, 1
    for first in range(0, cols, COLUMN_CHUNK):
        last = min(cols, first + COLUMN_CHUNK)
        kept, positions = two_of_four(b, first, last, kp)
        values[first:last] = kept.reshape(last - first, kp // 2)
        nibbles[first:last] = positions[..., 0] | (positions[..., 1] << 2)
    return PreparedWeight(LayoutKey(), {"values": values, "meta": metadata(nibbles)},
                          time.perf_counter() - start)


def dense_columns(b: NMMatrix, first: int, last: int, kp: int) -> np.ndarray:
    """Columns ``first:last`` of the logical weight, transposed: ``last - first`` rows of
    ``kp`` (zeros past K)."""
    depth = b.shape[0]
    kept = b.kept_rows()  # W×G
    cols = np.arange(first, last)
    rows = kept[:, cols // b.vec].T  # c × W
    values = b._values[:, first:last].T
    inside = rows < depth
    dense = np.zeros((last - first, kp), b._values.dtype)
    dense[np.broadcast_to((cols - first)[:, None], rows.shape)[inside], rows[inside]] = \
        values[inside]
    return dense


def two_of_four(b: NMMatrix, first: int, last: int, kp: int) -> tuple[np.ndarray, np.ndarray]:
    """Columns ``first:last`` as (kept values ``c × Kp/4 × 2``, their positions ``c × Kp/4 ×
    2`` uint8, ascending); raises ``ValueError`` naming the first group of four that holds
    more than two non-zero elements."""
    dense = dense_columns(b, first, last, kp).reshape(last - first, kp // GROUP, GROUP)
    nonzero = dense.astype(np.float32) != 0  # -0.0 is zero
    mask = np.zeros(nonzero.shape[:2], np.uint8)
    for position in range(GROUP):
        mask |= nonzero[..., position].astype(np.uint8) << position
    counts = NON_ZEROS[mask]
    if counts.max(initial=0) > 2:
        column, group = np.argwhere(counts > 2)[0]
        k0 = int(group) * GROUP
        raise ValueError(
            f"the sparse tensor cores take at most 2 non-zero elements in every aligned "
            f"group of four along K (2:4); column {first + int(column)} holds "
            f"{int(counts[column, group])} in rows {k0}-{k0 + 3} (pattern {b.pattern}, "
            f"L={b.vec}: window {k0 // b.m} of {b.m} rows)")
    order = SLOTS[mask]  # two distinct positions a group, sorted (``_slots``)
    kept = np.take_along_axis(dense, order.astype(np.intp), axis=2)
    return kept, order


def metadata(nibbles: np.ndarray) -> np.ndarray:
    """The MMA threads' metadata operands (see the module's note) of ``nibbles`` (``Np ×
    Kp/4``: a group's positions)."""
    np_, groups = nibbles.shape
    steps = groups // 8  # wgmma.sp steps of 32 K: 8 groups, two half-words
    quads = nibbles.reshape(np_, steps, 2, 4).astype(np.uint32)  # [row][step][t][group]
    halves = (quads << (4 * np.arange(4, dtype=np.uint32))).sum(axis=3, dtype=np.uint32)
    tiles = np_ // 64
    # rows 64T + 16w + g + 8h  →  [T][w][h][g]
    by_row = halves.reshape(tiles, 4, 2, 8, steps, 2)  # [T][w][h][g][step][t]
    words = by_row[:, :, 0] | (by_row[:, :, 1] << 16)  # [T][w][g][step][t]
    stages = steps // MMAS_PER_STAGE
    words = words.reshape(tiles, 4, 8, stages, MMAS_PER_STAGE, 2)  # [T][w][g][S][mma][t]
    return np.ascontiguousarray(words.transpose(3, 0, 1, 2, 5, 4)).reshape(
        stages, tiles * 64 * MMAS_PER_STAGE).astype(np.uint32)


def worst_group_count(n: int, m: int) -> int:
    """The most kept elements an aligned group of four rows along K can hold, over every
    weight of pattern ``n:m`` (windows of ``m`` rows keep ``n`` each)."""
    period = 4 * m // _gcd(4, m)
    worst = 0
    for start in range(0, period, 4):
        count = 0
        for window in range(start // m, (start + 3) // m + 1):
            overlap = min(start + 4, (window + 1) * m) - max(start, window * m)
            count += min(n, overlap)
        worst = max(worst, count)
    return worst


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
