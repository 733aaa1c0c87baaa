"""The tensor-core family's model: a block's stage as the work of its warps (the copy loop's
``cp.async`` chunks, for row-major A the gather of the window tile into the K-major tile,
the ldmatrix reads and the MMAs): one block's own latency plus the SM's throughput shared
by its resident blocks (``tensor_core.model.StageTime``), beside the bytes from DRAM and
L2 that the tiling implies (``tensor_core.model``).

- Throughput: an SM issues one warp instruction a cycle on each of its ``SUBCORES``
  schedulers, moves 128 bytes of shared memory a cycle, and runs ``mma.sync`` m16n8k16 at
  ``TENSOR_TFLOPS`` of the GPU (the H100's 650 is measured, docs/design.md §8; ``wgmma`` is not
  used). A warp stays on one scheduler: fewer resident warps than ``SUBCORES`` leave the
  others idle.
- Latency: a warp's iteration of the copy or the gather loop is a chain of dependent
  steps (index arithmetic, the table read, the element reads it addresses, the store)
  that takes ``LOOP_ITERATION_CYCLES``; a warp's MMAs take their tensor core's cycles;
  a stage adds its barriers and the first latencies (``STAGE_OVERHEAD_CYCLES``) and waits
  for copies that the stages ahead did not hide. A block of few warps spends a stage in
  this path, however idle its SM.
- K-major A (the caller's, or the transpose kernel's copy of row-major A): each of a
  thread's copies of gathered rows reads its row's index first (``INDEX_COPY_CYCLES`` a
  copy, in the stage's path).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

from ...gpus import GpuSpec
from ...shapes import Shape
from ..tensor_core import model as tc
from ..tensor_core.model import Estimate, RankTable
from .config import MmaConfig

# mma.sync dense peak (TFLOP/s, BF16/FP16 with FP32 accumulation) by GPU; others are taken
# as TENSOR_OVER_FP32 times their FP32 peak.
TENSOR_TFLOPS = {"h100": 650.0, "h200": 650.0, "a100": 312.0, "a10": 125.0,
                 "rtx3090": 71.0, "l4": 121.0, "l40s": 362.0, "rtx4090": 165.0}
TENSOR_OVER_FP32 = 9.7
SUBCORES = 4  # schedulers (and tensor cores) an SM
LDMATRIX_X4_BYTES = 512
GATHER_CONFLICTS = 1.5  # replays of a warp's gathered reads of random columns
GATHER_INSTRUCTIONS = 16  # a gathered pair: indices, table read, two reads, pack, store
COPY_INSTRUCTIONS = 12  # a 16-byte cp.async: indices, bounds, address
LOOP_ITERATION_CYCLES = 100  # a warp's iteration of the copy or gather loop (H100 fit)
MMA_LATENCY_CYCLES = 32  # a warp's k16 step of dependent MMAs, at the least
# The next two are fitted together (least squared log error) on the H100 bf16 tunes of
# row-major A (1:4, 2:8, 2:4 at L = 32; 8:32 at L = 64 and 128) and the earlier tune of
# in-kernel gathers: results/untuned_h100/bf16_refit/model_study_mma.txt.
STAGE_OVERHEAD_CYCLES = 481  # a stage's waits, two barriers, first latencies
INDEX_COPY_CYCLES = 298  # a copy of a gathered row of K-major A: its row index read first


class StageWork(NamedTuple):
    """One stage of a block, in units of the kernel's loops."""

    pairs: int  # gathered pairs of elements (row-major A), one a thread an iteration
    chunks: int  # 16-byte cp.async copies
    indexed: int  # of them, copies of gathered rows of K-major A (each reads its row index)
    mmas: int  # m16n8k16 MMAs
    ldmatrix: int  # ldmatrix.x4 (an .x2 counted as one) of all warps


def tensor_tflops(gpu: GpuSpec) -> float:
    return TENSOR_TFLOPS.get(gpu.name, TENSOR_OVER_FP32 * gpu.peak_fp32_tflops)


def feasible(config: MmaConfig, gpu: GpuSpec) -> str | None:
    if config.arch.number > gpu.arch.number:
        return f"{config.arch.value} code cannot run on {gpu.name} ({gpu.arch.value})"
    return tc.refusal(config, gpu)


