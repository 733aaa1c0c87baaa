"""The decode family's model: the bytes it must move over the bandwidth it can draw, plus a
launch and, with split-K, the reduction. At small M the weight's compressed values and
indices are almost all of the traffic (DESIGN §9); the model charges the re-reads that
several row blocks make (from L2 where the weight fits there), the loads a thread keeps in
flight, and the compute that grows with the rows of A a block holds."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...gpus import GpuSpec
from ...shapes import Shape
from .config import GemvConfig

LAUNCH_US = 3.0  # a kernel's launch and tail on an H100
BANDWIDTH_SHARE = 0.9  # of the datasheet DRAM bandwidth a streaming kernel draws
# Bytes in flight an SM needs to draw its share of DRAM bandwidth (latency x bandwidth / SMs)
IN_FLIGHT_PER_SM = 32 * 1024
COMPUTE_SHARE = 0.5  # of FP32 peak the FMAs reach (a shared-memory read each)
# The share of the compute that the memory stream does not hide (issue slots the loads
# need too); it also keeps a block from holding rows of A the problem does not have.
COMPUTE_EXPOSED = 0.25
CHUNK_CYCLES = 400  # a chunk's two barriers and the A tile's copy
CLOCK_GHZ = 1.9
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32


@functools.lru_cache(maxsize=1 << 15)
def blocks_per_sm(config: GemvConfig, gpu: GpuSpec) -> int:
    by_threads = MAX_THREADS_PER_SM // config.threads
    by_smem = gpu.smem_per_sm // (config.smem_bytes + 1024)
    registers = config.rows * config.cols + config.unroll * (config.cols + 2) + 32
    by_regs = 65536 // (config.threads * max(registers, 32))
    return max(0, min(by_threads, by_smem, by_regs, MAX_BLOCKS_PER_SM))


def feasible(config: GemvConfig, gpu: GpuSpec) -> str | None:
    if config.arch.number > gpu.arch.number:
        return f"{config.arch.value} code cannot run on {gpu.name} ({gpu.arch.value})"
    if blocks_per_sm(config, gpu) < 1:
        return "not one block fits an SM"
    return None


def estimate_ms(config: GemvConfig, gpu: GpuSpec, shape: Shape) -> float:
    return float(_predict([config], gpu, *shape)[0])


def _predict(configs: Sequence[GemvConfig], gpu: GpuSpec, rows: int, cols: int, depth: int
             ) -> np.ndarray:
    c = _columns(tuple(configs), gpu)
    item = c["itemsize"]
    chunks = np.ceil(depth / c["kc"])
    w_rows = chunks * c["kc"] / c["m"] * c["n"]
    pad = np.maximum(c["vec"], c["cols"])
    n_padded = np.ceil(cols / pad) * pad
    col_blocks = np.ceil(cols / (c["threads"] * c["cols"]))
    row_blocks = np.ceil(rows / c["rows"])
    blocks = col_blocks * row_blocks * c["split_k"]
    weight = w_rows * n_padded * item + w_rows * n_padded / c["vec"]
    repeats = np.where(weight < gpu.l2_mb * 2**20 / 2, 0.0, row_blocks - 1)  # else from L2
    dram = weight * (1 + repeats) + rows * depth * item + rows * cols * item
    through_l2 = weight * row_blocks + rows * depth * item * col_blocks
    resident = np.minimum(blocks, gpu.sms * c["per_sm"])
    in_flight = resident * c["threads"] * c["unroll"] * c["cols"] * item / gpu.sms
    share = BANDWIDTH_SHARE * np.minimum(1.0, in_flight / IN_FLIGHT_PER_SM)
    memory_ms = np.maximum(dram / (gpu.dram_gbs * 1e9 * share),
                           through_l2 / (gpu.l2_gbs * 1e9 * share)) * 1e3
    flops = 2.0 * row_blocks * c["rows"] * w_rows * n_padded
    compute_ms = flops / (gpu.peak_fp32_tflops * 1e12 * COMPUTE_SHARE) * 1e3
    waves = np.ceil(blocks / (gpu.sms * c["per_sm"]))
    chunk_ms = waves * np.ceil(chunks / c["split_k"]) * CHUNK_CYCLES / (CLOCK_GHZ * 1e6)
    reduce_ms = np.where(c["split_k"] > 1, (rows * cols * (4 * c["split_k"] + item))
                         / (gpu.dram_gbs * 1e9 * BANDWIDTH_SHARE) * 1e3 + LAUNCH_US / 1e3,
                         0.0)
    return (np.maximum(memory_ms, compute_ms) + COMPUTE_EXPOSED * np.minimum(memory_ms,
                                                                              compute_ms)
            + chunk_ms + LAUNCH_US / 1e3 + reduce_ms)


@functools.lru_cache(maxsize=256)
def _columns(configs: tuple[GemvConfig, ...], gpu: GpuSpec) -> dict[str, np.ndarray]:
    fields = ("n", "m", "vec", "rows", "threads", "cols", "kc", "unroll", "split_k")
    table = {f: np.array([getattr(c, f) for c in configs], dtype=np.float64) for f in fields}
    table["itemsize"] = np.array([c.dtype.itemsize for c in configs], dtype=np.float64)
    table["per_sm"] = np.array([max(1, blocks_per_sm(c, gpu)) for c in configs],
                               dtype=np.float64)
    return table


@dataclass
class RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name)."""

    configs: list[GemvConfig]
    gpu: GpuSpec

    def __post_init__(self) -> None:
        self.configs = sorted((c for c in self.configs if feasible(c, self.gpu) is None),
                              key=lambda c: c.name)

    def rank(self, rows: int, cols: int, depth: int) -> list[tuple[float, GemvConfig]]:
        if not self.configs:
            return []
        times = _predict(self.configs, self.gpu, rows, cols, depth)
        order = np.argsort(times, kind="stable")
        return [(float(times[i]), self.configs[i]) for i in order.tolist()]
