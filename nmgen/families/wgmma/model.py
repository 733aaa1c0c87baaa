"""The wgmma family's model: a stage's warpgroup MMAs against its shared-memory traffic
(the operands the MMAs read, the copies in), per SM and wave, beside the bytes from DRAM
and L2 that the tiling implies (``tensor_core.model``).

- Tensor cores: ``wgmma`` m64nNk16 at ``TENSOR_TFLOPS`` of the GPU (H100: ~950 dense BF16,
  DESIGN §8); few resident warpgroups an SM leave them idle at every stage's barrier
  (``occupancy_efficiency``).
- Shared memory: 128 bytes a cycle an SM for the copies in and for the operands every
  wgmma reads (its m64 x 16 tile of A and 16 x N tile of B'): narrow tiles read A and B'
  more often for the same MMAs.
- Pipeline: one stage is read by the wgmma in flight, so the ``stages - 2`` stages ahead
  of the one computed hide the copies' latency.
- Row-major A: the transpose kernel's bytes at DRAM bandwidth and its launch, before.

A producer warpgroup (``producer="warp"``) is modelled as the shared-copy kernel is, by its
MMA warpgroups, but with its own resources: the producer's threads, registers
(``WgmmaConfig.blocks_by_registers``) and mbarriers count against the blocks an SM. Until
GPU measurements say how much its decoupled copies gain (a stage ahead more: STAGES - 1
in flight instead of STAGES - 2, no block barrier), its estimate is never below its shared
twin's (fewer blocks an SM can model faster through the waves), and ties go by name, the
shared one first: the model's choices stay the measured kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from ...gpus import Arch, GpuSpec
from ...shapes import Shape
from ..tensor_core import model as tc
from ..tensor_core.model import Estimate, RankTable
from .config import Producer, WgmmaConfig

# wgmma dense peak (TFLOP/s, BF16/FP16 with FP32 accumulation) by GPU; other sm_90 GPUs
# are taken as TENSOR_OVER_FP32 times their FP32 peak.
TENSOR_TFLOPS = {"h100": 950.0, "h200": 950.0}
TENSOR_OVER_FP32 = 14.2
STAGE_OVERHEAD_CYCLES = 80  # a stage's wait, fence, barrier and issue
FULL_WARPGROUPS = 2  # resident warpgroups an SM that keep the tensor cores busy
OCCUPANCY_FLOOR = 0.6


def tensor_tflops(gpu: GpuSpec) -> float:
    return TENSOR_TFLOPS.get(gpu.name, TENSOR_OVER_FP32 * gpu.peak_fp32_tflops)


def feasible(config: WgmmaConfig, gpu: GpuSpec) -> str | None:
    if gpu.arch is not Arch.SM90:
        return f"wgmma (sm_90a) cannot run on {gpu.name} ({gpu.arch.value})"
    return tc.refusal(config, gpu)


def stage_smem_bytes(config: WgmmaConfig) -> float:
    """Shared-memory traffic of one stage of a block: the operands its wgmmas read (every
    warpgroup reads the whole B' tile, and its own rows of A) and the copies in."""
    c = config
    reads = c.warpgroups * c.bk * 2.0 * (c.bn + 64 * c.tiles_m)
    return reads + c.stage_bytes


def stage_mma_cycles(config: WgmmaConfig, gpu: GpuSpec) -> float:
    """Cycles of one SM's tensor cores for one stage of a block."""
    return tc.mma_cycles(config, gpu, tensor_tflops(gpu))


def occupancy_efficiency(warpgroups: float) -> float:
    return min(1.0, OCCUPANCY_FLOOR + (1.0 - OCCUPANCY_FLOOR) * warpgroups / FULL_WARPGROUPS)


@functools.lru_cache(maxsize=4096)
def stage_time(config: WgmmaConfig, gpu: GpuSpec) -> tc.StageTime:
    per_sm = max(1, tc.blocks_per_sm(config, gpu))
    mma = stage_mma_cycles(config, gpu) / occupancy_efficiency(per_sm * config.warpgroups)
    return tc.pipelined(mma, stage_smem_bytes(config), STAGE_OVERHEAD_CYCLES,
                        config.stages - 2, per_sm)


def estimate(config: WgmmaConfig, gpu: GpuSpec, rows: int, cols: int, depth: int
             ) -> Estimate:
    """A producer warpgroup's configuration: its own estimate (its resources) or its shared
    twin's, the slower (see the module's note)."""
    own = _estimate(config, gpu, rows, cols, depth)
    if not config.specialized:
        return own
    twin = _estimate(config.replace(producer=Producer.SHARED), gpu, rows, cols, depth)
    return twin if twin.time_ms > own.time_ms else own


def _estimate(config: WgmmaConfig, gpu: GpuSpec, rows: int, cols: int, depth: int
              ) -> Estimate:
    return tc.estimate(config, gpu, stage_time(config, gpu), rows, cols, depth)


def estimate_ms(config: WgmmaConfig, gpu: GpuSpec, shape: Shape) -> float:
    return estimate(config, gpu, *shape).time_ms


def rank_table(configs: Sequence[WgmmaConfig], gpu: GpuSpec) -> RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name)."""
    return RankTable(list(configs), gpu, feasible, estimate)
