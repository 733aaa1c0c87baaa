"""The sparse-tensor-core family's model: a block's stages at the larger of its tensor
time and its copies' time on its SM, over the waves of the grid, beside the DRAM bytes.

- tensor: a stage's ``2·bm·bn·128`` dense-equivalent flops at ``SPARSE_OVER_DENSE`` times
  the dense wgmma rate of the GPU (the hardware skips the pruned half), shared by the
  blocks resident on an SM;
- copies: a stage's bytes (values, metadata, A's rows) from L2 into the SM, at the SM's
  share of the L2's ``L2_TO_SM_BYTES_PER_CYCLE`` among the SMs that have blocks (at most
  ``SM_COPY_BYTES_PER_CYCLE``), shared likewise, and no faster than one stage a
  ``COPY_LATENCY_CYCLES / (stages - 2)`` (the copies in flight beside the stage computed:
  what keeps a decode kernel of few blocks or stages below the bandwidth);
- DRAM: the compressed weight (values and metadata) once, A once a column block of the
  grid that L2 does not hold, C once, at ``BANDWIDTH_SHARE`` of the bandwidth;
- a block's fill (the first stages' copies) once a wave, the slices' sums, the launch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from ...gpus import Arch, GpuSpec
from ...shapes import Shape
from ..tensor_core.model import RankTable
from .config import ELEMENT_BYTES, META_BYTES_PER_ROW, STAGE_K, SptcConfig

DENSE_TENSOR_TFLOPS = {"h100": 950.0, "h200": 950.0}
TENSOR_OVER_FP32 = 14.2
SPARSE_OVER_DENSE = 1.8  # of the 2x the sparse instructions promise
CLOCK_GHZ = 1.755
# Bulk copies from L2 into shared memory: all SMs together (H200, 2048x18944x3584: the
# stages of every tile shape took their bytes at 7.4 TB/s, results/sptc_h200/), and one SM
# alone at most.
L2_TO_SM_BYTES_PER_CYCLE = 4200.0
SM_COPY_BYTES_PER_CYCLE = 110.0
# Slices of K: each slice's FP32 sums written and read again, at this rate (H200: the same
# tiles with two slices took 1 ms more at that shape).
SPLIT_SUMS_GBS = 600.0
# A stage's round trip: its copies issued, landed, its wgmmas done and its buffer released
# (one stage late); stages - 2 of them in flight (H200 fits of decode and prefill tiles).
COPY_LATENCY_CYCLES = 2600
SPLIT_LATENCY_US = 1.5  # the last block's read of the other slices' sums
FILL_CYCLES = 1800  # a block's first stages, once a wave
BANDWIDTH_SHARE = 0.85
LAUNCH_US = 3.0
SMEM_RESERVED_PER_BLOCK = 1024
MAX_BLOCKS_PER_SM = 8


def tensor_tflops(gpu: GpuSpec) -> float:
    return DENSE_TENSOR_TFLOPS.get(gpu.name, TENSOR_OVER_FP32 * gpu.peak_fp32_tflops)


def blocks_per_sm(config: SptcConfig, gpu: GpuSpec) -> int:
    by_smem = gpu.smem_per_sm // (config.smem_bytes + SMEM_RESERVED_PER_BLOCK)
    by_threads = gpu.max_threads_per_sm // config.threads
    return max(0, min(by_smem, by_threads, config.blocks_by_registers(), MAX_BLOCKS_PER_SM))


def feasible(config: SptcConfig, gpu: GpuSpec) -> str | None:
    if gpu.arch is not Arch.SM90:
        return f"wgmma.mma_async.sp (sm_90a) cannot run on {gpu.name} ({gpu.arch.value})"
    if config.smem_bytes > gpu.arch.max_smem_per_block:
        return f"shared memory {config.smem_bytes} B > {gpu.arch.max_smem_per_block} B"
    if blocks_per_sm(config, gpu) < 1:
        return "not one block fits an SM (registers, threads or shared memory)"
    return None


@functools.lru_cache(maxsize=4096)
def stage_cycles(config: SptcConfig, gpu: GpuSpec, active_sms: int) -> tuple[float, float]:
    """(tensor, copy) cycles of one stage of one block on its SM, ``active_sms`` SMs
    copying."""
    c = config
    flops_per_cycle = (SPARSE_OVER_DENSE * tensor_tflops(gpu) * 1e12
                       / (gpu.sms * CLOCK_GHZ * 1e9))
    tensor = 2.0 * c.bm * c.bn * STAGE_K / flops_per_cycle
    share = min(SM_COPY_BYTES_PER_CYCLE, L2_TO_SM_BYTES_PER_CYCLE * gpu.sms / 132 / active_sms)
    return tensor, c.stage_bytes / share


@dataclass(frozen=True)
class Estimate:
    time_ms: float
    waves: int


def estimate(config: SptcConfig, gpu: GpuSpec, rows: int, cols: int, depth: int) -> Estimate:
    c = config
    stages = -(-depth // STAGE_K)
    per_slice = -(-stages // min(c.split_k, stages))
    slices = -(-stages // per_slice)
    col_blocks, row_blocks = -(-cols // c.bm), -(-rows // c.bn)
    blocks = col_blocks * row_blocks * slices
    per_sm = max(1, blocks_per_sm(c, gpu))
    resident = min(per_sm, -(-blocks // gpu.sms))
    waves = -(-blocks // (gpu.sms * per_sm))
    tensor, copy = stage_cycles(c, gpu, min(gpu.sms, blocks))
    round_cycles = max(resident * max(tensor, copy),
                       COPY_LATENCY_CYCLES / max(1, c.stages - 2))
    cycles = waves * (per_slice * round_cycles + FILL_CYCLES)
    compute_ms = cycles / (CLOCK_GHZ * 1e6)
    weight = cols * depth // 2 * ELEMENT_BYTES + cols * (depth // STAGE_K + 1) * META_BYTES_PER_ROW
    a_reads = 1 + (col_blocks - 1) * max(0.0, 1.0 - gpu.l2_mb * 1e6 / max(1, rows * depth * 2))
    dram = weight + a_reads * rows * depth * ELEMENT_BYTES + rows * cols * ELEMENT_BYTES
    dram_ms = dram / (BANDWIDTH_SHARE * gpu.dram_gbs * 1e6)
    sums_ms = (2 * 4 * slices * rows * cols / (SPLIT_SUMS_GBS * 1e6) + SPLIT_LATENCY_US / 1e3
               if slices > 1 else 0.0)
    return Estimate(max(compute_ms, dram_ms) + sums_ms + LAUNCH_US / 1e3, waves)


def estimate_ms(config: SptcConfig, gpu: GpuSpec, shape: Shape) -> float:
    return estimate(config, gpu, *shape).time_ms


def rank_table(configs: Sequence[SptcConfig], gpu: GpuSpec) -> RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name)."""
    return RankTable(list(configs), gpu, feasible, estimate)
