"""``GemvConfig``: one instance of the decode template (small M, memory-bound), validated,
named after every parameter and serialisable. Its rules are the family's resource rules."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from ...epilogue import NO_EPILOGUE, Epilogue
from ...format import MAX_M, DType
from ...gpus import REGISTERS_PER_SM, Arch
from ...problem import ALayout
from ..space import ConfigError, ConfigRecord

FAMILY = "gemv"
MAX_THREADS = 1024
MAX_ACCUMULATORS = 128  # ROWS x COLS FP32 sums a thread
MAX_REGISTERS = 255
LOAD_BYTES = (2, 4, 8, 16)  # what one load of COLS elements may be
MAX_PREFETCH = 2  # groups of UNROLL rows a thread may load ahead of its FMAs

# Parameters that came after the first tuned kernels, with the default that reproduces them.
LATER_PARAMETERS: dict[str, Any] = {"prefetch": 0, "wide_sum": 0}
# The last block's sum of the slices with ``wide_sum``: BATCH of a thread's outputs at a
# time, CHUNK slices of each loaded at once (a multiple of 4: the sums' order is kept).
SUM_LOADS = 16  # loads a thread of the last block keeps in flight
MAX_SUM_BATCH = 4


@dataclass(frozen=True)
class GemvConfig(ConfigRecord):
    n: int
    m: int
    vec: int  # L
    rows: int  # rows of A a block holds
    col_threads: int  # threads of a block along N
    lanes: int  # threads of a block along K (each takes every lanes-th window)
    cols: int  # consecutive columns a thread streams (one load)
    unroll: int  # compressed rows whose loads a thread issues together
    split_k: int = 1  # slices of K (blocks along K) the launch aims at; fixed-order sums
    prefetch: int = 0  # groups of UNROLL rows whose loads a thread holds ahead of its FMAs
    wide_sum: int = 0  # 1: the last block loads many slices' partial sums at once
    a_layout: ALayout = ALayout.ROW_MAJOR
    arch: Arch = Arch.SM90
    dtype: DType = DType.F32
    epilogue: Epilogue = NO_EPILOGUE  # bias and activation on the output (not tuned)
    family: ClassVar[str] = FAMILY
    later_parameters: ClassVar[dict[str, Any]] = LATER_PARAMETERS
    enum_fields: ClassVar[dict[str, type[Enum]]] = {"a_layout": ALayout, "arch": Arch,
                                                     "dtype": DType}

    @property
    def threads(self) -> int:
        return self.col_threads * self.lanes

    @property
    def groups(self) -> int:
        """Indices a thread reads a compressed row."""
        return max(1, self.cols // self.vec)

    @property
    def sum_elements(self) -> int:
        """Outputs of a tile each thread of the last block adds the slices of."""
        return -(-self.rows * self.col_threads * self.cols // self.threads)

    @property
    def sum_batch(self) -> int:
        """With ``wide_sum``: outputs whose slices a thread loads together."""
        return min(self.sum_elements, MAX_SUM_BATCH)

    @property
    def sum_chunk(self) -> int:
        """With ``wide_sum``: slices of each output loaded at once (a multiple of 4)."""
        return max(4, SUM_LOADS // self.sum_batch // 4 * 4)

    @property
    def registers_estimate(self) -> int:
        """Registers a thread: the sums, the loads in flight with their indices, and
        addressing (ptxas used 32-168 on sampled configurations without prefetch); with
        prefetch, each group ahead (as loaded: 32-bit words, and the A offsets) and the A
        values that ptxas reads early for it (ROWS an index)."""
        words = -(-self.load_bytes // 4)
        ahead = self.prefetch * (self.unroll * (words + self.groups) + self.rows * self.groups)
        main = self.rows * self.cols + self.unroll * (self.cols + self.groups) + ahead
        wide = self.sum_batch * (2 * self.sum_chunk + 6) if self.wide_sum else 0
        return max(main, wide) + 40

    def smem_bytes(self, windows_per_slice: int) -> int:
        """Shared memory of a block whose slice is ``windows_per_slice`` windows: its A
        slice, then the lanes' sums."""
        sums = self.rows * self.cols * self.col_threads if self.lanes > 1 else 0
        return 4 * (self.rows * windows_per_slice * self.m + sums)

    @property
    def load_bytes(self) -> int:
        return self.cols * self.dtype.itemsize

    @property
    def columns(self) -> int:
        """Columns of C a block holds."""
        return self.col_threads * self.cols

    def _rules(self) -> Iterator[tuple[str, bool]]:
        yield ("all sizes >= 1", min(self.n, self.m, self.vec, self.rows, self.col_threads,
                                     self.lanes, self.cols, self.unroll, self.split_k) >= 1)
        yield ("1 <= n <= m", self.n <= self.m)
        yield (f"0 <= prefetch <= {MAX_PREFETCH}", 0 <= self.prefetch <= MAX_PREFETCH)
        yield ("wide_sum 0 or 1", self.wide_sum in (0, 1))
        yield (f"m <= {MAX_M}", self.m <= MAX_M)
        yield ("COLS % L == 0 or L % COLS == 0 (a thread's columns share whole indices)",
               self.cols % self.vec == 0 or self.vec % self.cols == 0)
        yield (f"COLS * itemsize in {LOAD_BYTES} bytes (one load)",
               self.load_bytes in LOAD_BYTES)
        yield (f"threads (col_threads * lanes) a multiple of 32, at most {MAX_THREADS}",
               self.threads % 32 == 0 and self.threads <= MAX_THREADS)
        yield (f"ROWS * COLS <= {MAX_ACCUMULATORS} accumulators",
               self.rows * self.cols <= MAX_ACCUMULATORS)
        yield (f"registers ~{self.registers_estimate} <= {MAX_REGISTERS} a thread (no spills)",
               self.registers_estimate <= MAX_REGISTERS)
        yield (f"threads * registers ({self.threads} * ~{self.registers_estimate}) <= "
               f"{REGISTERS_PER_SM} (one block an SM, no spills)",
               self.threads * self.registers_estimate <= REGISTERS_PER_SM)
        yield (f"shared memory of a one-window slice {self.smem_bytes(1)} B <= "
               f"{self.arch.max_smem_per_block} B",
               self.smem_bytes(1) <= self.arch.max_smem_per_block)

    @property
    def name(self) -> str:
        """e.g. ``nm_gemv_bf16_n8m32l128_r4_t64x4_c8_u4_k16_rm_sm90``: ROWS, COL_THREADS x
        LANES, COLS, UNROLL and the slices of K aimed at; a prefetch after the unroll
        (``..._u4_p2_k16_...``), the wide sum after the slices (``..._k16_wsum_...``); an
        epilogue's tag last (``..._sm90_bias_silu``)."""
        prefetch = f"_p{self.prefetch}" if self.prefetch else ""
        wide = "_wsum" if self.wide_sum else ""
        return (f"nm_gemv_{self.dtype.value}_n{self.n}m{self.m}l{self.vec}_r{self.rows}"
                f"_t{self.col_threads}x{self.lanes}_c{self.cols}_u{self.unroll}{prefetch}"
                f"_k{self.split_k}{wide}_{self.a_layout.value}"
                f"_{self.arch.value.replace('_', '')}{self.epilogue.suffix}")

    @classmethod
    def from_name(cls, name: str) -> GemvConfig:
        base, epilogue = Epilogue.split_name(name)
        match = _NAME_RE.match(base)
        if not match:
            raise ConfigError(f"{name!r} is not a {FAMILY} kernel name (e.g. {_EXAMPLE})")
        g = match.groupdict()
        return cls(**{k: int(v) for k, v in g.items()
                      if k not in ("dtype", "layout", "arch", "wide_sum") and v is not None},
                   wide_sum=int(g["wide_sum"] is not None),
                   a_layout=ALayout(g["layout"]), arch=Arch(f"sm_{g['arch']}"),
                   dtype=DType(g["dtype"]), epilogue=epilogue)



_NAME_RE = re.compile(
    r"^nm_gemv_(?P<dtype>f32|bf16|f16)_n(?P<n>\d+)m(?P<m>\d+)l(?P<vec>\d+)_r(?P<rows>\d+)"
    r"_t(?P<col_threads>\d+)x(?P<lanes>\d+)_c(?P<cols>\d+)_u(?P<unroll>\d+)"
    r"(?:_p(?P<prefetch>[1-9]\d*))?"
    r"_k(?P<split_k>\d+)(?P<wide_sum>_wsum)?_(?P<layout>rm|km)_sm(?P<arch>\d+)$")
_EXAMPLE = "nm_gemv_bf16_n8m32l128_r4_t64x4_c8_u4_k16_rm_sm90"
