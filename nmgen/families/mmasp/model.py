"""The ``mma.sp`` family's model: a block's stage at the larger of its tensor time and its
shared-memory traffic on its SM (shared by the blocks resident there), no shorter than the
stage's own path (its barriers, its warps' chain of MMAs, the copies that the stages ahead
do not hide), over the waves of the grid, beside the DRAM bytes.

- tensor: a stage's ``2·bm·bn·128`` dense-equivalent flops at ``SPARSE_EFFICIENCY`` of the
  GPU's sparse ``mma.sp`` rate (``SPARSE_TFLOPS``: datasheet BF16 with FP32 accumulation;
  on Hopper the ``mma`` family's measured ``mma.sync`` rate, doubled);
- shared memory: the stage's copies in, each warp's ldmatrix reads of its rows of the
  weight and of A, at ``SMEM_BYTES_PER_CYCLE``;
- DRAM: the compressed weight (values and metadata) once, A once a column block of the
  grid that L2 does not hold, C once, at ``BANDWIDTH_SHARE`` of the bandwidth;
- a block's fill (the first stages' copies) once a wave, the slices' sums, the launch.
The constants are datasheet-level guesses, not fits: no GPU has timed this family yet.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...gpus import GpuSpec
from ...shapes import Shape
from ..sparse24.prepare import META_BYTES_PER_ROW, STAGE_K
from ..tensor_core.model import Estimate, RankTable
from .config import ELEMENT_BYTES, W_ROW_BYTES, X_ROW_BYTES, MmaSpConfig

# Dense-equivalent TFLOP/s of mma.sp by GPU; others are taken as SPARSE_OVER_FP32 times
# their FP32 peak.
SPARSE_TFLOPS = {"a100": 624.0, "a10": 250.0, "rtx3090": 142.0, "l4": 242.0, "l40s": 733.0,
                 "rtx4090": 330.0, "h100": 1300.0, "h200": 1300.0}
SPARSE_OVER_FP32 = 19.4
SPARSE_EFFICIENCY = 0.8
CLOCK_GHZ = 1.755
SMEM_BYTES_PER_CYCLE = 128
STAGE_OVERHEAD_CYCLES = 450  # a stage's wait, barrier and first latencies
MMA_ISSUE_CYCLES = 16  # a warp's mma.sp after mma.sp
COPY_LATENCY_CYCLES = 1200  # a stage's cp.async from issue to landing (from L2 or DRAM)
FILL_CYCLES = 1500  # a block's first stages, once a wave
SPLIT_SUMS_GBS = 600.0
SPLIT_LATENCY_US = 1.5
BANDWIDTH_SHARE = 0.85
LAUNCH_US = 3.0
MAX_BLOCKS_PER_SM = 16
SMEM_RESERVED_PER_BLOCK = 1024


def sparse_tflops(gpu: GpuSpec) -> float:
    return SPARSE_TFLOPS.get(gpu.name, SPARSE_OVER_FP32 * gpu.peak_fp32_tflops)


def blocks_per_sm(config: MmaSpConfig, gpu: GpuSpec) -> int:
    by_smem = gpu.smem_per_sm // (config.smem_bytes + SMEM_RESERVED_PER_BLOCK)
    by_threads = gpu.max_threads_per_sm // config.threads
    return max(0, min(by_smem, by_threads, config.blocks_by_registers(), MAX_BLOCKS_PER_SM))


def feasible(config: MmaSpConfig, gpu: GpuSpec) -> str | None:
    if config.arch.number > gpu.arch.number:
        return f"{config.arch.value} code cannot run on {gpu.name} ({gpu.arch.value})"
    if config.smem_bytes > gpu.arch.max_smem_per_block:
        return f"shared memory {config.smem_bytes} B > {gpu.arch.max_smem_per_block} B"
    if blocks_per_sm(config, gpu) < 1:
        return "not one block fits an SM (registers, threads or shared memory)"
    return None


def stage_cycles(config: MmaSpConfig, gpu: GpuSpec) -> tuple[float, float, float]:
    """(tensor, shared-memory, own path) cycles of one stage of one block on its SM."""
    c = config
    flops_per_cycle = (SPARSE_EFFICIENCY * sparse_tflops(gpu) * 1e12
                       / (gpu.sms * CLOCK_GHZ * 1e9))
    tensor = 2.0 * c.bm * c.bn * STAGE_K / flops_per_cycle
    reads = c.warps_n * c.bm * W_ROW_BYTES + c.warps_m * c.bn * X_ROW_BYTES
    smem = (c.stage_bytes + reads) / SMEM_BYTES_PER_CYCLE
    mmas = 4 * c.warp_tiles_m * c.warp_tiles_n  # a warp's, a stage
    path = max(STAGE_OVERHEAD_CYCLES + mmas * MMA_ISSUE_CYCLES,
               COPY_LATENCY_CYCLES / max(1, c.stages - 1))
    return tensor, smem, path


def estimate(config: MmaSpConfig, gpu: GpuSpec, rows: int, cols: int, depth: int) -> Estimate:
    c = config
    stages = -(-depth // STAGE_K)
    per_slice = -(-stages // min(c.split_k, stages))
    slices = -(-stages // per_slice)
    col_blocks, row_blocks = -(-cols // c.bm), -(-rows // c.bn)
    blocks = col_blocks * row_blocks * slices
    per_sm = max(1, blocks_per_sm(c, gpu))
    resident = min(per_sm, -(-blocks // gpu.sms))
    waves = -(-blocks // (gpu.sms * per_sm))
    tensor, smem, path = stage_cycles(c, gpu)
    round_cycles = max(resident * max(tensor, smem), path)
    compute_ms = waves * (per_slice * round_cycles + FILL_CYCLES) / (CLOCK_GHZ * 1e6)
    weight = (cols * depth // 2 * ELEMENT_BYTES
              + cols * (depth // STAGE_K + 1) * META_BYTES_PER_ROW)
    a_bytes = rows * depth * ELEMENT_BYTES
    a_reads = 1 + (col_blocks - 1) * max(0.0, 1.0 - gpu.l2_mb * 1e6 / max(1, a_bytes))
    dram = weight + a_reads * a_bytes + rows * cols * ELEMENT_BYTES
    dram_ms = dram / (BANDWIDTH_SHARE * gpu.dram_gbs * 1e6)
    sums_ms = (2 * 4 * slices * rows * cols / (SPLIT_SUMS_GBS * 1e6) + SPLIT_LATENCY_US / 1e3
               if slices > 1 else 0.0)
    return Estimate(max(compute_ms, dram_ms) + sums_ms + LAUNCH_US / 1e3, compute_ms, dram_ms,
                    blocks, per_sm)


def estimate_ms(config: MmaSpConfig, gpu: GpuSpec, shape: Shape) -> float:
    return estimate(config, gpu, *shape).time_ms


def rank_table(configs: Sequence[MmaSpConfig], gpu: GpuSpec) -> RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name)."""
    return RankTable(list(configs), gpu, feasible, estimate)
