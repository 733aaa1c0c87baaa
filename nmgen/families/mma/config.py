"""``MmaConfig``: one instance of the tensor-core template, validated, named after every
parameter and serialisable. Its rules are the family's resource rules.

A block computes a ``bm × bn`` tile of C over stages of ``bk`` compressed rows
(``TensorCoreConfig``): inside one column group (``L % bn == 0``), or across ``bn / L``
whole groups (``bn % L == 0``), which share the stage's dense window of A (row-major A)
and each gather their own rows of it. Its ``warps_m × warps_n`` warps each hold a ``wm ×
wn`` tile of FP32 accumulators in ``m16n8`` fragments of ``mma.sync`` m16n8k16, inside one
group.

Row-major A is gathered in the kernel from its dense windows, or (``a_copy``, name tag
``_tx``) first copied K-major by the transpose kernel, which the kernel then reads as
K-major A: no gather instructions, at the price of one more read and write of A.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from ...epilogue import NO_EPILOGUE, Epilogue
from ...format import DType
from ...gpus import Arch
from ...problem import ALayout
from ..tensor_core.config import ELEMENT_BYTES, TensorCoreConfig, name_pattern

FAMILY = "mma"
MAX_THREADS = 512
MAX_STAGES = 5
PAD = 8  # elements (16 bytes) past every shared-memory tile row: ldmatrix reads 8 rows
#          of 16 bytes from 8 different bank groups
# Registers beside the accumulators and fragments: addresses, loop state, the copies'
# indices (ptxas, sm_90: see tests/test_mma.py's nvcc tests).
REGISTER_OVERHEAD = 56
# Parameters that came after the first tuned kernels, with the default that reproduces them.
LATER_PARAMETERS: dict[str, Any] = {"a_copy": False}
COPY_TAG = "_tx"  # the name's tag of a K-major copy of row-major A


@dataclass(frozen=True)
class MmaConfig(TensorCoreConfig):
    """e.g. ``nm_mma_bf16_n8m32l128_b128x128x32_w2x2_s3_rm_sm90``: warps along M x N
    (``w2x2``), ``_tx`` after the stages for row-major A's K-major copy
    (``..._w2x2_s3_tx_rm_sm90``); an epilogue's tag last (``..._sm90_bias_silu``)."""

    n: int
    m: int
    vec: int  # L
    bm: int  # block tile rows (M)
    bn: int  # block tile columns (N); L % bn == 0 or bn % L == 0
    windows: int  # windows of m dense rows a main-loop stage
    warps_m: int  # warps along M ...
    warps_n: int  # ... and along N
    stages: int  # cp.async pipeline depth
    a_layout: ALayout = ALayout.ROW_MAJOR
    arch: Arch = Arch.SM90
    dtype: DType = DType.BF16
    epilogue: Epilogue = NO_EPILOGUE  # bias and activation on the output (not tuned)
    a_copy: bool = False  # row-major A: read from the transpose kernel's K-major copy
    family: ClassVar[str] = FAMILY
    later_parameters: ClassVar[dict[str, Any]] = LATER_PARAMETERS
    warp_fields: ClassVar[tuple[str, ...]] = ("warps_m", "warps_n")
    name_re: ClassVar[re.Pattern[str]] = name_pattern(
        FAMILY, r"w(?P<warps_m>\d+)x(?P<warps_n>\d+)", tag=rf"(?P<tx>{COPY_TAG})?")
    name_example: ClassVar[str] = "nm_mma_bf16_n8m32l128_b128x128x32_w2x2_s3_rm_sm90"

    # ----------------------------------------------------------------- derived sizes
    @property
    def a_copied(self) -> bool:
        return self.a_copy

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
    def groups(self) -> int:
        """Column groups a block spans (each with its own gathered A tile)."""
        return max(1, self.bn // self.vec)

    @property
    def group_width(self) -> int:
        """Columns of one group inside the block."""
        return self.bn // self.groups

    @property
    def a_stage_depth(self) -> int:
        """Elements of each of its ``bm`` rows of A a block reads a stage: the dense
        window (row-major A, shared by the groups) or each group's gathered rows."""
        return self.bkd if self.gathers_windows else self.bk * self.groups

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
        """The gathered A tiles, K-major: a group's bk rows of bm activations (padded),
        for each group."""
        return self.groups * self.bk * (self.bm + PAD)

    @property
    def dense_tile_elems(self) -> int:
        """Row-major A's window tile: bm rows of bkd activations (padded)."""
        return self.bm * (self.bkd + PAD)

    @property
    def stage_elems(self) -> int:
        """16-bit elements of one pipeline stage: the B' tile, then the gathered A tile
        (K-major A) or the dense window tile and the stage's index table (row-major A,
        bk int32 entries a group)."""
        a_part = (self.dense_tile_elems + 2 * self.bk * self.groups if self.gathers_windows
                  else self.a_tile_elems)
        return self.b_tile_elems + a_part

    @functools.cached_property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the stages, and for row-major A the gathered A tiles the
        MMAs read."""
        gathered = self.a_tile_elems if self.gathers_windows else 0
        return ELEMENT_BYTES * (self.stages * self.stage_elems + gathered)

    # ----------------------------------------------------------------- rules
    def _target_rules(self) -> Iterator[tuple[str, bool]]:
        yield ("sm_80 or newer (mma.sync m16n8k16, cp.async)", self.arch.number >= 80)
        yield ("a_copy only with row-major A (its K-major copy)",
               not self.a_copy or self.a_layout is ALayout.ROW_MAJOR)
        yield ("bn % 8 == 0 and (L % bn == 0 or bn % L == 0): whole column groups",
               self.bn % 8 == 0 and (self.vec % self.bn == 0 or self.bn % self.vec == 0))

    def _block_rules(self) -> Iterator[tuple[str, bool]]:
        yield ("row-major A: windows * m % 8 == 0 (16-byte chunks of the window tile)",
               not self.gathers_windows or self.bkd % 8 == 0)
        yield ("bm % (16 * warps_m) == 0 (m16 tiles a warp)", self.bm % (16 * self.warps_m) == 0)
        yield ("bn % (8 * warps_n) == 0 (n8 tiles a warp)", self.bn % (8 * self.warps_n) == 0)
        yield ("a warp's columns inside one group (min(bn, L) % wn == 0)",
               self.wn > 0 and self.group_width % self.wn == 0)
        yield (f"threads (32 * warps_m * warps_n) <= {MAX_THREADS}",
               self.threads <= MAX_THREADS)
        yield (f"2 <= stages <= {MAX_STAGES}", 2 <= self.stages <= MAX_STAGES)

    # ----------------------------------------------------------------- naming
    @property
    def warps_tag(self) -> str:
        return f"w{self.warps_m}x{self.warps_n}"

    @property
    def name_tag(self) -> str:
        return COPY_TAG if self.a_copy else ""

    @classmethod
    def tag_fields(cls, groups: dict[str, str | None]) -> dict[str, Any]:
        return {"a_copy": bool(groups["tx"])}
