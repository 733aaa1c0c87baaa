"""The tensor-core families' launch plan: one kernel, a grid of row blocks x column blocks.
A's 16-byte copies need its rows 16-byte aligned (``a_vec``), else the kernel reads A an
element at a time; C takes pairs of values where N is even and C 16-byte aligned. A
``tma`` kernel also takes a tensor map of the values (boxes of 64 columns x ``bk`` rows,
128-byte swizzled); it reads A as the others do."""

from __future__ import annotations

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
    TensorMap2D,
)
from .config import ELEMENT_BYTES, TensorCoreConfig

VECTOR_ELEMS = 8  # 16-bit elements of one 16-byte copy
SWIZZLE_COLS = 64  # 16-bit elements of a 128-byte swizzled row: a box's width


def a_vectorized(call: Call) -> bool:
    """Whether A's rows (along its contiguous dimension) take 16-byte copies."""
    return call.a_aligned and call.lda % VECTOR_ELEMS == 0


def plan(config: TensorCoreConfig, weight: PreparedWeight, shape: tuple[int, int], call: Call,
         device: Device, a_buffer: str = A) -> LaunchPlan:
    """The kernel's launch; ``a_buffer``: the buffer it reads A from (the call's, or a
    workspace copy of it)."""
    c = config
    depth, cols = shape
    values, rows = weight.arrays["values"], weight.arrays["rows"]
    stages_total = values.shape[0] // c.bk
    grid = (-(-call.rows // c.bm), values.shape[1] // c.bn, 1)
    if grid[1] > 65535:
        raise ValueError(f"{c.name}: {grid[1]} column blocks exceed the grid's 65535")
    i32 = lambda v: Scalar("i32", int(v))  # noqa: E731
    i64 = lambda v: Scalar("i64", int(v))  # noqa: E731
    args = (Pointer(a_buffer), Pointer("values"), Pointer("rows"), Pointer(C), i32(call.rows),
            i32(cols), i32(depth), i64(call.lda), i64(values.shape[1]), i64(rows.shape[1]),
            i32(stages_total), i32(a_vectorized(call)), Aligned16(C, cols % 2 == 0),
            *([values_map(c, values.shape)] if c.tma else []),
            *([Pointer(BIAS)] if c.epilogue else []))
    return LaunchPlan((Launch(c.name, grid, c.threads, c.smem_bytes, args),))


def values_map(config: TensorCoreConfig, values: tuple[int, int]) -> TensorMap2D:
    """The map of the values (``values`` = their rows and columns; a box ``bk`` rows of 64
    columns). The values' rows are a multiple of 64 elements (``prepare.column_block``):
    128-byte rows, as the engine needs."""
    rows, cols = values
    return TensorMap2D("values", cols, rows, cols, (SWIZZLE_COLS, config.bk), ELEMENT_BYTES,
                       swizzle_128b=True)
