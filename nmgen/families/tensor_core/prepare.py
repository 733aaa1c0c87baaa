"""The tensor-core kernels' layout of a weight (host side, NumPy), one for both families.

- ``values``: B' padded with zero rows to whole stages (``Wp = stages·bk`` rows) and with
  zero columns to whole column blocks (the format's padded width, a multiple of L, or of
  ``bn`` where a block spans several groups), in the weight's dtype: every B' tile a block
  copies is whole, aligned and in bounds.
- ``rows``: ``Gp × Wp`` int32, for every column group (the padding's included) and
  compressed row, the dense row ``k`` of A it multiplies; -1 where that row lies past K
  (the last window's zero padding, the padded stages and groups): the kernel fills zeros
  there instead of reading A.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...format import NMMatrix
from ..base import PreparedWeight, check_weight
from .config import TensorCoreConfig


@dataclass(frozen=True)
class LayoutKey:
    """What the layout depends on: the compressed rows a stage, the columns it pads to."""

    bk: int
    column_block: int


def layout_key(config: TensorCoreConfig) -> LayoutKey:
    return LayoutKey(config.bk, column_block(config))


def column_block(config: TensorCoreConfig) -> int:
    """The columns the values are padded to a multiple of: L, or a block of several
    groups."""
    return max(config.vec, config.bn)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def stage_count(config: TensorCoreConfig, depth: int) -> int:
    """Main-loop stages of a K of ``depth``."""
    return ceil_div(ceil_div(depth, config.m), config.windows)


def prepare(b: NMMatrix, config: TensorCoreConfig) -> PreparedWeight:
    check_weight(b, config)
    start = time.perf_counter()
    w_rows = stage_count(config, b.shape[0]) * config.bk
    cols = ceil_div(b.padded_cols, column_block(config)) * column_block(config)
    values = np.zeros((w_rows, cols), b._values.dtype)
    values[:b._values.shape[0], :b.padded_cols] = b._values
    kept = b.kept_rows()  # W×G dense rows
    kept = np.where(kept < b.shape[0], kept, -1)
    rows = np.full((cols // config.vec, w_rows), -1, np.int32)
    rows[:kept.shape[1], :kept.shape[0]] = kept.T
    return PreparedWeight(layout_key(config), {"values": values, "rows": rows},
                          time.perf_counter() - start)
