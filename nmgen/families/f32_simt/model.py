"""The analytic model (docs/design.md §3): what a configuration needs and how fast it should run.

Feasibility per GPU (shared memory, registers, threads), block arithmetic intensity,
occupancy, wave quantization and a roofline time. The tuner uses it to drop infeasible
configurations before compiling anything, to rank the rest and to seed its search; the
dispatcher uses it when no tuned record exists. Every measured result stores the
model's estimate beside it, so that its error stays visible.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...gpus import REGISTERS_PER_SM, SMEM_PER_SM, GpuSpec
from ...problem import ALayout
from ...shapes import Shape
from ..base import Ranked
from .config import MAX_REGISTERS, ATile, KernelConfig
from .copy_plan import copy_chunk_rows, pipelined

MAX_BLOCKS_PER_SM = 32
# Calibration against the core benchmark on an H100 (results/core_h100/bench_core.json):
# the share of issue slots the best kernels fill, and the fixed cost of one main-loop
# stage (barrier, pipeline turn-around) in cycles.
STALL_FACTOR = 0.70
# Row-major A transposed inside the kernel (landing "tk" and staged "tr" tiles) waits on
# its transposing loads and stores: their best kernels were 12-19 % slower than the best
# on K-major A in the core benchmark (results/core_h100/bench_core.json, 4096^3),
# beyond what their extra instructions explain.
IN_KERNEL_TRANSPOSE_FACTOR = 0.88
STAGE_OVERHEAD_CYCLES = 1200
OCCUPANCY_FLOOR = 0.75  # occupancy_efficiency
FULL_OCCUPANCY_WARPS = 8
# Row-major A read M-major in the inner loop ("tm": scalar A reads) waits on them beyond
# their issue cost: with this factor the model orders the best tm and tx kernels of 201 of
# the 207 row-major H100 problems in tuned_db/ as measured (181 without;
# docs/engineering-notes.md §8).
M_MAJOR_FACTOR = 0.9
# Sliced K: after the main loop each slice but one passes the tile through shared memory
# behind a barrier, taken to cost about a stage's fixed overhead (not yet calibrated).
SLICE_REDUCE_CYCLES = STAGE_OVERHEAD_CYCLES
# Stream-K: a block's pieces that start or end inside a tile cost a pipeline fill each and
# the partial sum's trip through L2 (store, flag, load): taken as a few stages' overhead
# (not yet calibrated).
STREAM_K_FIXUP_CYCLES = 4 * STAGE_OVERHEAD_CYCLES
# ... and its kernel runs a tile 2-7 % slower than the data-parallel one of the same tiles,
# even one block a tile (docs/engineering-notes.md §7: 4224x4096x4096 on 128x256 tiles, H100).
STREAM_K_FACTOR = 0.95
# A single-stage block waits for every stage's copy with nothing of its own to overlap it;
# the other blocks on its SM hide that wait in part: EXPOSED_COPY_CYCLES / (blocks an SM)
# a stage. Fitted on the sliced-K A/B of docs/engineering-notes.md §7 (H100, K-major,
# M <= 1024), where it orders 257 of its 401 kernel pairs as measured (187 without) and
# picks the measured best in 33 of 48 problems (21 without), and on the 800 problems of
# tuned_db/ (tools/model_order_check.py): 0.788 of their measured pairs in order and a
# median regret of the model's pick of 1.031, against 0.763 and 1.072 when only a block
# alone on its SM paid 2000 cycles (0.807 and 1.023 with the split-K reduction's own time
# below; docs/engineering-notes.md §8).
EXPOSED_COPY_CYCLES = 4000
# Instruction counts read off the SASS of the main loop (sm_90): per compressed row the
# index read and addressing; per stage the copies, the transposition and the loop/barrier.
ROW_ADDRESSING = 1.5
COPY16_INSTRUCTIONS = 4  # cp.async of 16 bytes with its address and predicate
COPY4_INSTRUCTIONS = 6  # cp.async of 4 bytes: gathered row, bounds checks
TRANSPOSE_CHUNK_INSTRUCTIONS = 6  # LDS.128, 4 STS, address
STAGE_FIXED_INSTRUCTIONS = 40
CLOCK_GHZ = 1.9
# A copied A tile ("tx"): the transpose kernel reads M×K and writes K×M at this share of
# DRAM bandwidth, and its launch adds a gap before the main kernel.
COPY_BANDWIDTH_SHARE = 0.8
COPY_LAUNCH_US = 2.0
# Where the launcher pipelines that copy in chunks (nmgen.copy_plan), the first chunk's
# copy is exposed in full and the rest cost this share of theirs: at 4096^3, four chunks,
# the pipelined launch's time over K-major A was 0.52-0.66 of one copy's
# (docs/engineering-notes.md §6), a rest share of 0.35-0.54.
PIPELINED_COPY_REST = 0.4
# Unaligned A copies: a main kernel that copies the caller's K-major A by cp.async moves
# 16 bytes a copy only where the rows are 16-byte aligned (taken as M % 4 == 0); otherwise
# one float a cp.async (load_a_km_unaligned), as does the cp.async twin a "tma" kernel
# runs instead. A "tx" copy's rows are padded to a multiple of 4 and always take 16-byte
# copies. Its compute efficiency takes this factor, fitted where "tx" copies still took
# the one-float path (results/untuned_h100/, H100, 40-trial tunes of 192 row-major
# problems): within a problem, the cp.async kernels' measured / estimated time over the
# "tma" ones' was 1.78 at M = 333 and 1.74 at M = 777, against 1.46 at M = 100 and 1.01 at
# M = 1024 (1.21 and 1.06 interpolated in log M): 1.48 and 1.64 too slow; this factor
# (0.59 at M = 333, 0.54 at 777) removes that.
UNALIGNED_A_COPY_FACTOR = 0.56
# Reserved by the driver per resident block (CUDA occupancy calculator).
SMEM_RESERVED_PER_BLOCK = 1024


# ------------------------------------------------------------------------ resources
def smem_blocks_per_sm(config: KernelConfig, smem_per_sm: int | None = None) -> int:
    per_sm = smem_per_sm or SMEM_PER_SM[config.arch.number]
    return per_sm // (config.smem_bytes + SMEM_RESERVED_PER_BLOCK)


def min_blocks_per_sm(config: KernelConfig) -> int:
    """The ``__launch_bounds__`` occupancy hint: as many resident blocks as the register
    estimate and shared memory allow (at most 4), so that ptxas budgets registers for it."""
    regs = config.registers_estimate
    best = 1
    for blocks in (2, 3, 4):
        fits_regs = REGISTERS_PER_SM // (config.threads * blocks) >= regs
        if fits_regs and blocks <= smem_blocks_per_sm(config):
            best = blocks
    return best


def register_budget(config: KernelConfig) -> int:
    """Registers a thread may use under the launch bounds ``min_blocks_per_sm`` sets."""
    return min(MAX_REGISTERS, REGISTERS_PER_SM // (config.threads * min_blocks_per_sm(config)))


def blocks_per_sm(config: KernelConfig, gpu: GpuSpec) -> int:
    by_regs = REGISTERS_PER_SM // (config.threads * config.registers_estimate)
    by_threads = gpu.max_threads_per_sm // config.threads
    return min(by_regs, by_threads, smem_blocks_per_sm(config, gpu.smem_per_sm),
               MAX_BLOCKS_PER_SM)


def feasible(config: KernelConfig, gpu: GpuSpec) -> str | None:
    """``None`` when ``config`` can run on ``gpu``; otherwise the reason."""
    if config.arch.number > gpu.arch.number:
        return f"{config.arch.value} code cannot run on {gpu.name} ({gpu.arch.value})"
    if config.smem_bytes > gpu.arch.max_smem_per_block:
        return f"shared memory {config.smem_bytes} B > {gpu.arch.max_smem_per_block} B"
    if blocks_per_sm(config, gpu) < 1:
        return "not one block fits an SM (registers, threads or shared memory)"
    return None


# ------------------------------------------------------------------------ estimates
@dataclass(frozen=True)
class Estimate:
    time_ms: float
    compute_ms: float
    memory_ms: float
    arithmetic_intensity: float  # flops per byte moved into shared memory, per block
    blocks: int
    blocks_per_sm: int
    wave_efficiency: float
    issue_efficiency: float  # FFMA share of the inner loop's instructions

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ms >= self.memory_ms else "memory"


def _a_rows_fraction(config: KernelConfig) -> float:
    """Expected share of a stage's dense rows that packing loads (random kept rows)."""
    if not config.packing:
        return 1.0
    keep = config.n / config.m
    expected = 1.0 - (1.0 - keep) ** config.block_groups
    return min(1.0, expected, config.a_rows / config.ks)


