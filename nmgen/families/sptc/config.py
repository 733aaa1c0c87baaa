"""``SptcConfig``: one instance of the sparse-tensor-core template, validated, named after
every parameter and serialisable. Its rules are the family's resource rules.

The weight is the sparse operand of ``wgmma.mma_async.sp`` (2:4 along K, 2-bit metadata a
kept element): a block computes ``Cᵀ`` for ``bm`` output columns (the MMA's M: rows of the
weight ``Bᵀ``) by ``bn`` rows of A (the MMA's N: tokens), over stages of ``STAGE_K`` dense
K (``STAGE_K / 2`` kept values a weight row). ``warpgroups`` warpgroups issue the MMAs,
``tiles_m = bm / (64·warpgroups)`` m64 tiles each; one more warpgroup's first thread issues
every stage's bulk copies (the weight's values and metadata, A's rows). ``split_k`` slices
of K run in blocks of their own and are summed by the last block of each tile.
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

FAMILY = "sptc"
TARGET = "sm_90a"  # wgmma.mma_async.sp needs the arch-specific target
DTYPES = frozenset({DType.BF16, DType.F16})
WARPGROUP = 128  # threads
ELEMENT_BYTES = 2
ROW_BYTES = 128  # one 128-byte swizzled row
BLOCK_MS = (64, 128, 256)  # output columns a block (the MMA's M)
BLOCK_NS = (8, 16, 32, 64, 128, 256)  # rows of A a block (the MMA's N)
MAX_WARPGROUPS = 2
MAX_TILES_M = 2
MIN_STAGES, MAX_STAGES = 2, 8
MAX_SPLIT_K = 16
ALIGN_SLACK = 1024  # the stages start at a 1024-byte boundary (the swizzle's period)
BARRIER_BYTES = 8
MAX_REGISTERS = 255
REGISTER_GRANULE = 8
# An MMA thread's registers beside its accumulators (descriptors, the metadata of a stage,
# barrier addresses, loop and epilogue state); a producer thread's after setmaxnreg.dec.
CONSUMER_OVERHEAD = 40
PRODUCER_REGISTERS = 40
MIN_SETMAXNREG, MAX_SETMAXNREG = 24, 256
# ptxas compiles a wgmma of N columns only where the launch register count holds its
# N/2 accumulators and about this many more (as for the dense wgmma family).
WGMMA_OPERAND_REGISTERS = 26

NAME_RE = re.compile(
    r"^nm_sptc_(?P<dtype>bf16|f16)_n(?P<n>\d+)m(?P<m>\d+)l(?P<vec>\d+)"
    r"_b(?P<bm>\d+)x(?P<bn>\d+)x128_g(?P<warpgroups>\d+)_s(?P<stages>\d+)_k(?P<split_k>\d+)"
    r"_(?P<layout>rm|km)_sm(?P<arch>\d+)a$")
NAME_EXAMPLE = "nm_sptc_bf16_n2m4l1_b128x128x128_g2_s4_k1_rm_sm90a"


def granules(registers: int) -> int:
    """``registers`` rounded up to the allocation granule."""
    return -(-registers // REGISTER_GRANULE) * REGISTER_GRANULE


@dataclass(frozen=True)
class SptcConfig(ConfigRecord):
    """e.g. ``nm_sptc_bf16_n2m4l1_b128x128x128_g2_s4_k1_rm_sm90a``: ``bm`` output columns
    by ``bn`` rows of A by 128 of K a stage, ``g`` MMA warpgroups, ``s`` stages, ``k``
    slices of K, A's layout, the arch-specific target; an epilogue's tag last."""

    n: int
    m: int
    vec: int  # L (the weight's; the kernel reads each column's own kept elements)
    bm: int  # output columns a block (MMA M): 64 * tiles_m * warpgroups
    bn: int  # rows of A a block (MMA N)
    warpgroups: int  # MMA warpgroups
    stages: int  # bulk-copy pipeline depth
    split_k: int = 1  # slices of K, summed by each tile's last block
    a_layout: ALayout = ALayout.ROW_MAJOR
    arch: Arch = Arch.SM90
    dtype: DType = DType.BF16
    epilogue: Epilogue = NO_EPILOGUE  # bias and activation on the output (not tuned)
    family: ClassVar[str] = FAMILY
    enum_fields: ClassVar[dict[str, type[Enum]]] = {"a_layout": ALayout, "arch": Arch,
                                                     "dtype": DType}

    # ----------------------------------------------------------------- derived sizes
    @property
    def tiles_m(self) -> int:
        """m64 tiles a warpgroup holds."""
        return self.bm // (64 * self.warpgroups)

    @property
    def threads(self) -> int:
        """The MMA warpgroups and the producer warpgroup."""
        return WARPGROUP * (self.warpgroups + 1)

    @property
    def accumulators(self) -> int:
        """FP32 accumulators an MMA thread: bn/2 an m64 tile."""
        return self.tiles_m * self.bn // 2

    @property
    def registers_estimate(self) -> int:
        return self.accumulators + CONSUMER_OVERHEAD + 4 * self.tiles_m

    @property
    def a_tile_bytes(self) -> int:
        """The weight's kept values a stage: bm rows of 128 bytes."""
        return self.bm * ROW_BYTES

    @property
    def b_tile_bytes(self) -> int:
        """A's rows a stage: two 128-byte swizzle columns of bn rows (128 of K)."""
        return 2 * self.bn * ROW_BYTES

    @property
    def meta_tile_bytes(self) -> int:
        """The weight's metadata a stage: 16 bytes a weight row."""
        return self.bm * META_BYTES_PER_ROW

    @property
    def stage_bytes(self) -> int:
        return self.a_tile_bytes + self.b_tile_bytes + self.meta_tile_bytes

    @functools.cached_property
    def smem_bytes(self) -> int:
        """The stages, the full and empty barriers a stage, the aligning slack."""
        return self.stages * self.stage_bytes + 2 * self.stages * BARRIER_BYTES + ALIGN_SLACK

    def launch_registers(self, blocks: int) -> int:
        """Registers a thread at launch with ``blocks`` blocks an SM (granules, <= 255)."""
        share = REGISTERS_PER_SM // (blocks * self.threads)
        return min(MAX_REGISTERS, share // REGISTER_GRANULE * REGISTER_GRANULE)

    def register_split(self, blocks: int) -> tuple[int, int, int] | None:
        """(launch, producer after ``setmaxnreg.dec``, MMA threads after ``setmaxnreg.inc``)
        where the MMA threads need more than launch gives, else ``None``."""
        launch = self.launch_registers(blocks)
        need = granules(self.registers_estimate)
        if launch >= need:
            return None
        consumer = (launch + (launch - PRODUCER_REGISTERS) // self.warpgroups) \
            // REGISTER_GRANULE * REGISTER_GRANULE
        return launch, PRODUCER_REGISTERS, min(MAX_SETMAXNREG, consumer)

    def fits_registers(self, blocks: int) -> bool:
        block = WARPGROUP * (PRODUCER_REGISTERS
                             + self.warpgroups * granules(self.registers_estimate))
        if blocks * block > REGISTERS_PER_SM:
            return False
        split = self.register_split(blocks)
        if split is None:
            return True
        launch, _, consumer = split
        return (consumer >= granules(self.registers_estimate)
                and launch >= self.bn // 2 + WGMMA_OPERAND_REGISTERS)

    def blocks_by_registers(self) -> int:
        """Blocks an SM the registers allow (0 where not one fits)."""
        return next((b for b in range(8, 0, -1) if self.fits_registers(b)), 0)

    # ----------------------------------------------------------------- rules
    def _rules(self) -> Iterator[tuple[str, bool]]:
        sizes = ("n", "m", "vec", "bm", "bn", "warpgroups", "stages", "split_k")
        if not all(getattr(self, size) >= 1 for size in sizes):
            yield "all sizes >= 1", False
            return
        yield ("1 <= n <= m", self.n <= self.m)
        yield (f"m <= {MAX_M}", self.m <= MAX_M)
        yield ("kept elements fit 2:4 (at most 2 in an aligned group of four along K) on "
               "some weight: n/m <= 1/2", 2 * self.n <= self.m)
        yield ("dtype bf16 or f16 (tensor-core operands)", self.dtype in DTYPES)
        yield ("arch sm_90 (compiled for sm_90a: wgmma.mma_async.sp)", self.arch is Arch.SM90)
        yield (f"bm in {BLOCK_MS} (at most the layout's N_PAD, {N_PAD})",
               self.bm in BLOCK_MS and self.bm <= N_PAD)
        yield (f"bn in {BLOCK_NS}", self.bn in BLOCK_NS)
        yield (f"1 <= warpgroups <= {MAX_WARPGROUPS}", self.warpgroups <= MAX_WARPGROUPS)
        yield (f"bm = 64 * tiles_m * warpgroups, tiles_m <= {MAX_TILES_M}",
               self.bm % (64 * self.warpgroups) == 0 and 1 <= self.tiles_m <= MAX_TILES_M)
        yield (f"{MIN_STAGES} <= stages <= {MAX_STAGES}",
               MIN_STAGES <= self.stages <= MAX_STAGES)
        yield (f"split_k <= {MAX_SPLIT_K}", self.split_k <= MAX_SPLIT_K)
        yield (f"registers (~{self.registers_estimate}) <= {MAX_REGISTERS}",
               self.registers_estimate <= MAX_REGISTERS)
        yield ("block registers fit the SM's (after setmaxnreg)", self.fits_registers(1))
        yield (f"shared memory {self.smem_bytes} B <= {self.arch.max_smem_per_block} B "
               f"({self.arch.value} limit per block)",
               self.smem_bytes <= self.arch.max_smem_per_block)

    # ----------------------------------------------------------------- naming
    @functools.cached_property
    def name(self) -> str:
        return (f"nm_{FAMILY}_{self.dtype.value}_n{self.n}m{self.m}l{self.vec}"
                f"_b{self.bm}x{self.bn}x{STAGE_K}_g{self.warpgroups}_s{self.stages}"
                f"_k{self.split_k}_{self.a_layout.value}_{self.arch.value.replace('_', '')}a"
                f"{self.epilogue.suffix}")

    @classmethod
    def from_name(cls, name: str) -> Self:
        base, epilogue = Epilogue.split_name(name)
        match = NAME_RE.match(base)
        if not match:
            raise ConfigError(f"{name!r} is not a {FAMILY} kernel name (e.g. {NAME_EXAMPLE})")
        g = match.groupdict()
        sizes = {k: int(g[k]) for k in ("n", "m", "vec", "bm", "bn", "warpgroups", "stages",
                                        "split_k")}
        return cls(**sizes, a_layout=ALayout(g["layout"]), arch=Arch(f"sm_{g['arch']}"),
                   dtype=DType(g["dtype"]), epilogue=epilogue)
