"""The decode family's model: the bytes it must move over the bandwidth it can draw, plus
a launch and, with split-K, the partial sums' traffic and the last block's sum. At small M
the weight's compressed values and indices are almost all of the traffic (docs/design.md §9); the
model charges the re-reads that several row blocks make (from L2 where the weight fits
there), the loads a thread keeps in flight, and the compute that grows with the rows of A
a block holds. Groups of rows loaded ahead (``prefetch``) add to the bytes in flight."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...gpus import GpuSpec
from ...shapes import Shape
from ..base import Ranked
from .config import GemvConfig

LAUNCH_US = 3.0  # a kernel's launch and tail on an H100
BANDWIDTH_SHARE = 0.9  # of the datasheet DRAM bandwidth a streaming kernel draws
# Bytes in flight an SM needs to draw its share of DRAM bandwidth (latency x bandwidth / SMs)
IN_FLIGHT_PER_SM = 32 * 1024
COMPUTE_SHARE = 0.5  # of FP32 peak the FMAs reach (a shared-memory read each)
# The share of the compute that the memory stream does not hide (issue slots the loads
# need too); it also keeps a block from holding rows of A the problem does not have.
COMPUTE_EXPOSED = 0.25
# FMAs an SM issues for each shared-memory load it can (128 FP32 lanes, 32 load lanes a
# clock). An index serves L columns: where L is below this, each column's FMA reads its own
# element of A, and the loads, not the FMAs, bound the compute (element-wise 2:4 at L = 1
# ran 1.9-3.9x this model's time without it on an H200, geomean by M = 1-64).
FMAS_PER_LOAD = 4
# A group of rows loaded ahead is in flight over the FMAs of the group before it: counted at
# this share of its bytes (the ring fills and drains at a slice's ends, and a thread's
# extra registers cost warps elsewhere in the model).
PREFETCH_SHARE = 0.5
SYNC_CYCLES = 300  # a barrier of the lanes' reduction, and the A slice's staging
CLOCK_GHZ = 1.9
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32


def blocks_per_sm(config: GemvConfig, gpu: GpuSpec, smem: int) -> int:
    by_threads = MAX_THREADS_PER_SM // config.threads
    by_smem = gpu.smem_per_sm // (smem + 1024)
    by_regs = 65536 // (config.threads * config.registers_estimate)
    return max(0, min(by_threads, by_smem, by_regs, MAX_BLOCKS_PER_SM))


def feasible(config: GemvConfig, gpu: GpuSpec) -> str | None:
    if config.arch.number > gpu.arch.number:
        return f"{config.arch.value} code cannot run on {gpu.name} ({gpu.arch.value})"
    if blocks_per_sm(config, gpu, config.smem_bytes(1)) < 1:
        return "not one block fits an SM"
    return None


def estimate_ms(config: GemvConfig, gpu: GpuSpec, shape: Shape) -> float:
    return float(_predict([config], gpu, *shape)[0])


def _predict(configs: Sequence[GemvConfig], gpu: GpuSpec, rows: int, cols: int, depth: int
             ) -> np.ndarray:
    c = _columns(tuple(configs))
    item = c["itemsize"]
    windows = np.ceil(depth / c["m"])
    per_slice, slices = _slicing(configs, depth)
    smem = 4 * (c["rows"] * per_slice * c["m"]
                + np.where(c["lanes"] > 1, c["rows"] * c["cols"] * c["col_threads"], 0))
    per_sm = np.array([max(1, blocks_per_sm(config, gpu, int(s)))
                       for config, s in zip(configs, smem, strict=True)], dtype=np.float64)
    w_rows = windows * c["n"]
    pad = np.maximum(c["vec"], c["cols"])
    n_padded = np.ceil(cols / pad) * pad
    col_blocks = np.ceil(cols / (c["col_threads"] * c["cols"]))
    row_blocks = np.ceil(rows / c["rows"])
    blocks = col_blocks * row_blocks * slices
    weight = w_rows * n_padded * item + w_rows * n_padded / c["vec"]
    repeats = np.where(weight < gpu.l2_mb * 2**20 / 2, 0.0, row_blocks - 1)  # else from L2
    partials = np.where(slices > 1, 2 * 4 * slices * rows * cols, 0)
    dram = weight * (1 + repeats) + rows * depth * item + rows * cols * item + partials
    through_l2 = weight * row_blocks + rows * depth * item * col_blocks + partials
    resident = np.minimum(blocks, gpu.sms * per_sm)
    rows_ahead = _rows_ahead(c, per_slice)
    in_flight = (resident * c["threads"] * (c["unroll"] + PREFETCH_SHARE * rows_ahead)
                 * c["cols"] * item / gpu.sms)
    share = BANDWIDTH_SHARE * np.minimum(1.0, in_flight / IN_FLIGHT_PER_SM)
    memory_ms = np.maximum(dram / (gpu.dram_gbs * 1e9 * share),
                           through_l2 / (gpu.l2_gbs * 1e9 * share)) * 1e3
    flops = 2.0 * row_blocks * c["rows"] * w_rows * n_padded
    gathered = np.maximum(1.0, FMAS_PER_LOAD / c["vec"])
    compute_ms = gathered * flops / (gpu.peak_fp32_tflops * 1e12 * COMPUTE_SHARE) * 1e3
    waves = np.ceil(blocks / (gpu.sms * per_sm))
    sync_ms = waves * (1 + 2 * (c["lanes"] - 1)) * SYNC_CYCLES / (CLOCK_GHZ * 1e6)
    # With several slices, each tile's last block adds them after the rest are done.
    tail_ms = np.where(slices > 1, 2 * SYNC_CYCLES / (CLOCK_GHZ * 1e6), 0.0)
    return (np.maximum(memory_ms, compute_ms)
            + COMPUTE_EXPOSED * np.minimum(memory_ms, compute_ms)
            + sync_ms + LAUNCH_US / 1e3 + tail_ms)


def _rows_ahead(c: dict[str, np.ndarray], per_slice: np.ndarray) -> np.ndarray:
    """Rows a thread has loaded ahead of its current group: ``prefetch`` groups, as far as
    its lane's rows of a slice reach."""
    rows_of_lane = np.ceil(per_slice / c["lanes"]) * c["n"]
    return np.minimum(c["prefetch"] * c["unroll"], np.maximum(0.0, rows_of_lane - c["unroll"]))