def _row_instructions(config: KernelConfig) -> tuple[float, float]:
    """(FFMAs, other instructions) of one compressed row in the inner loop, per thread;
    shared-memory replays (bank conflicts) counted as extra instructions."""
    ffma = config.mt * config.nt
    # A warp whose columns span several groups of L reads several A rows at once.
    groups_per_warp = max(1.0, config.warp_n * config.nt / config.vec)
    if config.a_tile is ATile.M_MAJOR:  # scalar reads; 8 lanes of rows hit 8 banks
        a_loads = config.mt * max(1.0, config.warp_m / 8) * groups_per_warp
    else:  # float4 reads of contiguous rows
        a_loads = config.mt / 4 * groups_per_warp
    b_loads = config.nt / 4 * max(1.0, config.warp_n * config.nt / 32)
    return ffma, a_loads * config.thread_groups + b_loads + ROW_ADDRESSING


def _stage_copy_instructions(config: KernelConfig) -> float:
    """Instructions per thread that copy one stage into shared memory: 16-byte copies
    along a contiguous dimension, 4-byte ones for packed (gathered) rows, and for a
    landing tile the transposition (one 16-byte read and four stores a chunk). With the
    bulk copy engine (``tma``) one thread issues a stage's copies: the fixed part only."""
    if config.tma:
        return STAGE_FIXED_INSTRUCTIONS
    a_cells = config.a_rows * config.ms / config.threads
    per_cell = COPY4_INSTRUCTIONS if config.packing else COPY16_INSTRUCTIONS / 4
    a_cost = a_cells * per_cell
    if config.transposed:
        a_cost += a_cells / 4 * TRANSPOSE_CHUNK_INSTRUCTIONS
    b_cost = config.ws * config.ns / 4 / config.threads * COPY16_INSTRUCTIONS
    return a_cost + b_cost + STAGE_FIXED_INSTRUCTIONS