def stage_work(config: MmaConfig) -> StageWork:
    c = config
    steps = c.bk // 16
    warps = c.warps_m * c.warps_n
    gathered = c.groups * c.bk * c.bm  # the groups' gathered A elements
    a_chunks = (c.bm * c.bkd // 8 + c.groups * c.bk // 4 if c.gathers_windows
                else gathered // 8)
    return StageWork(pairs=gathered // 2 if c.gathers_windows else 0,
                     chunks=c.bk * c.bn // 8 + a_chunks,
                     indexed=0 if c.gathers_windows else a_chunks,
                     mmas=(c.bm // 16) * (c.bn // 8) * steps,
                     ldmatrix=warps * steps * (c.wm // 16 + math.ceil(c.wn / 16)))


def stage_smem_bytes(config: MmaConfig) -> float:
    """Shared-memory traffic of one stage of a block, in bytes of 128-byte wavefronts: the
    copies' stores, the gather (a table read, two u16 reads with replays and a u32 store a
    warp's 32 pairs) and the ldmatrix reads."""
    w = stage_work(config)
    gather = w.pairs / 32 * (2 + 2 * GATHER_CONFLICTS) * 128
    return 16 * w.chunks + gather + w.ldmatrix * LDMATRIX_X4_BYTES


def stage_instructions(config: MmaConfig) -> float:
    """Warp instructions of one stage of a block."""
    w = stage_work(config)
    return (w.pairs / 32 * GATHER_INSTRUCTIONS + w.chunks / 32 * COPY_INSTRUCTIONS
            + w.mmas + w.ldmatrix)


def stage_mma_cycles(config: MmaConfig, gpu: GpuSpec) -> float:
    """Cycles of one SM's tensor cores, all busy, for one stage of a block."""
    return tc.mma_cycles(config, gpu, tensor_tflops(gpu))


def stage_latency(config: MmaConfig, gpu: GpuSpec) -> float:
    """Cycles of one stage of a block alone on its SM: each warp's share of the copy and
    gather iterations and the row indices its copies read, then its MMAs on its
    scheduler's tensor core (shared with the block's other warps there), then the stage's
    overhead; at least the copy latency over the stages ahead."""
    c, w = config, stage_work(config)
    sharing = math.ceil(c.threads / 32 / SUBCORES)  # the block's warps a scheduler
    iteration = max(LOOP_ITERATION_CYCLES, sharing * GATHER_INSTRUCTIONS)
    loops = (math.ceil(w.pairs / c.threads) + math.ceil(w.chunks / c.threads)) * iteration
    loops += w.indexed / c.threads * INDEX_COPY_CYCLES  # a thread's share of index reads
    mma_each = SUBCORES * stage_mma_cycles(c, gpu) / max(1, w.mmas)  # on one tensor core
    warp_mmas = (c.wm // 16) * (c.wn // 8)
    mma = c.bk // 16 * max(MMA_LATENCY_CYCLES, sharing * warp_mmas * mma_each)
    path = loops + mma + STAGE_OVERHEAD_CYCLES
    return max(path, tc.COPY_LATENCY_CYCLES / (c.stages - 1))


@functools.lru_cache(maxsize=4096)
def stage_time(config: MmaConfig, gpu: GpuSpec) -> tc.StageTime:
    per_sm = max(1, tc.blocks_per_sm(config, gpu))
    subcores = min(SUBCORES, per_sm * config.threads // 32)  # those with a warp
    busy = SUBCORES / subcores
    throughput = max(stage_instructions(config) / subcores,
                     stage_mma_cycles(config, gpu) * busy,
                     stage_smem_bytes(config) / tc.SMEM_BYTES_PER_CYCLE)
    return tc.StageTime(throughput, tc.PIPELINE_FILL_CYCLES, per_sm,
                        stage_latency(config, gpu))


def estimate(config: MmaConfig, gpu: GpuSpec, rows: int, cols: int, depth: int) -> Estimate:
    return tc.estimate(config, gpu, stage_time(config, gpu), rows, cols, depth)


def estimate_ms(config: MmaConfig, gpu: GpuSpec, shape: Shape) -> float:
    return estimate(config, gpu, *shape).time_ms


def rank_table(configs: Sequence[MmaConfig], gpu: GpuSpec) -> RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name)."""
    return RankTable(list(configs), gpu, feasible, estimate)
