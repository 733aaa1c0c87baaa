"""The tensor-core family's model: a stage's MMAs against its shared-memory traffic (the
ldmatrix reads, the copies in and, for row-major A, the gather), per SM and wave, beside
the bytes from DRAM and L2 that the tiling implies.

- Tensor cores: ``mma.sync`` m16n8k16 at ``TENSOR_TFLOPS`` of the GPU (the H100's 650 is
  measured, DESIGN §8; ``wgmma`` is not used); a block of few warps cannot keep them busy
  (``occupancy_efficiency``).
- Shared memory: 128 bytes a cycle an SM; a gathered 16-bit read is one wavefront of 32
  lanes, with ``GATHER_CONFLICTS`` replays for the random columns of row-major A.
- Memory: A once from DRAM (and once a column block from L2: the dense window for
  row-major A, the kept rows for K-major), the compressed values once (and once a row
  block from L2), the index table, C written once.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...gpus import REGISTERS_PER_SM, GpuSpec
from ...shapes import Shape
from .config import MmaConfig
from .prepare import stage_count

# mma.sync dense peak (TFLOP/s, BF16/FP16 with FP32 accumulation) by GPU; others are taken
# as TENSOR_OVER_FP32 times their FP32 peak.
TENSOR_TFLOPS = {"h100": 650.0, "h200": 650.0, "a100": 312.0, "a10": 125.0,
                 "rtx3090": 71.0, "l4": 121.0, "l40s": 362.0, "rtx4090": 165.0}
TENSOR_OVER_FP32 = 9.7
CLOCK_GHZ = 1.755
SMEM_BYTES_PER_CYCLE = 128
LDMATRIX_X4_BYTES = 512
GATHER_CONFLICTS = 1.5  # replays of a warp's gathered reads of random columns
STAGE_OVERHEAD_CYCLES = 120  # a stage's barriers and loop
PIPELINE_FILL_CYCLES = 1500  # the first stages' copies, exposed once a block
# A stage's copies take about this long to land; the stages in flight ahead of the one
# computed (stages - 1 of them, each a stage's time on its SM) hide it, or the rest waits.
COPY_LATENCY_CYCLES = 1000
BANDWIDTH_SHARE = 0.85
LAUNCH_US = 3.0
FULL_WARPS = 8  # resident warps an SM that keep the tensor cores busy
OCCUPANCY_FLOOR = 0.5
MAX_BLOCKS_PER_SM = 32
MAX_WARPS_PER_SM = 64
SMEM_RESERVED_PER_BLOCK = 1024


def tensor_tflops(gpu: GpuSpec) -> float:
    return TENSOR_TFLOPS.get(gpu.name, TENSOR_OVER_FP32 * gpu.peak_fp32_tflops)


def blocks_per_sm(config: MmaConfig, gpu: GpuSpec) -> int:
    by_regs = REGISTERS_PER_SM // (config.threads * config.registers_estimate)
    by_threads = gpu.max_threads_per_sm // config.threads
    by_smem = gpu.smem_per_sm // (config.smem_bytes + SMEM_RESERVED_PER_BLOCK)
    return max(0, min(by_regs, by_threads, by_smem, MAX_BLOCKS_PER_SM))


def feasible(config: MmaConfig, gpu: GpuSpec) -> str | None:
    if config.arch.number > gpu.arch.number:
        return f"{config.arch.value} code cannot run on {gpu.name} ({gpu.arch.value})"
    if config.smem_bytes > gpu.arch.max_smem_per_block:
        return f"shared memory {config.smem_bytes} B > {gpu.arch.max_smem_per_block} B"
    if blocks_per_sm(config, gpu) < 1:
        return "not one block fits an SM (registers, threads or shared memory)"
    return None


def stage_smem_bytes(config: MmaConfig) -> float:
    """Shared-memory traffic of one stage of a block, in bytes of 128-byte wavefronts."""
    c = config
    steps = c.bk // 16
    mt, nt = c.wm // 16, c.wn // 8
    ldmatrix = c.warps_m * c.warps_n * steps * (mt + nt / 2) * LDMATRIX_X4_BYTES
    copies = 2 * c.bk * c.bn + (2 * c.bm * c.bkd + 4 * c.bk if c.row_major else 2 * c.bk * c.bm)
    gather = 0.0
    if c.row_major:  # a u16 read a element (one wavefront a warp), a u32 store a pair
        gather = c.bm * c.bk * (4 * GATHER_CONFLICTS + 2)
    return ldmatrix + copies + gather


def stage_mma_cycles(config: MmaConfig, gpu: GpuSpec) -> float:
    """Cycles of one SM's tensor cores for one stage of a block."""
    flops = 2.0 * config.bm * config.bn * config.bk
    per_cycle = tensor_tflops(gpu) * 1e12 / (gpu.sms * CLOCK_GHZ * 1e9)
    return flops / per_cycle