def issue_efficiency(config: KernelConfig) -> float:
    """FFMAs over all instructions of one main-loop stage (inner loop and copies), per
    thread: a thread of a sliced-K block computes ``ws / slice_k`` rows of the stage."""
    ffma, other = _row_instructions(config)
    rows = config.ws // config.slice_k
    stage_ffma = ffma * rows
    return stage_ffma / (stage_ffma + other * rows + _stage_copy_instructions(config))


def block_intensity(config: KernelConfig) -> float:
    flops = 2 * config.ms * config.ns * config.ws
    a_rows = config.ks * _a_rows_fraction(config)
    moved = 4 * (config.ms * a_rows + config.ws * config.ns) + 4 * config.pos_words
    return flops / moved


def occupancy_efficiency(warps: float) -> float:
    """Latency hiding: fewer than FULL_OCCUPANCY_WARPS resident warps an SM cannot keep the
    FP32 pipes busy; that many with a 16x8 thread tile's ILP do as well as more (core
    benchmark). Linear from OCCUPANCY_FLOOR at no warps."""
    return min(1.0, OCCUPANCY_FLOOR + (1.0 - OCCUPANCY_FLOOR) * warps / FULL_OCCUPANCY_WARPS)


@dataclass(frozen=True)
class _Fixed:
    """What the estimate needs of a configuration on a GPU that no shape changes."""

    infeasible: str | None
    per_sm: int
    efficiency: float  # issue efficiency x occupancy x stalls
    issue_efficiency: float
    a_rows_fraction: float
    intensity: float


@functools.lru_cache(maxsize=1 << 16)
def _fixed(config: KernelConfig, gpu: GpuSpec) -> _Fixed:
    """Cached: a search ranks the same few thousand configurations for every shape."""
    per_sm = max(blocks_per_sm(config, gpu), 1)
    warps = per_sm * config.threads / 32
    occupancy_eff = occupancy_efficiency(warps)
    issue = issue_efficiency(config)
    stalls = STALL_FACTOR * (IN_KERNEL_TRANSPOSE_FACTOR if config.transposed else 1.0)
    stalls *= STREAM_K_FACTOR if config.stream_k else 1.0
    stalls *= M_MAJOR_FACTOR if config.a_tile is ATile.M_MAJOR else 1.0
    return _Fixed(feasible(config, gpu), per_sm, issue * occupancy_eff * stalls, issue,
                  _a_rows_fraction(config), block_intensity(config))


