"""One-time, per-weight preparation of the kernel-side layout (host side, NumPy).

The user-facing ``NMMatrix`` stays canonical; a kernel wants, for every block column
(``NS`` columns) and main-loop stage (``KS`` dense rows):

- ``values``: ``B'`` padded to whole stages and whole block columns (zeros), ``Wp×Np``;
- ``pos``: for each of the block's column groups and each of the stage's ``WS``
  compressed rows, the row of the shared-memory A tile to multiply with;
- with packing, ``rows``: the dense ``k`` of every A-tile row (``-1``: zero-fill), so
  that only rows some group needs are loaded.

Non-packing tiles hold all ``KS`` rows, so ``pos`` is the row's offset in the stage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...format import NMMatrix
from ..base import PreparedWeight, check_weight
from .config import KernelConfig


@dataclass(frozen=True)
class LayoutKey:
    """What the prepared layout depends on (several configurations share one)."""

    ns: int
    ks: int
    packing: bool
    table_bytes: int = 4  # int32 entries; uint16 where a kernel asks (KernelConfig.table_bytes)

    @classmethod
    def of(cls, config: KernelConfig) -> LayoutKey:
        return cls(config.ns, config.ks, config.packing, config.table_bytes)


def _ceil_to(a: int, b: int) -> int:
    return -(-a // b) * b


def layout_key(config: KernelConfig) -> LayoutKey:
    """What the layout ``prepare`` makes for ``config`` depends on."""
    return LayoutKey.of(config)


def prepare(b: NMMatrix, config: KernelConfig) -> PreparedWeight:
    """Build the kernel-side layout of ``b`` for ``config`` (checks that they match):
    arrays ``values`` (Wp×Np float32), ``pos`` (NB×T×G×WS int32, or uint16 where the key
    says 2-byte entries) and ``rows`` (NB×T×P int32 with packing, else one unused int)."""
    check_weight(b, config)
    start = time.perf_counter()
    key = LayoutKey.of(config)
    n, m, vec = b.n, b.m, b.vec
    k_dense, _ = b.shape
    ks, ns, ws = config.ks, config.ns, config.ws
    stages_total = -(-k_dense // ks)
    windows_p = stages_total * ks // m
    cols_p = _ceil_to(b.padded_cols, ns)
    groups_p = max(cols_p // vec, 1)

    values = np.zeros((windows_p * n, cols_p), np.float32)
    values[: b._values.shape[0], : b.padded_cols] = b._values
    # Indices of padded windows/groups: any ascending n rows (their values are zero).
    idx = np.broadcast_to(np.arange(n, dtype=np.int64)[None, :, None],
                          (windows_p, n, groups_p)).reshape(windows_p * n, groups_p).copy()
    idx[: b._indices.shape[0], : b._indices.shape[1]] = b._indices

    # Dense row within its stage of every compressed row: (window % (KS/m))·m + idx.
    window_in_stage = (np.arange(windows_p * n) // n) % (ks // m)
    local = window_in_stage[:, None] * m + idx  # Wp×Gp
    # Group of each block column: NB×G with G = block_groups.
    nb = cols_p // ns
    g_blk = config.block_groups
    if ns >= vec:
        groups = np.arange(nb)[:, None] * g_blk + np.arange(g_blk)[None, :]
    else:  # one group spans several block columns
        groups = (np.arange(nb) * ns // vec)[:, None]
    # local[t·WS + w, group] → NB×T×G×WS
    per_stage = local.reshape(stages_total, ws, groups_p)
    pos = np.ascontiguousarray(per_stage[:, :, groups].transpose(2, 0, 3, 1)).astype(np.int64)

    rows = np.zeros(1, np.int32)
    if config.packing:
        pos, rows = _pack(pos, ks, k_dense, config.a_rows)
    seconds = time.perf_counter() - start
    table_type = np.uint16 if config.table_bytes == 2 else np.int32
    arrays = {"values": values, "pos": pos.astype(table_type), "rows": rows}
    return PreparedWeight(key, arrays, seconds)


def _pack(pos: np.ndarray, ks: int, k_dense: int, p_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep only the A rows that some group of the block needs in each stage.

    ``pos`` (NB×T×G×WS, dense offsets in the stage) becomes the row of the packed tile;
    ``rows`` (NB×T×P) lists each packed row's dense ``k`` in ascending order, ``-1``
    past the needed ones and for rows in the K padding (zero-filled by the kernel).
    """
    nb, t, g, ws = pos.shape
    flat = pos.reshape(nb * t, g * ws)
    needed = np.zeros((nb * t, ks), bool)
    needed[np.arange(nb * t)[:, None], flat] = True
    rank = np.cumsum(needed, axis=1) - 1
    packed_pos = np.take_along_axis(rank, flat, axis=1).reshape(nb, t, g, ws)
    order = np.argsort(~needed, axis=1, kind="stable")[:, :p_max]  # needed rows first
    count = needed.sum(axis=1)
    stage = np.tile(np.arange(t), nb)
    dense_k = stage[:, None] * ks + order
    live = (np.arange(p_max)[None, :] < count[:, None]) & (dense_k < k_dense)
    rows = np.where(live, dense_k, -1).reshape(nb, t, p_max)
    return packed_pos, rows.astype(np.int32)
