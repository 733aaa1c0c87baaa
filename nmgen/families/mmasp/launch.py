"""The ``mma.sp`` family's launch plan: one kernel, a grid of column blocks x row blocks x
slices of K. The kernel reads A in 16-byte chunks where it is row-major with 16-byte
aligned rows, else element by element. With several slices, FP32 sums go to a workspace
and the last block of each tile adds them (a persistent counter a tile)."""

from __future__ import annotations

import numpy as np

from ...problem import ALayout
from ..base import PreparedWeight
from ..plan import (
    BIAS,
    A,
    Aligned16,
    C,
    Call,
    Device,
    Launch,
    LaunchPlan,
    Pointer,
    Scalar,
    Workspace,
)
from ..sparse24.prepare import STAGE_K
from .config import MmaSpConfig

SPLIT_SUMS, TILE_COUNTERS = "split_sums", "tile_counters"
VECTOR_ELEMS = 8  # 16-bit elements of 16 bytes
MAX_GRID_Y = 65535


def slicing(config: MmaSpConfig, depth: int) -> tuple[int, int, int]:
    """(stages of K, stages a slice, slices): ``split_k`` slices at most, none empty."""
    stages = -(-depth // STAGE_K)
    per_slice = -(-stages // min(config.split_k, stages))
    return stages, per_slice, -(-stages // per_slice)


def plan(config: MmaSpConfig, weight: PreparedWeight, shape: tuple[int, int], call: Call,
         device: Device) -> LaunchPlan:
    c = config
    depth, cols = shape
    values, meta = weight.arrays["values"], weight.arrays["meta"]
    stages, per_slice, slices = slicing(c, depth)
    grid = (-(-cols // c.bm), -(-call.rows // c.bn), slices)
    if grid[1] > MAX_GRID_Y:
        raise ValueError(f"{c.name}: {grid[1]} row blocks exceed the grid's {MAX_GRID_Y}")
    workspaces: tuple[Workspace, ...] = ()
    split = slices > 1
    if split:
        tile_size = c.bm * c.bn  # FP32 sums a tile a slice
        workspaces = (Workspace(SPLIT_SUMS, grid[0] * grid[1] * slices * tile_size),
                      Workspace(TILE_COUNTERS, grid[0] * grid[1], np.dtype(np.uint32),
                                zeroed=True, persistent=True))
    chunks = c.a_layout is ALayout.ROW_MAJOR and call.lda % VECTOR_ELEMS == 0
    i32 = lambda v: Scalar("i32", int(v))  # noqa: E731
    i64 = lambda v: Scalar("i64", int(v))  # noqa: E731
    args = (Pointer("values"), Pointer("meta"), Pointer(A), Pointer(C),
            Pointer(SPLIT_SUMS if split else C), Pointer(TILE_COUNTERS if split else C),
            i32(call.rows), i32(cols), i32(depth), i64(call.lda), i64(values.shape[1]),
            i32(stages), i32(per_slice), i32(meta.shape[1] // 256), Aligned16(A, chunks),
            Aligned16(C, cols % VECTOR_ELEMS == 0), *([Pointer(BIAS)] if c.epilogue else []))
    return LaunchPlan((Launch(c.name, grid, c.threads, c.smem_bytes, args),), workspaces)