@dataclass(frozen=True)
class _Columns:
    """What the estimate reads of many configurations on one GPU: a numpy array a field,
    so that ranking a space of tens of thousands costs a few array operations (the tuner
    ranks one for every study, on the tuning worker's critical path)."""

    ms: np.ndarray
    ns: np.ndarray
    ks: np.ndarray
    n: np.ndarray
    m: np.ndarray
    split_k: np.ndarray
    slice_k: np.ndarray
    stages: np.ndarray
    per_sm: np.ndarray
    stream_k: np.ndarray  # bool
    a_copied: np.ndarray  # bool: the transpose kernel runs first ("tx")
    km_cp_async: np.ndarray  # bool: K-major A by cp.async (4-byte copies at M % 4 != 0)
    efficiency: np.ndarray
    a_rows_fraction: np.ndarray
    a_copy_eff: np.ndarray


def km_cp_async(config: KernelConfig) -> bool:
    """Whether the main kernel copies the caller's K-major A by cp.async, 4 bytes a copy
    where M % 4 != 0 (UNALIGNED_A_COPY_FACTOR): a ``tma`` kernel too, which runs its
    cp.async twin where the rows are not 16 bytes apart (taken here as lda = M)."""
    return config.kernel_a_layout is ALayout.K_MAJOR and not config.a_copied


def _columns(configs: Sequence[KernelConfig], gpu: GpuSpec) -> _Columns:
    pairs = [(c, _fixed(c, gpu)) for c in configs]
    ints = np.array([(c.ms, c.ns, c.ks, c.n, c.m, c.split_k, c.slice_k, c.stages, f.per_sm,
                      c.stream_k, c.a_copied, km_cp_async(c)) for c, f in pairs],
                    dtype=np.int64).reshape(-1, 12)
    # Row-major A transposed by 4-byte copies moves a quarter of the bytes per L1 access.
    floats = np.array([(f.efficiency, f.a_rows_fraction,
                        0.25 if c.kernel_a_layout is ALayout.ROW_MAJOR and c.packing else 1.0)
                       for c, f in pairs], dtype=np.float64).reshape(-1, 3)
    return _Columns(*ints[:, :9].T, *ints[:, 9:].T.astype(bool), *floats.T)


