"""The tensor-core family's model: a stage's MMAs against its shared-memory traffic (the
ldmatrix reads, the copies in and, for row-major A, the gather), per SM and wave, beside
the bytes from DRAM and L2 that the tiling implies (``tensor_core.model``).

- Tensor cores: ``mma.sync`` m16n8k16 at ``TENSOR_TFLOPS`` of the GPU (the H100's 650 is
  measured, DESIGN §8; ``wgmma`` is not used); a block of few warps cannot keep them busy
  (``occupancy_efficiency``).
- Shared memory: 128 bytes a cycle an SM; a gathered 16-bit read is one wavefront of 32
  lanes, with ``GATHER_CONFLICTS`` replays for the random columns of row-major A.
- Pipeline: the ``stages - 1`` stages in flight ahead of the one computed hide the
  copies' latency.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

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
LDMATRIX_X4_BYTES = 512
GATHER_CONFLICTS = 1.5  # replays of a warp's gathered reads of random columns
STAGE_OVERHEAD_CYCLES = 120  # a stage's barriers and loop
FULL_WARPS = 8  # resident warps an SM that keep the tensor cores busy
OCCUPANCY_FLOOR = 0.5
MAX_WARPS_PER_SM = 64


def tensor_tflops(gpu: GpuSpec) -> float:
    return TENSOR_TFLOPS.get(gpu.name, TENSOR_OVER_FP32 * gpu.peak_fp32_tflops)


def feasible(config: MmaConfig, gpu: GpuSpec) -> str | None:
    if config.arch.number > gpu.arch.number:
        return f"{config.arch.value} code cannot run on {gpu.name} ({gpu.arch.value})"
    return tc.refusal(config, gpu)


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
    return tc.mma_cycles(config, gpu, tensor_tflops(gpu))


def occupancy_efficiency(warps: float) -> float:
    return min(1.0, OCCUPANCY_FLOOR + (1.0 - OCCUPANCY_FLOOR) * warps / FULL_WARPS)


@functools.lru_cache(maxsize=4096)
def stage_time(config: MmaConfig, gpu: GpuSpec) -> tc.StageTime:
    per_sm = max(1, tc.blocks_per_sm(config, gpu))
    warps = min(MAX_WARPS_PER_SM, per_sm * config.threads // 32)
    mma = stage_mma_cycles(config, gpu) / occupancy_efficiency(warps)
    return tc.pipelined(mma, stage_smem_bytes(config), STAGE_OVERHEAD_CYCLES,
                        config.stages - 1, per_sm)


def estimate(config: MmaConfig, gpu: GpuSpec, rows: int, cols: int, depth: int) -> Estimate:
    return tc.estimate(config, gpu, stage_time(config, gpu), rows, cols, depth)


def estimate_ms(config: MmaConfig, gpu: GpuSpec, shape: Shape) -> float:
    return estimate(config, gpu, *shape).time_ms


def rank_table(configs: Sequence[MmaConfig], gpu: GpuSpec) -> RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name)."""
    return RankTable(list(configs), gpu, feasible, estimate)
