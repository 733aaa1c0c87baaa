"""What the tensor-core families' models share: the SM a block's resident copies share
(``blocks_per_sm``, ``refusal``), a shape's time from a family's stage time, the waves and
the bytes from DRAM (``estimate``), and the ranking (``RankTable``).

- A family's ``Pipeline`` says how many cycles an SM takes for one stage of each of the
  blocks resident on it (``round_cycles``); ``StageTime`` (mma's): one block's latency
  plus its throughput times the blocks sharing the SM. Full waves run ``per_sm`` blocks
  an SM; the last wave's blocks run as many an SM as it spreads to.
- DRAM: A once (the transpose kernel's copy where the kernel reads one), the compressed
  values and the index table once, C written once, at ``BANDWIDTH_SHARE`` of the
  bandwidth, added to the stages' time (the families' fits, results/untuned_h100/bf16/:
  added fits better than overlapped); traffic through L2 is the families' stage model.
- Row-major A that a kernel reads K-major: the transpose kernel's time before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from ...gpus import GpuSpec
from ..base import Ranked
from .config import TensorCoreConfig
from .prepare import stage_count

CLOCK_GHZ = 1.755
SMEM_BYTES_PER_CYCLE = 128
PIPELINE_FILL_CYCLES = 1500  # the first stages' copies, exposed once a wave
COPY_LATENCY_CYCLES = 1000  # a stage's copies from issue to landing (mma's floor)
BANDWIDTH_SHARE = 0.85
LAUNCH_US = 3.0
MAX_BLOCKS_PER_SM = 32
SMEM_RESERVED_PER_BLOCK = 1024


class Pipeline(Protocol):
    """A block's pipeline on its SM, as a family's model states it."""

    @property
    def per_sm(self) -> int:
        """Resident blocks an SM."""

    @property
    def fill_cycles(self) -> float:
        """Once a wave: the first stages' copies."""

    def round_cycles(self, blocks: int) -> float:
        """Cycles an SM takes for one stage of each of ``blocks`` resident blocks."""


class StageTime(NamedTuple):
    """A block's pipeline on its SM: a stage of ``blocks`` resident blocks takes one
    block's latency plus the SM's throughput for all of them (added: the H100 mma tunes
    of results/untuned_h100/bf16_refit/ fit this better than the larger of the two)."""

    cycles: float  # a stage of a block at the SM's throughput
    fill_cycles: float  # once a wave
    per_sm: int  # resident blocks an SM
    latency: float = 0.0  # a stage of one block's dependent steps, not overlapped

    def round_cycles(self, blocks: int) -> float:
        return self.latency + blocks * self.cycles


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


def estimate(config: TensorCoreConfig, gpu: GpuSpec, stage: Pipeline, rows: int, cols: int,
             depth: int) -> Estimate:
    """The time of ``rows × depth`` by the ``depth × cols`` weight: the waves of blocks'
    stages, then the bytes from DRAM."""
    c = config
    stages = stage_count(c, depth)
    cols_p = -(-cols // c.vec) * c.vec
    blocks = -(-rows // c.bm) * -(-cols_p // c.bn)
    compute_ms = wave_cycles(stage, gpu, blocks, stages) / (CLOCK_GHZ * 1e6)
    w_rows = stages * c.bk
    values = 2.0 * w_rows * cols_p + 4.0 * w_rows * (cols_p // c.vec)
    dram = 2.0 * rows * depth + values + 2.0 * rows * cols
    memory_ms = dram / (gpu.dram_gbs * 1e9 * BANDWIDTH_SHARE) * 1e3
    time_ms = compute_ms + memory_ms + LAUNCH_US / 1e3
    if c.a_copied:  # the transpose kernel first
        copy_ms = transpose_ms(gpu, rows, depth)
        time_ms, memory_ms = time_ms + copy_ms, memory_ms + copy_ms
    return Estimate(time_ms, compute_ms, memory_ms, blocks, stage.per_sm)


def wave_cycles(stage: Pipeline, gpu: GpuSpec, blocks: int, stages: int) -> float:
    """Cycles of ``blocks`` blocks of ``stages`` stages: whole waves of ``per_sm`` blocks
    an SM, then the rest spread over the SMs."""
    full, rest = divmod(blocks, gpu.sms * stage.per_sm)
    cycles = full * (stages * stage.round_cycles(stage.per_sm) + stage.fill_cycles)
    if rest:
        cycles += stages * stage.round_cycles(-(-rest // gpu.sms)) + stage.fill_cycles
    return cycles


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

