"""The FP32 SIMT family's launch plan for one call, as data (``nmgen.families.plan``).

Up to three kernels a call: A's transpose (``tx``: row-major A copied K-major into a
workspace first), the main kernel, the split-K reduction. The stream-K grid adds a
partial-sum workspace and zeroed flags; a ``tma`` kernel takes tensor maps of its A and B'
tiles. Where M holds enough whole waves, a ``tx`` call is pipelined in chunks of rows
(``copy_plan``).
"""

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
from .config import KernelConfig
from .copy_plan import copy_chunk_rows, copy_chunks
from .render import COPY_A_THREADS, COPY_A_TILE

# How long copy 1 of a pipelined call waits after copy 0 ends, on the GPU: long enough for
# main kernel 0's blocks to take the SMs first (waits of 2 to 20 us read the same on the
# H100; docs/engineering-notes.md, "Row-major A").
COPY_1_DELAY_NS = 2000
REDUCE_THREADS = 256
A_COPY, SPLIT_SUMS, TILE_SUMS, TILE_FLAGS = "a_copy", "split_sums", "tile_sums", "tile_flags"


def i32(value: int) -> Scalar:
    return Scalar("i32", int(value))


def i64(value: int) -> Scalar:
    return Scalar("i64", int(value))


def stream_k_grid(tiles: int, stages: int, resident: int) -> tuple[int, int]:
    """(blocks, whole tiles) of a stream-K launch: as many blocks as fit on the GPU at
    once (``resident``), at most one a stage; they run all full waves of tiles but the last
    whole, round robin, and share the stages of the rest out evenly. Sharing the last full
    wave too was 0.2-1 % faster at 4096^3 and 1-2 % at 1024x6656x6656 on the H100, and
    gives each block at least one tile's stages."""
    blocks = min(resident, tiles * stages)
    return blocks, max(0, tiles // blocks - 1) * blocks


def tma_addressable(lda: int, aligned: bool) -> bool:
    """Whether the copy engine can read float32 A: 16-byte aligned, rows a multiple of 16
    bytes apart."""
    return aligned and lda % 4 == 0


def plan(config: KernelConfig, weight: PreparedWeight, shape: tuple[int, int], call: Call,
         device: Device) -> LaunchPlan:
    c = config
    if c.tma and not c.a_copied and not tma_addressable(call.lda, call.a_aligned):
        return LaunchPlan((), instead=c.cp_async_twin())
    k_dim, n_cols = shape
    m_rows, lda, a_aligned = call.rows, call.lda, call.a_aligned
    launches: list[Launch] = []
    workspaces: list[Workspace] = []
    a_buffer = A
    if c.a_copied:  # the main kernel reads an aligned K-major copy of A
        ld = -(-m_rows // 4) * 4
        workspaces.append(Workspace(A_COPY, k_dim * ld))
        launches.append(Launch(
            c.name + "_transpose", (-(-k_dim // COPY_A_TILE), -(-ld // COPY_A_TILE), 1),
            COPY_A_THREADS, 0,
            (Pointer(A), Pointer(A_COPY), i32(m_rows), i32(k_dim), i64(lda), i64(ld))))
        a_buffer, lda, a_aligned = A_COPY, ld, True  # workspaces are 256-byte aligned
    # 16-byte copies along A's contiguous dimension need it and the rows aligned; a "tx"
    # copy's rows are padded with zeros to a multiple of 4 (a chunk across M reads zeros).
    extent = k_dim if c.kernel_a_layout is ALayout.ROW_MAJOR else m_rows
    a_vec4 = (c.a_copied or extent % 4 == 0) and lda % 4 == 0 and a_aligned
    values = weight.arrays["values"]
    stages_total = weight.arrays["pos"].shape[1]
    ldb = values.shape[1]
    out = SPLIT_SUMS if c.split_k > 1 else C
    args = [Pointer(a_buffer), Pointer("values"), Pointer("pos"), Pointer("rows"),
            Pointer(out), i32(m_rows), i32(n_cols), i32(k_dim), i64(lda), i64(ldb),
            i64(n_cols), i32(stages_total), i32(-(-stages_total // c.split_k)), i32(a_vec4),
            Aligned16(out, n_cols % 4 == 0)]
    grid = (ldb // c.ns, -(-m_rows // c.ms), c.split_k)
    resident = device.sms * device.resident_blocks(c.name, c.threads, c.smem_bytes)
    if c.stream_k:  # a persistent grid: as many blocks as fit at once, at most one a stage
        tiles = grid[0] * grid[1]
        if tiles * stages_total >= 2**31:  # the kernel counts stages in 32 bits
            raise ValueError(f"{c.name}: {tiles} tiles of {stages_total} stages are too "
                             "many for the stream-K grid; use a data-parallel kernel")
        blocks, whole_tiles = stream_k_grid(tiles, stages_total, resident)
        # The flags are zeroed first, before A's copy, which the main kernel follows.
        workspaces += [Workspace(TILE_SUMS, blocks * c.ms * c.ns),
                       Workspace(TILE_FLAGS, blocks, np.dtype(np.int32), zeroed=True)]
        args += [Pointer(TILE_SUMS), Pointer(TILE_FLAGS), i32(grid[0]), i32(grid[1]),
                 i32(whole_tiles)]
        grid = (blocks, 1, 1)
    if c.tma:  # tensor maps of the A tile and the B' tile
        args += [TensorMap2D(a_buffer, m_rows, k_dim, lda, (c.ms, c.ks)),
                 TensorMap2D("values", ldb, values.shape[0], ldb, (c.ns, c.ws))]
    if c.epilogue and c.split_k == 1:  # else the reduction's
        args.append(Pointer(BIAS))
    launches.append(Launch(c.name, grid, c.threads, c.smem_bytes, tuple(args),
                           after_previous=c.waits_for_copy))
    if c.split_k > 1:
        workspaces.append(Workspace(SPLIT_SUMS, c.split_k * m_rows * n_cols))
        blocks = max(1, min(-(-m_rows * n_cols // REDUCE_THREADS), device.sms * 16))
        launches.append(Launch(c.name + "_reduce", (blocks, 1, 1), REDUCE_THREADS, 0, (
            Pointer(SPLIT_SUMS), Pointer(C), i32(m_rows), i32(n_cols), i64(n_cols),
            *([Pointer(BIAS)] if c.epilogue else []))))
    chunks: tuple[int, ...] = ()
    if c.a_copied and c.split_k == 1 and not c.stream_k:
        rows = int(copy_chunk_rows(k_dim, c.ms, grid[0], resident))
        chunks = tuple(copy_chunks(m_rows, rows))
    return LaunchPlan(tuple(launches), tuple(workspaces), chunks if len(chunks) > 1 else (),
                      COPY_1_DELAY_NS)
