"""Weights stored in compressed-tensors' ``sparse-24-bitmask`` format (what llm-compressor
writes for 2:4 checkpoints) read as, and written from, element-wise 2:4 ``NMMatrix``.

The format keeps a linear layer's weight ``[out, in] = [N, K]`` as three tensors:
``compressed`` (``N × K/2``: in each row, the kept values of each group of four along
``in``, in ascending position), ``bitmask`` (``N × ⌈K/8⌉`` uint8: the kept positions, a
bit an element, row by row, the first element of a row in the lowest bit of its first
byte) and ``shape`` (``[N, K]``). Every group of four keeps exactly two positions (the
two of largest magnitude, zeros among them where the group has fewer non-zero ones).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .format import NMMatrix, to_numpy

GROUP = 4


def from_sparse_24_bitmask(compressed: Any, bitmask: Any, shape: Any) -> NMMatrix:
    """The 2:4 (``vec = 1``) weight of a ``sparse-24-bitmask`` tensor triple, multiplying as
    ``x @ W.T`` (the layer's ``[out, in]`` weight, as ``prune(..., layout="nk")`` does); its
    values keep ``compressed``'s dtype. Refused, naming the row and group: a bitmask that
    does not keep exactly two of a group of four, and sizes that do not line up."""
    rows, cols = (int(s) for s in np.asarray(to_numpy(shape)).reshape(-1))
    values = to_numpy(compressed)
    mask_bytes = np.asarray(to_numpy(bitmask), dtype=np.uint8)
    if cols % GROUP:
        raise ValueError(f"sparse-24-bitmask weight of {cols} input features: 2:4 groups "
                         f"need a multiple of {GROUP}")
    if values.shape != (rows, cols // 2):
        raise ValueError(f"compressed has shape {values.shape}; a [{rows}, {cols}] weight "
                         f"keeps ({rows}, {cols // 2})")
    if mask_bytes.shape != (rows, -(-cols // 8)):
        raise ValueError(f"bitmask has shape {mask_bytes.shape}; a [{rows}, {cols}] weight "
                         f"needs ({rows}, {-(-cols // 8)}) bytes")
    mask = np.unpackbits(mask_bytes, axis=1, count=cols, bitorder="little").astype(bool)
    groups = mask.reshape(rows, cols // GROUP, GROUP)
    kept = groups.sum(axis=2)
    if (kept != 2).any():
        row, group = np.argwhere(kept != 2)[0]
        raise ValueError(f"bitmask row {row} keeps {kept[row, group]} of input features "
                         f"{GROUP * group}-{GROUP * group + 3}: sparse-24-bitmask keeps 2 "
                         "of every 4")
    positions = np.argsort(~groups, axis=2, kind="stable")[..., :2]  # ascending
    indices = positions.reshape(rows, cols // 2).T.astype(np.uint8)  # W × N
    return NMMatrix.from_compressed(np.ascontiguousarray(values.T), indices, "2:4", 1,
                                    (cols, rows))


def to_sparse_24_bitmask(b: NMMatrix) -> dict[str, np.ndarray]:
    """An element-wise 2:4 weight as the ``sparse-24-bitmask`` triple of its ``[out, in]``
    layer weight: ``{"shape", "compressed", "bitmask"}``."""
    if (b.n, b.m, b.vec) != (2, 4, 1):
        raise ValueError(f"sparse-24-bitmask holds element-wise 2:4 weights; this one is "
                         f"{b.pattern} L={b.vec}")
    depth, cols = b.shape
    if depth % GROUP:
        raise ValueError(f"sparse-24-bitmask needs K a multiple of {GROUP}; K = {depth}")
    rows = b.kept_rows()[:, :cols].T  # N × W dense positions along K
    mask = np.zeros((cols, depth), bool)
    np.put_along_axis(mask, rows, True, axis=1)
    return {"shape": np.array([[cols], [depth]]),
            "compressed": np.ascontiguousarray(b.values.T),
            "bitmask": np.packbits(mask, axis=1, bitorder="little")}
