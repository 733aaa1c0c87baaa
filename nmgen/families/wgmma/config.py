"""``WgmmaConfig``: one instance of the Hopper ``wgmma`` template, validated, named after
every parameter and serialisable. Its rules are the family's resource rules.

A block computes a ``bm × bn`` tile of C from one column group over stages of ``bk``
compressed rows (``TensorCoreConfig``). Its ``warpgroups`` warpgroups (128 threads each)
split ``bm`` into ``64·tiles_m`` rows each and issue ``wgmma.mma_async m64n{bn}k16`` with
both operands in shared memory, in the 128-byte swizzled MN-major layout: ``bn`` is a
multiple of 64 (the swizzle atom is 64 16-bit columns wide), hence ``L >= 64``. The
kernel reads K-major A; row-major A (``_rm_``) is first copied K-major by the module's
transpose kernel (``a_copied``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from ...epilogue import NO_EPILOGUE, Epilogue
from ...format import DType
from ...gpus import Arch
from ...problem import ALayout
from ..tensor_core.config import ELEMENT_BYTES, TensorCoreConfig, name_pattern

FAMILY = "wgmma"
TARGET = "sm_90a"  # wgmma needs the arch-specific target
WARPGROUP = 128  # threads
ATOM_COLS = 64  # 16-bit columns of one 128-byte swizzle atom row
ATOM_ROW_BYTES = 128
BLOCK_NS = (64, 128, 256)
MAX_WARPGROUPS = 2
MAX_TILES_M = 2  # m64 tiles a warpgroup
MIN_STAGES, MAX_STAGES = 3, 6  # one stage is read by the wgmma in flight
ALIGN_SLACK = 1024  # the stages start at a 1024-byte boundary (the swizzle's period)
# Registers beside the accumulators: addresses, descriptors, loop state, the copies'
# indices (ptxas, sm_90a: see tests/test_wgmma.py's nvcc tests).
REGISTER_OVERHEAD = 64


@dataclass(frozen=True)
class WgmmaConfig(TensorCoreConfig):
    """e.g. ``nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90a``: warpgroups (``g2``),
    the arch-specific target (``sm90a``); an epilogue's tag last
    (``..._sm90a_bias_silu``)."""

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
    warp_fields: ClassVar[tuple[str, ...]] = ("warpgroups",)
    arch_suffix: ClassVar[str] = "a"
    name_re: ClassVar[re.Pattern[str]] = name_pattern(FAMILY, r"g(?P<warpgroups>\d+)", "a")
    name_example: ClassVar[str] = "nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90a"

    # ----------------------------------------------------------------- derived sizes
    @property
    def threads(self) -> int:
        return WARPGROUP * self.warpgroups

    @property
    def a_copied(self) -> bool:
        """Row-major A: the transpose kernel writes a K-major copy that the kernel reads."""
        return self.a_layout is ALayout.ROW_MAJOR

    @property
    def a_stage_depth(self) -> int:
        """Elements of each of its ``bm`` rows of A a block reads a stage: the gathered
        rows, as the kernel reads K-major A (row-major A's copy too)."""
        return self.bk

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
    def _target_rules(self) -> Iterator[tuple[str, bool]]:
        yield ("arch sm_90 (compiled for sm_90a: wgmma)", self.arch is Arch.SM90)
        yield (f"bn in {BLOCK_NS} and L % bn == 0 (a block shares one index set)",
               self.bn in BLOCK_NS and self.vec % self.bn == 0)

    def _block_rules(self) -> Iterator[tuple[str, bool]]:
        yield (f"1 <= warpgroups <= {MAX_WARPGROUPS}", self.warpgroups <= MAX_WARPGROUPS)
        yield (f"bm = 64 * tiles_m * warpgroups, tiles_m <= {MAX_TILES_M}",
               self.bm % (64 * self.warpgroups) == 0 and 1 <= self.tiles_m <= MAX_TILES_M)
        yield (f"{MIN_STAGES} <= stages <= {MAX_STAGES}",
               MIN_STAGES <= self.stages <= MAX_STAGES)

    # ----------------------------------------------------------------- naming
    @property
    def warps_tag(self) -> str:
        return f"g{self.warpgroups}"
