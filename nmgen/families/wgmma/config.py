"""``WgmmaConfig``: one instance of the Hopper ``wgmma`` template, validated, named after
every parameter and serialisable. Its rules are the family's resource rules.

A block computes a ``bm × bn`` tile of C from one column group (``L % bn == 0``: the block
shares one index set) over stages of ``windows`` windows, ``bk = windows·n`` compressed
rows a stage (whole ``k16`` steps). Its ``warpgroups`` warpgroups (128 threads each) split
``bm`` into ``64·tiles_m`` rows each and issue ``wgmma.mma_async m64n{bn}k16`` with both
operands in shared memory, in the 128-byte swizzled MN-major layout: ``bn`` is a multiple
of 64 (the swizzle atom is 64 16-bit columns wide), hence ``L >= 64``.
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

FAMILY = "wgmma"
DTYPES = frozenset({DType.BF16, DType.F16})
TARGET = "sm_90a"  # wgmma needs the arch-specific target
WARPGROUP = 128  # threads
ATOM_COLS = 64  # 16-bit columns of one 128-byte swizzle atom row
ATOM_ROW_BYTES = 128
BLOCK_NS = (64, 128, 256)
MAX_WARPGROUPS = 2
MAX_TILES_M = 2  # m64 tiles a warpgroup
MAX_ACCUMULATORS = 128  # FP32 accumulators a thread
MIN_STAGES, MAX_STAGES = 3, 6  # one stage is read by the wgmma in flight
MAX_STAGE_ROWS = 128  # compressed rows a stage (bk)
ELEMENT_BYTES = 2
ALIGN_SLACK = 1024  # the stages start at a 1024-byte boundary (the swizzle's period)
MAX_REGISTERS = 255
# Registers beside the accumulators: addresses, descriptors, loop state, the copies'
# indices (ptxas, sm_90a: see tests/test_wgmma.py's nvcc tests).
REGISTER_OVERHEAD = 64


@dataclass(frozen=True)
class WgmmaConfig(ConfigRecord):
    n: int
    m: int
    vec: int  # L
    bm: int  # block tile rows (M): 64 * tiles_m * warpgroups
    bn: int  # block tile columns (N): 64, 128 or 256 dividing L
    windows: int  # windows of m dense rows a main-loop stage
    warpgroups: int  # warpgroups along M
    stages: int  # cp.async pipeline depth
    a_layout: ALayout = ALayout.K_MAJOR
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
        """Dense rows of A a stage covers."""
        return self.windows * self.m

    @property
    def threads(self) -> int:
        return WARPGROUP * self.warpgroups

    @property
    def tiles_m(self) -> int:
        """m64 tiles a warpgroup holds."""
        return self.bm // (64 * self.warpgroups)

    @property
    def accumulators(self) -> int:
        """FP32 accumulators a thread: bn/2 an m64 tile."""
        return self.tiles_m * self.bn // 2

    @property
    def registers_estimate(self) -> int:
        return self.accumulators + REGISTER_OVERHEAD

    @property
    def a_tile_bytes(self) -> int:
        """The gathered A tile: bm/64 swizzle atoms of bk rows of 128 bytes."""
        return ELEMENT_BYTES * self.bk * self.bm

    @property
    def b_tile_bytes(self) -> int:
        """The B' tile: bn/64 swizzle atoms of bk rows of 128 bytes."""
        return ELEMENT_BYTES * self.bk * self.bn

    @property
    def stage_bytes(self) -> int:
        return self.a_tile_bytes + self.b_tile_bytes

    @functools.cached_property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the stages and the slack that aligns them."""
        return self.stages * self.stage_bytes + ALIGN_SLACK

    # ----------------------------------------------------------------- rules
    def _rules(self) -> Iterator[tuple[str, bool]]:
        if not all(v >= 1 for v in (self.n, self.m, self.vec, self.bm, self.bn, self.windows,
                                    self.warpgroups, self.stages)):
            yield "all sizes >= 1", False
            return
        yield ("1 <= n <= m", self.n <= self.m)
        yield (f"m <= {MAX_M}", self.m <= MAX_M)
        yield ("dtype bf16 or f16 (tensor-core operands)", self.dtype in DTYPES)
        yield ("arch sm_90 (compiled for sm_90a: wgmma)", self.arch is Arch.SM90)
        yield ("K-major A (row-major A is served by other families)",
               self.a_layout is ALayout.K_MAJOR)
        yield (f"bn in {BLOCK_NS} and L % bn == 0 (a block shares one index set)",
               self.bn in BLOCK_NS and self.vec % self.bn == 0)
        yield ("bk = windows * n a multiple of 16 (whole k16 steps)", self.bk % 16 == 0)
        yield (f"bk <= {MAX_STAGE_ROWS}", self.bk <= MAX_STAGE_ROWS)
        yield (f"1 <= warpgroups <= {MAX_WARPGROUPS}", self.warpgroups <= MAX_WARPGROUPS)
        yield (f"bm = 64 * tiles_m * warpgroups, tiles_m <= {MAX_TILES_M}",
               self.bm % (64 * self.warpgroups) == 0 and 1 <= self.tiles_m <= MAX_TILES_M)
        yield (f"{MIN_STAGES} <= stages <= {MAX_STAGES}",
               MIN_STAGES <= self.stages <= MAX_STAGES)
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
        """e.g. ``nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90a``: block tile bm x bn
        x bk (compressed rows a stage), warpgroups, stages; an epilogue's tag last
        (``..._sm90a_bias_silu``)."""
        return (f"nm_wgmma_{self.dtype.value}_n{self.n}m{self.m}l{self.vec}"
                f"_b{self.bm}x{self.bn}x{self.bk}_g{self.warpgroups}_s{self.stages}"
                f"_{self.a_layout.value}_{self.arch.value.replace('_', '')}a"
                f"{self.epilogue.suffix}")

    @classmethod
    def from_name(cls, name: str) -> WgmmaConfig:
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
                   int(g["warpgroups"]), int(g["stages"]), a_layout=ALayout(g["layout"]),
                   arch=Arch(f"sm_{g['arch']}"), dtype=DType(g["dtype"]), epilogue=epilogue)


_NAME_RE = re.compile(
    r"^nm_wgmma_(?P<dtype>bf16|f16)_n(?P<n>\d+)m(?P<m>\d+)l(?P<vec>\d+)"
    r"_b(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)_g(?P<warpgroups>\d+)"
    r"_s(?P<stages>\d+)_(?P<layout>rm|km)_sm(?P<arch>\d+)a$")
_EXAMPLE = "nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90a"