def _ceil_div(a, b):
    return -(-a // b)


def _extra_kernel_ms(gpu: GpuSpec, moved_bytes):
    """A memory-bound kernel launched beside the main one (the transpose of "tx", the
    split-K reduction): its bytes at COPY_BANDWIDTH_SHARE of DRAM bandwidth, and a launch."""
    return moved_bytes / (gpu.dram_gbs * 1e9 * COPY_BANDWIDTH_SHARE) * 1e3 + COPY_LAUNCH_US / 1e3


def _copy_share(c: _Columns, gpu: GpuSpec, m_rows: int, col_blocks, k: int):
    """The share of a copied A tile's copy time that a launch exposes: 1, or where the
    launcher pipelines it (data-parallel, unsplit), its first chunk and
    PIPELINED_COPY_REST of the rest."""
    rows = copy_chunk_rows(k, c.ms, col_blocks, gpu.sms * c.per_sm)
    piped = c.a_copied & (c.split_k == 1) & ~c.stream_k & pipelined(m_rows, rows)
    first = np.where(piped, np.minimum(rows / m_rows, 1.0), 1.0)
    return first + PIPELINED_COPY_REST * (1.0 - first)


def _predict(c: _Columns, gpu: GpuSpec, m_rows: int, n_cols: int, k: int) -> dict:
    """The roofline estimate of every configuration in ``c`` (arrays)."""
    row_blocks, col_blocks = _ceil_div(m_rows, c.ms), _ceil_div(n_cols, c.ns)
    blocks = row_blocks * col_blocks * c.split_k
    waves = blocks / (gpu.sms * c.per_sm)
    wave_eff = waves / np.ceil(waves)
    k_pad = _ceil_div(k, c.ks) * c.ks
    stages = k_pad / c.ks / c.split_k
    w_rows = k_pad * c.n // c.m
    flops = 2.0 * row_blocks * c.ms * col_blocks * c.ns * w_rows
    efficiency = np.where(c.km_cp_async & (m_rows % 4 != 0),
                          c.efficiency * UNALIGNED_A_COPY_FACTOR, c.efficiency)
    compute_ms = flops / (gpu.peak_fp32_tflops * 1e12 * efficiency) * 1e3
    a_bytes = 4.0 * m_rows * k_pad * c.a_rows_fraction
    b_bytes = 4.0 * w_rows * col_blocks * c.ns
    c_bytes = 4.0 * m_rows * n_cols * c.split_k
    compulsory = a_bytes + b_bytes + c_bytes
    through_l2 = a_bytes * col_blocks / c.a_copy_eff + b_bytes * row_blocks + c_bytes
    memory_ms = np.maximum(compulsory / (gpu.dram_gbs * 1e9),
                           through_l2 / (gpu.l2_gbs * 1e9)) * 1e3
    exposed = np.where(c.stages == 1, EXPOSED_COPY_CYCLES / c.per_sm, 0)
    stage_cycles = STAGE_OVERHEAD_CYCLES + exposed
    # Stream-K: every block gets the same share of all tiles' stages.
    block_stages = np.ceil(waves * stages)
    fixup = np.where(np.fmod(block_stages, stages) != 0, STREAM_K_FIXUP_CYCLES, 0)
    wave_eff = np.where(c.stream_k, waves * stages / block_stages, wave_eff)
    overhead_cycles = np.where(
        c.stream_k, block_stages * stage_cycles + fixup,
        np.ceil(waves) * (stages * stage_cycles + (c.slice_k - 1) * SLICE_REDUCE_CYCLES))
    overhead_ms = overhead_cycles / (CLOCK_GHZ * 1e6)
    # The transpose kernel's time before the main kernel of a copied A tile ("tx"), less
    # where the launcher pipelines it.
    copy_a_ms = np.where(c.a_copied, _extra_kernel_ms(gpu, 4.0 * m_rows * k * 2)
                         * _copy_share(c, gpu, m_rows, col_blocks, k), 0.0)
    # Split-K: the main kernel writes its slices (c_bytes); the reduction kernel then reads
    # them and writes C, after it (in the max() with the main kernel's compute the model
    # had let it hide: docs/engineering-notes.md §8).
    reduce_ms = np.where(c.split_k > 1,
                         _extra_kernel_ms(gpu, 4.0 * m_rows * n_cols * (c.split_k + 1)), 0.0)
    time_ms = (np.maximum(compute_ms, memory_ms) / wave_eff + overhead_ms + copy_a_ms
               + reduce_ms)
    return {"time_ms": time_ms, "compute_ms": compute_ms, "memory_ms": memory_ms,
            "blocks": blocks, "wave_efficiency": wave_eff}


def estimate(config: KernelConfig, gpu: GpuSpec, m_rows: int, n_cols: int, k: int
             ) -> Estimate:
    """Roofline time of ``config`` on an ``m_rows×k · k×n_cols`` problem."""
    fixed = _fixed(config, gpu)
    p = _predict(_columns([config], gpu), gpu, m_rows, n_cols, k)
    return Estimate(float(p["time_ms"][0]), float(p["compute_ms"][0]),
                    float(p["memory_ms"][0]), fixed.intensity, int(p["blocks"][0]),
                    fixed.per_sm, float(p["wave_efficiency"][0]), fixed.issue_efficiency)


def estimate_ms(config: KernelConfig, gpu: GpuSpec, shape: Shape) -> float:
    """``estimate``'s time of ``config`` on ``shape`` (M, N, K)."""
    return estimate(config, gpu, *shape).time_ms


class RankTable:
    """The feasible configurations of ``configs`` on ``gpu``, ready to be ranked for any
    shape: the tuner ranks the same space for every study of a pattern."""

    def __init__(self, configs: Sequence[KernelConfig], gpu: GpuSpec):
        self.gpu = gpu
        self.configs = [c for c in configs if _fixed(c, gpu).infeasible is None]
        self._columns = _columns(self.configs, gpu)
        names = [c.name for c in self.configs]
        self._name_order = np.argsort(np.argsort(names, kind="stable"))  # ties by name

    def predicted_ms(self, m_rows: int, n_cols: int, k: int) -> np.ndarray:
        return _predict(self._columns, self.gpu, m_rows, n_cols, k)["time_ms"]

    def rank(self, m_rows: int, n_cols: int, k: int) -> Ranked:
        """By predicted time (ties by name: deterministic)."""
        times = self.predicted_ms(m_rows, n_cols, k)
        return Ranked(times, np.lexsort((self._name_order, times)), self.configs)


def rank_table(configs: Sequence[KernelConfig], gpu: GpuSpec) -> RankTable:
    """The feasible ones of ``configs`` ranked for any shape (ties by name)."""
    return RankTable(configs, gpu)


def rank(configs: Sequence[KernelConfig], gpu: GpuSpec, m_rows: int, n_cols: int, k: int
         ) -> Ranked:
    """Feasible configurations by predicted time (ties by name: deterministic)."""
    return RankTable(configs, gpu).rank(m_rows, n_cols, k)
