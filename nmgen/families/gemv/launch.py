"""The decode family's launch plan: one kernel, a grid of column blocks x row blocks x
slices of K. The slices are the configuration's ``split_k``, or more where a slice of A
would not fit in shared memory; with several, they write FP32 partial sums to a workspace
and the last block of each tile adds them, counted by a persistent counter a tile."""

from __future__ import annotations

import numpy as np

from ..base import PreparedWeight
from ..plan import BIAS, A, C, Call, Device, Launch, LaunchPlan, Pointer, Scalar, Workspace
from .config import GemvConfig

SPLIT_SUMS, TILE_COUNTERS = "split_sums", "tile_counters"


def slicing(config: GemvConfig, depth: int) -> tuple[int, int]:
    """(windows a slice, slices) of K for ``config``: ``split_k`` slices, or as many more
    as keep a block's shared memory within the arch's limit."""
    windows = -(-depth // config.m)
    per_slice = -(-windows // config.split_k)
    while per_slice > 1 and config.smem_bytes(per_slice) > config.arch.max_smem_per_block:
        per_slice = -(-per_slice // 2)
    return per_slice, -(-windows // per_slice)


def plan(config: GemvConfig, weight: PreparedWeight, shape: tuple[int, int], call: Call,
         device: Device) -> LaunchPlan:
    c = config
    depth, cols = shape
    values, indices = weight.arrays["values"], weight.arrays["indices"]
    windows = -(-depth // c.m)
    per_slice, slices = slicing(c, depth)
    grid = (-(-cols // c.columns), -(-call.rows // c.rows), slices)
    split = slices > 1  # else the sums' buffers are never read: C stands in for them
    i32 = lambda v: Scalar("i32", v)  # noqa: E731
    i64 = lambda v: Scalar("i64", v)  # noqa: E731
    main = Launch(c.name, grid, c.threads, c.smem_bytes(per_slice), (
        Pointer(A), Pointer("values"), Pointer("indices"), Pointer(C),
        Pointer(SPLIT_SUMS if split else C), Pointer(TILE_COUNTERS if split else C),
        i32(call.rows), i32(cols), i32(depth), i64(call.lda), i64(values.shape[1]),
        i64(indices.shape[1]), i32(windows), i32(per_slice), i32(slices),
        *([Pointer(BIAS)] if c.epilogue else [])))
    if not split:
        return LaunchPlan((main,))
    return LaunchPlan((main,), (
        Workspace(SPLIT_SUMS, slices * call.rows * cols),
        Workspace(TILE_COUNTERS, grid[0] * grid[1], np.dtype(np.uint32), zeroed=True,
                  persistent=True)))
