"""The tensor-core families' launch plan: one kernel, a grid of row blocks x column blocks.
A's 16-byte copies need its rows 16-byte aligned (``a_vec``), else the kernel reads A an
element at a time; C takes pairs of values where N is even and C 16-byte aligned."""

from __future__ import annotations

from ..base import PreparedWeight
from ..plan import BIAS, A, Aligned16, C, Call, Device, Launch, LaunchPlan, Pointer, Scalar
from .config import TensorCoreConfig

VECTOR_ELEMS = 8  # 16-bit elements of one 16-byte copy


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
            *([Pointer(BIAS)] if c.epilogue else []))
    return LaunchPlan((Launch(c.name, grid, c.threads, c.smem_bytes, args),))
