"""What the tensor-core families' models share: the SM a block's resident copies share
(``blocks_per_sm``, ``refusal``), a pipelined stage's time from its MMA and shared-memory
cycles (``pipelined``), a shape's time from the stage time, the waves and the bytes from
DRAM and L2 that the tiling implies (``estimate``), and the ranking (``RankTable``).

- Memory: A once from DRAM (and once a column block from L2: the dense window for
  row-major A, the kept rows for K-major), the compressed values once (and once a row
  block from L2), the index table, C written once; the transpose kernel's copy of
  row-major A before, where the kernel reads one.
- A stage's copies take ``COPY_LATENCY_CYCLES`` to land; the stages in flight ahead of
  the one computed (the family says how many) hide it, or the rest waits.
- An SM's resident blocks share its throughput (``StageTime.cycles`` a block's stage), but
  none takes a stage in less than its own latency (``StageTime.latency``, where the family
  states one): an SM with few blocks waits on their dependent steps.

A family supplies the MMA cycles (its instruction's peak and how occupancy limits it),
the shared-memory traffic and the per-stage overhead of its pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ...gpus import GpuSpec
from ..base import Ranked
from .config import TensorCoreConfig
from .prepare import stage_count

CLOCK_GHZ = 1.755
SMEM_BYTES_PER_CYCLE = 128
PIPELINE_FILL_CYCLES = 1500  # the first stages' copies, exposed once a block
COPY_LATENCY_CYCLES = 1000
BANDWIDTH_SHARE = 0.85
LAUNCH_US = 3.0
MAX_BLOCKS_PER_SM = 32
SMEM_RESERVED_PER_BLOCK = 1024


class StageTime(NamedTuple):
    """A block's pipeline on its SM."""

    cycles: float  # a stage of a block, on an SM shared by its resident blocks
    fill_cycles: float  # once a block
    per_sm: int  # resident blocks an SM
    latency: float = 0.0  # a stage of one block, however few share its SM


def blocks_per_sm(config: TensorCoreConfig, gpu: GpuSpec) -> int:
    by_regs = config.blocks_by_registers()
    by_threads = gpu.max_threads_per_sm // config.threads
    by_smem = gpu.smem_per_sm // (config.smem_bytes + SMEM_RESERVED_PER_BLOCK)
    return max(0, min(by_regs, by_threads, by_smem, MAX_BLOCKS_PER_SM))


def refusal(config: TensorCoreConfig, gpu: GpuSpec) -> str | None:
    """Why no block of ``config`` fits an SM of ``gpu``, else ``None``."""
    if config.smem_bytes > gpu.arch.max_smem_per_block:
        return f"shared memory {config.smem_bytes} B > {gpu.arch.max_smem_per_block} B"
    if blocks_per_sm(config, gpu) < 1:
        return "not one block fits an SM (registers, threads or shared memory)"
    return None


def mma_cycles(config: TensorCoreConfig, gpu: GpuSpec, tensor_tflops: float) -> float:
    """Cycles of one SM's tensor cores, at ``tensor_tflops`` a GPU, for one stage of a
    block."""
    flops = 2.0 * config.bm * config.bn * config.bk
    per_cycle = tensor_tflops * 1e12 / (gpu.sms * CLOCK_GHZ * 1e9)
    return flops / per_cycle


def pipelined(mma: float, smem_bytes: float, overhead: float, ahead: int, per_sm: int
              ) -> StageTime:
    """A stage of ``mma`` tensor-core cycles and ``smem_bytes`` of shared-memory traffic
    with ``overhead`` cycles of its own, ``ahead`` stages in flight ahead of it and
    ``per_sm`` resident blocks."""
    smem = smem_bytes / SMEM_BYTES_PER_CYCLE
    stage = max(mma, smem) + overhead / per_sm
    in_flight = ahead * stage * per_sm
    waiting = max(0.0, COPY_LATENCY_CYCLES - in_flight) / per_sm
    return StageTime(stage + waiting, PIPELINE_FILL_CYCLES, per_sm)


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


def estimate(config: TensorCoreConfig, gpu: GpuSpec, stage: StageTime, rows: int, cols: int,
             depth: int) -> Estimate:
    """The time of ``rows × depth`` by the ``depth × cols`` weight: the waves of blocks
    against the bytes from DRAM and through L2."""
    c = config
    stages = stage_count(c, depth)
    row_blocks = -(-rows // c.bm)
    cols_p = -(-cols // c.vec) * c.vec
    col_blocks = -(-cols_p // c.bn)
    blocks = row_blocks * col_blocks
    waves = -(-blocks // (gpu.sms * stage.per_sm))
    # A wave's blocks share their SM: per_sm of them take per_sm times a block's stages,
    # and no fewer cycles than one block's latency.
    busy = min(stage.per_sm, -(-blocks // gpu.sms))
    stage_cycles = max(busy * stage.cycles, stage.latency)
    compute_cycles = waves * (stages * stage_cycles + stage.fill_cycles)
    compute_ms = compute_cycles / (CLOCK_GHZ * 1e6)
    w_rows = stages * c.bk
    values = 2.0 * w_rows * cols_p + 4.0 * w_rows * (cols_p // c.vec)
    dram = 2.0 * rows * depth + values + 2.0 * rows * cols
    a_depth = stages * c.a_stage_depth
    through_l2 = col_blocks * 2.0 * row_blocks * c.bm * a_depth + row_blocks * values
    memory_ms = max(dram / (gpu.dram_gbs * 1e9 * BANDWIDTH_SHARE),
                    through_l2 / (gpu.l2_gbs * 1e9 * BANDWIDTH_SHARE)) * 1e3
    time_ms = (max(compute_ms, memory_ms) + 0.25 * min(compute_ms, memory_ms)
               + LAUNCH_US / 1e3)
    if c.a_copied:  # the transpose kernel first
        copy_ms = transpose_ms(gpu, rows, depth)
        time_ms, memory_ms = time_ms + copy_ms, memory_ms + copy_ms
    return Estimate(time_ms, compute_ms, memory_ms, blocks, stage.per_sm)


def transpose_ms(gpu: GpuSpec, rows: int, depth: int) -> float:
    """The transpose kernel of row-major A before the kernel (``a_copied``): A read and
    its K-major copy (rows padded to 8 elements) written once from and to DRAM, and its
    launch."""
    moved = 2.0 * depth * (rows + -(-rows // 8) * 8)
    return moved / (gpu.dram_gbs * 1e9 * BANDWIDTH_SHARE) * 1e3 + LAUNCH_US / 1e3


@dataclass
class RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name), by a family's
    ``feasible`` and ``estimate``."""

    configs: list[Any]
    gpu: GpuSpec
    feasible: Callable[[Any, GpuSpec], str | None]
    estimate: Callable[[Any, GpuSpec, int, int, int], Estimate]

    def __post_init__(self) -> None:
        self.configs = sorted((c for c in self.configs if self.feasible(c, self.gpu) is None),
                              key=lambda c: c.name)

    def rank(self, rows: int, cols: int, depth: int) -> Ranked:
        times = np.array([self.estimate(c, self.gpu, rows, cols, depth).time_ms
                          for c in self.configs], dtype=np.float64)
        return Ranked(times, np.argsort(times, kind="stable"), self.configs)

