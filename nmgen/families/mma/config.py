"""``MmaConfig``: one instance of the tensor-core template, validated, named after every
parameter and serialisable. Its rules are the family's resource rules.

A block computes a ``bm × bn`` tile of C from one column group (``L % bn == 0``: the block
shares one index set) over stages of ``windows`` windows, ``bk = windows·n`` compressed
rows a stage (whole ``k16`` steps of the MMA). Its ``warps_m × warps_n`` warps each hold a
``wm × wn`` tile of FP32 accumulators in ``m16n8`` fragments.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from ...epilogue import NO_EPILOGUE, Epilogue
from ...format import MAX_M, DType
from ...gpus import REGISTERS_PER_SM, Arch
from ...problem import ALayout
from ..space import ConfigError, ConfigRecord, coerce_enums, coerce_epilogue

FAMILY = "mma"
DTYPES = frozenset({DType.BF16, DType.F16})
MAX_THREADS = 512
MAX_REGISTERS = 255
MAX_ACCUMULATORS = 128  # FP32 accumulators a thread
MAX_STAGES = 5
MAX_STAGE_ROWS = 128  # compressed rows a stage (bk)
PAD = 8  # elements (16 bytes) past every shared-memory tile row: ldmatrix reads 8 rows
#          of 16 bytes from 8 different bank groups
ELEMENT_BYTES = 2
# Registers beside the accumulators and fragments: addresses, loop state, the copies'
# indices (ptxas, sm_90: see tests/test_mma.py's nvcc tests).
REGISTER_OVERHEAD = 56


@dataclass(frozen=True)
class MmaConfig(ConfigRecord):
    n: int
    m: int
    vec: int  # L
    bm: int  # block tile rows (M)
    bn: int  # block tile columns (N); L % bn == 0
    windows: int  # windows of m dense rows a main-loop stage
    warps_m: int  # warps along M ...
    warps_n: int  # ... and along N
    stages: int  # cp.async pipeline depth
    a_layout: ALayout = ALayout.ROW_MAJOR
    arch: Arch = Arch.SM90
    dtype: DType = DType.BF16
    epilogue: Epilogue = NO_EPILOGUE  # bias and activation on the output (not tuned)
    family: ClassVar[str] = FAMILY

    def __post_init__(self) -> None:
        coerce_enums(self, {"a_layout": ALayout, "arch": Arch, "dtype": DType})
        coerce_epilogue(self)
        for rule, ok in self._rules():
            if not ok:
                raise ConfigError(f"{self.name}: violates rule '{rule}'")

    # ----------------------------------------------------------------- derived sizes
    @property
    def bk(self) -> int:
        """Compressed rows of B' (and gathered rows of A) a stage."""
        return self.windows * self.n

    @property
    def bkd(self) -> int:
        """Dense columns of A a stage covers (the row-major window tile's width)."""
        return self.windows * self.m

    @property
    def row_major(self) -> bool:
        return self.a_layout is ALayout.ROW_MAJOR

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def wm(self) -> int:
        """Rows of C a warp holds."""
        return self.bm // self.warps_m

    @property
    def wn(self) -> int:
        """Columns of C a warp holds."""
        return self.bn // self.warps_n

    @property
    def accumulators(self) -> int:
        """FP32 accumulators a thread: (wm/16)·(wn/8) m16n8 tiles of 4."""
        return (self.wm // 16) * (self.wn // 8) * 4

    @property
    def registers_estimate(self) -> int:
        """Registers a thread: accumulators, one k16 step's A and B fragments, addressing."""
        fragments = (self.wm // 16) * 4 + (self.wn // 8) * 2
        return self.accumulators + fragments + REGISTER_OVERHEAD

    @property
    def b_tile_elems(self) -> int:
        """The stage's B' tile: bk rows of bn values (padded)."""
        return self.bk * (self.bn + PAD)

    @property
    def a_tile_elems(self) -> int:
        """The gathered A tile, K-major: bk rows of bm activations (padded)."""
        return self.bk * (self.bm + PAD)

    @property
    def dense_tile_elems(self) -> int:
        """Row-major A's window tile: bm rows of bkd activations (padded)."""
        return self.bm * (self.bkd + PAD)

    @property
    def stage_elems(self) -> int:
        """16-bit elements of one pipeline stage: the B' tile, then the gathered A tile
        (K-major A) or the dense window tile and the stage's index table (row-major A,
        bk int32 entries)."""
        a_part = self.dense_tile_elems + 2 * self.bk if self.row_major else self.a_tile_elems
        return self.b_tile_elems + a_part

    @functools.cached_property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the stages, and for row-major A the one gathered A tile
        the MMAs read."""
        gathered = self.a_tile_elems if self.row_major else 0
        return ELEMENT_BYTES * (self.stages * self.stage_elems + gathered)

    # ----------------------------------------------------------------- rules
    def _rules(self) -> Iterator[tuple[str, bool]]:
        if not all(v >= 1 for v in (self.n, self.m, self.vec, self.bm, self.bn, self.windows,
                                    self.warps_m, self.warps_n, self.stages)):
            yield "all sizes >= 1", False
            return
        yield ("1 <= n <= m", self.n <= self.m)
        yield (f"m <= {MAX_M}", self.m <= MAX_M)
        yield ("dtype bf16 or f16 (tensor-core operands)", self.dtype in DTYPES)
        yield ("sm_80 or newer (mma.sync m16n8k16, cp.async)", self.arch.number >= 80)
        yield ("bn % 8 == 0 and L % bn == 0 (a block shares one index set)",
               self.bn % 8 == 0 and self.vec % self.bn == 0)
        yield ("bk = windows * n a multiple of 16 (whole k16 steps)", self.bk % 16 == 0)
        yield (f"bk <= {MAX_STAGE_ROWS}", self.bk <= MAX_STAGE_ROWS)
        yield ("row-major A: windows * m % 8 == 0 (16-byte chunks of the window tile)",
               not self.row_major or self.bkd % 8 == 0)
        yield ("bm % (16 * warps_m) == 0 (m16 tiles a warp)", self.bm % (16 * self.warps_m) == 0)
        yield ("bn % (8 * warps_n) == 0 (n8 tiles a warp)", self.bn % (8 * self.warps_n) == 0)
        yield (f"threads (32 * warps_m * warps_n) <= {MAX_THREADS}",
               self.threads <= MAX_THREADS)
        yield (f"2 <= stages <= {MAX_STAGES}", 2 <= self.stages <= MAX_STAGES)
        yield (f"accumulators a thread <= {MAX_ACCUMULATORS}",
               self.accumulators <= MAX_ACCUMULATORS)
        yield (f"registers (~{self.registers_estimate}) <= {MAX_REGISTERS}",
               self.registers_estimate <= MAX_REGISTERS)
        yield (f"threads * registers ({self.threads} * ~{self.registers_estimate}) <= "
               f"{REGISTERS_PER_SM}", self.threads * self.registers_estimate <= REGISTERS_PER_SM)
        yield (f"shared memory {self.smem_bytes} B <= {self.arch.max_smem_per_block} B "
               f"({self.arch.value} limit per block)",
               self.smem_bytes <= self.arch.max_smem_per_block)

    # ----------------------------------------------------------------- naming
    @functools.cached_property
    def name(self) -> str:
        """e.g. ``nm_mma_bf16_n8m32l128_b128x128x32_w2x2_s3_rm_sm90``: block tile bm x bn x
        bk (compressed rows a stage), warps along M x N, stages; an epilogue's tag last
        (``..._sm90_bias_silu``)."""
        return (f"nm_mma_{self.dtype.value}_n{self.n}m{self.m}l{self.vec}"
                f"_b{self.bm}x{self.bn}x{self.bk}_w{self.warps_m}x{self.warps_n}"
                f"_s{self.stages}_{self.a_layout.value}_{self.arch.value.replace('_', '')}"
                f"{self.epilogue.suffix}")

    @classmethod
    def from_name(cls, name: str) -> MmaConfig:
        base, epilogue = Epilogue.split_name(name)
        match = _NAME_RE.match(base)
        if not match:
            raise ConfigError(f"{name!r} is not a {FAMILY} kernel name (e.g. {_EXAMPLE})")
        g = match.groupdict()
        n, bk = int(g["n"]), int(g["bk"])
        if bk % n:
            raise ConfigError(f"{name!r}: {bk} compressed rows a stage are not whole windows "
                              f"of n={n}")
        return cls(n, int(g["m"]), int(g["vec"]), int(g["bm"]), int(g["bn"]), bk // n,
                   int(g["warps_m"]), int(g["warps_n"]), int(g["stages"]),
                   a_layout=ALayout(g["layout"]), arch=Arch(f"sm_{g['arch']}"),
                   dtype=DType(g["dtype"]), epilogue=epilogue)


_NAME_RE = re.compile(
    r"^nm_mma_(?P<dtype>bf16|f16)_n(?P<n>\d+)m(?P<m>\d+)l(?P<vec>\d+)"
    r"_b(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)_w(?P<warps_m>\d+)x(?P<warps_n>\d+)"
    r"_s(?P<stages>\d+)_(?P<layout>rm|km)_sm(?P<arch>\d+)$")
_EXAMPLE = "nm_mma_bf16_n8m32l128_b128x128x32_w2x2_s3_rm_sm90"
