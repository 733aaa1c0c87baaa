"""The sparse-tensor-core family's launch plan: one kernel, a grid of column blocks x row
blocks x slices of K, both operands by the bulk copy engine (tensor maps of the weight's
values and of A). A that the engine cannot address (K-major, or rows not 16-byte aligned)
is first copied row-major into a workspace. With several slices, FP32 sums go to a
workspace and the last block of each tile adds them (a persistent counter a tile)."""

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
    TensorMap2D,
    Workspace,
)
from ..tensor_core import transpose
from .config import ELEMENT_BYTES, STAGE_K, SptcConfig

A_COPY, SPLIT_SUMS, TILE_COUNTERS = "a_copy", "split_sums", "tile_counters"
VECTOR_ELEMS = 8  # 16-bit elements of 16 bytes
BOX_K = 64  # elements of a 128-byte swizzled box row
PAD_THREADS = 256
MAX_GRID_Y = 65535


def engine_reads_a(config: SptcConfig, call: Call) -> bool:
    """Whether the bulk copy engine reads A where the caller holds it: row-major, 16-byte
    aligned, rows a multiple of 16 bytes apart."""
    return (config.a_layout is ALayout.ROW_MAJOR and call.a_aligned
            and call.lda % VECTOR_ELEMS == 0)


def slicing(config: SptcConfig, depth: int) -> tuple[int, int, int]:
    """(stages of K, stages a slice, slices): ``split_k`` slices at most, none empty."""
    stages = -(-depth // STAGE_K)
    per_slice = -(-stages // min(config.split_k, stages))
    return stages, per_slice, -(-stages // per_slice)


def plan(config: SptcConfig, weight: PreparedWeight, shape: tuple[int, int], call: Call,
         device: Device) -> LaunchPlan:
    c = config
    depth, cols = shape
    copies: tuple[Launch, ...] = ()
    workspaces: list[Workspace] = []
    a_buffer, lda = A, call.lda
    if not engine_reads_a(c, call):
        a_buffer, lda = A_COPY, -(-depth // VECTOR_ELEMS) * VECTOR_ELEMS
        copies = (copy_launch(c, call, depth, lda),)
        workspaces.append(Workspace(A_COPY, call.rows * lda, np.dtype(np.uint16)))
    values, meta = weight.arrays["values"], weight.arrays["meta"]
    stages, per_slice, slices = slicing(c, depth)
    grid = (-(-cols // c.bm), -(-call.rows // c.bn), slices)
    if grid[1] > MAX_GRID_Y:
        raise ValueError(f"{c.name}: {grid[1]} row blocks exceed the grid's {MAX_GRID_Y}")
    split = slices > 1
    if split:
        tile_size = c.bm * c.bn  # FP32 sums a tile a slice
        workspaces += [Workspace(SPLIT_SUMS, grid[0] * grid[1] * slices * tile_size),
                       Workspace(TILE_COUNTERS, grid[0] * grid[1], np.dtype(np.uint32),
                                 zeroed=True, persistent=True)]
    i32 = lambda v: Scalar("i32", int(v))  # noqa: E731
    args = (Pointer("meta"), Pointer(C), Pointer(SPLIT_SUMS if split else C),
            Pointer(TILE_COUNTERS if split else C), i32(call.rows), i32(cols), i32(stages),
            i32(per_slice), i32(meta.shape[1] // 256), Aligned16(C, cols % VECTOR_ELEMS == 0),
            TensorMap2D("values", values.shape[1], values.shape[0], values.shape[1],
                        (BOX_K, c.bm), ELEMENT_BYTES, swizzle_128b=True),
            TensorMap2D(a_buffer, depth, call.rows, lda, (BOX_K, c.bn), ELEMENT_BYTES,
                        swizzle_128b=True),
            *([Pointer(BIAS)] if c.epilogue else []))
    main = Launch(c.name, grid, c.threads, c.smem_bytes, args)
    return LaunchPlan((*copies, main), tuple(workspaces))


def copy_launch(config: SptcConfig, call: Call, depth: int, ldw: int) -> Launch:
    """The copy of A into the row-major workspace (rows ``ldw`` apart)."""
    i32 = lambda v: Scalar("i32", int(v))  # noqa: E731
    i64 = lambda v: Scalar("i64", int(v))  # noqa: E731
    if config.a_layout is ALayout.ROW_MAJOR:
        blocks = -(-call.rows * ldw // PAD_THREADS)
        return Launch(config.name + "_pad", (blocks, 1, 1), PAD_THREADS, 0,
                      (Pointer(A), Pointer(A_COPY), i32(call.rows), i32(depth),
                       i64(call.lda), i64(ldw)))
    # K-major A (K x M, rows lda apart) is a row-major K x M matrix: its transpose is
    # row-major A (M x K), written with rows ldw apart.
    vec = call.a_aligned and call.lda % VECTOR_ELEMS == 0
    return Launch(transpose.entry(config),
                  (-(-ldw // transpose.TILE_M), -(-call.rows // transpose.TILE_K), 1),
                  transpose.THREADS, 0,
                  (Pointer(A), Pointer(A_COPY), i32(depth), i32(call.rows), i64(call.lda),
                   i64(ldw), i32(vec)))
