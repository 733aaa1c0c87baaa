"""``MmaSpConfig``: one instance of the ``mma.sp`` template, validated, named after every
parameter and serialisable. Its rules are the family's resource rules.

The weight is the sparse operand A of ``mma.sp`` m16n8k32 (2:4 along K, 2-bit metadata a
kept element), laid out as for the ``sptc`` family: a block computes ``Cᵀ`` for ``bm``
output columns (the MMA's M: rows of the weight ``Bᵀ``) by ``bn`` rows of A (the MMA's N:
tokens), over stages of ``STAGE_K`` dense K copied by ``cp.async`` into a ``stages``-deep
ring. ``warps_m × warps_n`` warps each hold ``bm / warps_m`` columns by ``bn / warps_n``
tokens of ``Cᵀ``. ``split_k`` slices of K run in blocks of their own and are summed by the
last block of each tile.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Self

from ...epilogue import NO_EPILOGUE, Epilogue
from ...format import MAX_M, DType
from ...gpus import REGISTERS_PER_SM, Arch
from ...problem import ALayout
from ..space import ConfigError, ConfigRecord
from ..sparse24.prepare import META_BYTES_PER_ROW, N_PAD, STAGE_K

FAMILY = "mmasp"
DTYPES = frozenset({DType.BF16, DType.F16})
WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 32  # m16n8k32: dense K, 16 kept a row
ELEMENT_BYTES = 2
W_ROW_BYTES = STAGE_K // 2 * ELEMENT_BYTES  # a weight row's kept values a stage: 128
X_ROW_BYTES = STAGE_K * ELEMENT_BYTES  # a row of A a stage: 256
BLOCK_MS = (64, 128, 256)  # output columns a block (whole m64 tiles of the metadata)
BLOCK_NS = (8, 16, 32, 64, 128)  # rows of A a block
WARPS = (1, 2, 4)  # along each of M and N
MAX_WARP_TILES_M = 4  # m16 tiles a warp
MAX_WARP_TILES_N = 8  # n8 tiles a warp
MIN_STAGES, MAX_STAGES = 2, 6
MAX_SPLIT_K = 16
MAX_ACCUMULATORS = 64  # ptxas spilled at 128 (b64x64, one warp: 254 registers)
MIN_THREADS = 64  # ptxas held one-warp blocks to 168 registers, and spilled
MAX_REGISTERS = 255
# A thread's registers beside its accumulators: the A fragments of its m16 tiles and the
# metadata of a stage (4 each), the B fragments of its n8 tiles (4 each), and the copies'
# addresses and loop state (ptxas, sm_80, 19 sampled configurations: 40-83 beside the
# fragments).
OVERHEAD_REGISTERS = 64

NAME_RE = re.compile(
    r"^nm_mmasp_(?P<dtype>bf16|f16)_n(?P<n>\d+)m(?P<m>\d+)l(?P<vec>\d+)"
    r"_b(?P<bm>\d+)x(?P<bn>\d+)x128_w(?P<warps_m>\d+)x(?P<warps_n>\d+)_s(?P<stages>\d+)"
    r"_k(?P<split_k>\d+)_(?P<layout>rm|km)_sm(?P<arch>\d+)$")
NAME_EXAMPLE = "nm_mmasp_bf16_n2m4l1_b128x64x128_w4x2_s4_k1_rm_sm80"
SIZES = ("n", "m", "vec", "bm", "bn", "warps_m", "warps_n", "stages", "split_k")


@dataclass(frozen=True)
class MmaSpConfig(ConfigRecord):
    """e.g. ``nm_mmasp_bf16_n2m4l1_b128x64x128_w4x2_s4_k1_rm_sm80``: ``bm`` output columns
    by ``bn`` rows of A by 128 of K a stage, ``w`` warps along M by along N, ``s`` stages,
    ``k`` slices of K, A's layout, the arch; an epilogue's tag last."""

    n: int
    m: int
    vec: int  # L (the weight's; the kernel reads each column's own kept elements)
    bm: int  # output columns a block (MMA M)
    bn: int  # rows of A a block (MMA N)
    warps_m: int
    warps_n: int
    stages: int  # cp.async pipeline depth
    split_k: int = 1  # slices of K, summed by each tile's last block
    a_layout: ALayout = ALayout.ROW_MAJOR
    arch: Arch = Arch.SM80
    dtype: DType = DType.BF16
    epilogue: Epilogue = NO_EPILOGUE  # bias and activation on the output (not tuned)
    family: ClassVar[str] = FAMILY
    enum_fields: ClassVar[dict[str, type[Enum]]] = {"a_layout": ALayout, "arch": Arch,
                                                     "dtype": DType}

    # ----------------------------------------------------------------- derived sizes
    @property
    def threads(self) -> int:
        return WARP * self.warps_m * self.warps_n

    @property
    def warp_tiles_m(self) -> int:
        """m16 tiles of ``Cᵀ`` a warp holds."""
        return self.bm // (MMA_M * self.warps_m)

    @property
    def warp_tiles_n(self) -> int:
        """n8 tiles of ``Cᵀ`` a warp holds."""
        return self.bn // (MMA_N * self.warps_n)

    @property
    def accumulators(self) -> int:
        return 4 * self.warp_tiles_m * self.warp_tiles_n

    @property
    def registers_estimate(self) -> int:
        return (self.accumulators + 8 * self.warp_tiles_m + 4 * self.warp_tiles_n
                + OVERHEAD_REGISTERS)

    @property
    def stage_bytes(self) -> int:
        """The weight's kept values, A's rows and the weight's metadata of a stage."""
        return self.bm * W_ROW_BYTES + self.bn * X_ROW_BYTES + self.bm * META_BYTES_PER_ROW

    @property
    def c_tile_bytes(self) -> int:
        """The output tile on its way out through shared memory: bn rows of bm + 8."""
        return self.bn * (self.bm + 8) * ELEMENT_BYTES

    @functools.cached_property
    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes

    def blocks_by_registers(self) -> int:
        """Blocks an SM the registers allow (0 where not one fits)."""
        per_thread = -(-self.registers_estimate // 8) * 8
        return REGISTERS_PER_SM // (per_thread * self.threads)

    # ----------------------------------------------------------------- rules
    def _rules(self) -> Iterator[tuple[str, bool]]:
        if not all(getattr(self, size) >= 1 for size in SIZES):
            yield "all sizes >= 1", False
            return
        yield ("1 <= n <= m", self.n <= self.m)
        yield (f"m <= {MAX_M}", self.m <= MAX_M)
        yield ("kept elements fit 2:4 (at most 2 in an aligned group of four along K) on "
               "some weight: n/m <= 1/2", 2 * self.n <= self.m)
        yield ("dtype bf16 or f16 (tensor-core operands)", self.dtype in DTYPES)
        yield (f"bm in {BLOCK_MS} (at most the layout's N_PAD, {N_PAD})",
               self.bm in BLOCK_MS and self.bm <= N_PAD)
        yield (f"bn in {BLOCK_NS}", self.bn in BLOCK_NS)
        yield (f"warps_m and warps_n in {WARPS}",
               self.warps_m in WARPS and self.warps_n in WARPS)
        yield (f"bm = 16 * warps_m * tiles, 1 <= tiles <= {MAX_WARP_TILES_M}",
               self.bm % (MMA_M * self.warps_m) == 0
               and 1 <= self.warp_tiles_m <= MAX_WARP_TILES_M)
        yield (f"bn = 8 * warps_n * tiles, 1 <= tiles <= {MAX_WARP_TILES_N}",
               self.bn % (MMA_N * self.warps_n) == 0
               and 1 <= self.warp_tiles_n <= MAX_WARP_TILES_N)
        yield (f"threads (32 * warps_m * warps_n) >= {MIN_THREADS}",
               self.threads >= MIN_THREADS)
        yield (f"accumulators {self.accumulators} <= {MAX_ACCUMULATORS} a thread",
               self.accumulators <= MAX_ACCUMULATORS)
        yield (f"{MIN_STAGES} <= stages <= {MAX_STAGES}",
               MIN_STAGES <= self.stages <= MAX_STAGES)
        yield (f"split_k <= {MAX_SPLIT_K}", self.split_k <= MAX_SPLIT_K)
        yield (f"registers (~{self.registers_estimate}) <= {MAX_REGISTERS}",
               self.registers_estimate <= MAX_REGISTERS)
        yield ("one block's registers fit the SM's", self.blocks_by_registers() >= 1)
        yield ("the output tile fits the stages' shared memory",
               self.c_tile_bytes <= self.smem_bytes)
        yield (f"shared memory {self.smem_bytes} B <= {self.arch.max_smem_per_block} B "
               f"({self.arch.value} limit per block)",
               self.smem_bytes <= self.arch.max_smem_per_block)

    # ----------------------------------------------------------------- naming
    @functools.cached_property
    def name(self) -> str:
        return (f"nm_{FAMILY}_{self.dtype.value}_n{self.n}m{self.m}l{self.vec}"
                f"_b{self.bm}x{self.bn}x{STAGE_K}_w{self.warps_m}x{self.warps_n}"
                f"_s{self.stages}_k{self.split_k}_{self.a_layout.value}"
                f"_{self.arch.value.replace('_', '')}{self.epilogue.suffix}")

    @classmethod
    def from_name(cls, name: str) -> Self:
        base, epilogue = Epilogue.split_name(name)
        match = NAME_RE.match(base)
        if not match:
            raise ConfigError(f"{name!r} is not a {FAMILY} kernel name (e.g. {NAME_EXAMPLE})")
        g = match.groupdict()
        return cls(**{k: int(g[k]) for k in SIZES}, a_layout=ALayout(g["layout"]),
                   arch=Arch(f"sm_{g['arch']}"), dtype=DType(g["dtype"]), epilogue=epilogue)