def _slicing(configs: Sequence[GemvConfig], depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(windows a slice, slices) of each configuration (the launch plan's rule)."""
    from .launch import slicing

    pairs = np.array([slicing(config, depth) for config in configs], dtype=np.float64)
    return pairs[:, 0], pairs[:, 1]


@functools.lru_cache(maxsize=256)
def _columns(configs: tuple[GemvConfig, ...]) -> dict[str, np.ndarray]:
    fields = ("n", "m", "vec", "rows", "col_threads", "lanes", "threads", "cols", "unroll",
              "prefetch")
    table = {f: np.array([getattr(c, f) for c in configs], dtype=np.float64) for f in fields}
    table["itemsize"] = np.array([c.dtype.itemsize for c in configs], dtype=np.float64)
    return table


def rank_table(configs: Sequence[GemvConfig], gpu: GpuSpec) -> RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name)."""
    return RankTable(list(configs), gpu)


@dataclass
class RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name)."""

    configs: list[GemvConfig]
    gpu: GpuSpec

    def __post_init__(self) -> None:
        self.configs = sorted((c for c in self.configs if feasible(c, self.gpu) is None),
                              key=lambda c: c.name)

    def rank(self, rows: int, cols: int, depth: int) -> Ranked:
        if not self.configs:
            return Ranked(np.empty(0), np.empty(0, dtype=np.int64), [])
        times = _predict(self.configs, self.gpu, rows, cols, depth)
        return Ranked(times, np.argsort(times, kind="stable"), self.configs)
