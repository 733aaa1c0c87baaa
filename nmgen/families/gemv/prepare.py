"""The decode kernel's layout of a weight: the compressed values and indices padded to a
multiple of max(L, COLS) columns (zeros, and indices 0..n-1), so that every thread's load
is whole and aligned."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...format import NMMatrix
from ..base import PreparedWeight, check_weight
from .config import GemvConfig


@dataclass(frozen=True)
class LayoutKey:
    column_pad: int


def layout_key(config: GemvConfig) -> LayoutKey:
    return LayoutKey(max(config.vec, config.cols))


def prepare(b: NMMatrix, config: GemvConfig) -> PreparedWeight:
    check_weight(b, config)
    start = time.perf_counter()
    key = layout_key(config)
    rows = b._values.shape[0]
    cols = -(-b.padded_cols // key.column_pad) * key.column_pad
    values = np.zeros((rows, cols), b._values.dtype)
    values[:, :b.padded_cols] = b._values
    indices = np.broadcast_to((np.arange(rows) % b.n)[:, None].astype(np.uint8),
                              (rows, cols // b.vec)).copy()
    indices[:, :b._indices.shape[1]] = b._indices
    return PreparedWeight(key, {"values": values, "indices": indices},
                          time.perf_counter() - start)