def occupancy_efficiency(warps: float) -> float:
    return min(1.0, OCCUPANCY_FLOOR + (1.0 - OCCUPANCY_FLOOR) * warps / FULL_WARPS)


@functools.lru_cache(maxsize=4096)
def _per_config(config: MmaConfig, gpu: GpuSpec) -> tuple[float, float, int]:
    """(cycles of a stage of a block, on an SM shared by its resident blocks, fill cycles,
    resident blocks an SM)."""
    per_sm = max(1, blocks_per_sm(config, gpu))
    warps = min(MAX_WARPS_PER_SM, per_sm * config.threads // 32)
    mma = stage_mma_cycles(config, gpu) / occupancy_efficiency(warps)
    smem = stage_smem_bytes(config) / SMEM_BYTES_PER_CYCLE
    stage = max(mma, smem) + STAGE_OVERHEAD_CYCLES / per_sm
    ahead = (config.stages - 1) * stage * per_sm
    waiting = max(0.0, COPY_LATENCY_CYCLES - ahead) / per_sm
    return stage + waiting, PIPELINE_FILL_CYCLES, per_sm


@dataclass(frozen=True)
class Estimate:
    time_ms: float
    compute_ms: float
    memory_ms: float
    blocks: int
    blocks_per_sm: int

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ms >= self.memory_ms else "memory"


def estimate(config: MmaConfig, gpu: GpuSpec, rows: int, cols: int, depth: int) -> Estimate:
    c = config
    stage_cycles, fill_cycles, per_sm = _per_config(c, gpu)
    stages = stage_count(c, depth)
    row_blocks = -(-rows // c.bm)
    cols_p = -(-cols // c.vec) * c.vec
    col_blocks = cols_p // c.bn
    blocks = row_blocks * col_blocks
    waves = -(-blocks // (gpu.sms * per_sm))
    # A wave's blocks share their SM: per_sm of them take per_sm times a block's stages.
    busy = min(per_sm, -(-blocks // gpu.sms))
    compute_cycles = waves * (busy * stages * stage_cycles + fill_cycles)
    compute_ms = compute_cycles / (CLOCK_GHZ * 1e6)
    w_rows = stages * c.bk
    values = 2.0 * w_rows * cols_p + 4.0 * w_rows * (cols_p // c.vec)
    a_bytes = 2.0 * rows * depth
    dram = a_bytes + values + 2.0 * rows * cols
    a_tile = stages * c.bkd if c.row_major else w_rows
    through_l2 = col_blocks * 2.0 * row_blocks * c.bm * a_tile + row_blocks * values
    memory_ms = max(dram / (gpu.dram_gbs * 1e9 * BANDWIDTH_SHARE),
                    through_l2 / (gpu.l2_gbs * 1e9 * BANDWIDTH_SHARE)) * 1e3
    time_ms = (max(compute_ms, memory_ms) + 0.25 * min(compute_ms, memory_ms)
               + LAUNCH_US / 1e3)
    return Estimate(time_ms, compute_ms, memory_ms, blocks, per_sm)


def estimate_ms(config: MmaConfig, gpu: GpuSpec, shape: Shape) -> float:
    return estimate(config, gpu, *shape).time_ms


@dataclass
class RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name)."""

    configs: list[MmaConfig]
    gpu: GpuSpec

    def __post_init__(self) -> None:
        self.configs = sorted((c for c in self.configs if feasible(c, self.gpu) is None),
                              key=lambda c: c.name)

    def rank(self, rows: int, cols: int, depth: int) -> list[tuple[float, MmaConfig]]:
        times = np.array([estimate(c, self.gpu, rows, cols, depth).time_ms
                          for c in self.configs], dtype=np.float64)
        order = np.argsort(times, kind="stable")
        return [(float(times[i]), self.configs[i]) for i in order.tolist()]


def rank_all(configs: Sequence[MmaConfig], gpu: GpuSpec, shape: Shape
             ) -> list[tuple[float, MmaConfig]]:
    return RankTable(list(configs), gpu).rank(*shape)
