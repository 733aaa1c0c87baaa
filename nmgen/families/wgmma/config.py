"""``WgmmaConfig``: one instance of the Hopper ``wgmma`` template, validated, named after
every parameter and serialisable. Its rules are the family's resource rules.

A block computes a ``bm × bn`` tile of C from one column group over stages of ``bk``
compressed rows (``TensorCoreConfig``). Its ``warpgroups`` warpgroups (128 threads each)
split ``bm`` into ``64·tiles_m`` rows each and issue ``wgmma.mma_async m64n{bn}k16`` with
both operands in shared memory, in the 128-byte swizzled MN-major layout: ``bn`` is a
multiple of 64 (the swizzle atom is 64 16-bit columns wide), hence ``L >= 64``. The
kernel reads K-major A; row-major A (``_rm_``) is first copied K-major by the module's
transpose kernel (``a_copied``).

``producer``: who copies the stages in. ``"shared"``: the same warpgroups that issue the
MMAs, a block barrier every stage. ``"warp"``: one more warpgroup that only copies (warp
specialisation, name tag ``_ws``), the stages handed over by two mbarriers each (full,
empty); the ``warpgroups`` warpgroups only issue MMAs. Its registers are rebalanced by
``setmaxnreg`` where the consumers need more than an even share (``register_split``). It
reads A as the shared kernel does (row-major A: the transpose kernel's K-major copy).
``"tma"``: the same producer warpgroup gathering A by 16-byte copies, the B' tile copied by
the bulk copy engine (name tag ``_tma``): one producer thread issues its boxes of 64
columns (128-byte swizzled) and announces their bytes on the stage's full barrier.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from ...epilogue import NO_EPILOGUE, Epilogue
from ...format import DType
from ...gpus import REGISTERS_PER_SM, Arch
from ...problem import ALayout
from ..space import ConfigError
from ..tensor_core.config import (
    ELEMENT_BYTES,
    MAX_REGISTERS,
    TensorCoreConfig,
    name_pattern,
)

FAMILY = "wgmma"
TARGET = "sm_90a"  # wgmma needs the arch-specific target
WARPGROUP = 128  # threads
ATOM_COLS = 64  # 16-bit columns of one 128-byte swizzle atom row
ATOM_ROW_BYTES = 128
BLOCK_NS = (64, 128, 256)
MAX_WARPGROUPS = 4
MAX_TILES_M = 2  # m64 tiles a warpgroup
MIN_STAGES, MAX_STAGES = 3, 6  # one stage is read by the wgmma in flight
ALIGN_SLACK = 1024  # the stages start at a 1024-byte boundary (the swizzle's period)
# Registers beside the accumulators: addresses, descriptors, loop state, the copies'
# indices (ptxas, sm_90a: see tests/test_wgmma.py's nvcc tests).
REGISTER_OVERHEAD = 64
BARRIER_BYTES = 8  # one mbarrier
REGISTER_GRANULE = 8  # registers a thread are allocated (and setmaxnreg'd) in eights
MIN_SETMAXNREG, MAX_SETMAXNREG = 24, 256
# Warp specialisation (producer "warp"): an MMA thread's registers beside its accumulators
# (descriptors, barrier addresses, loop state, the epilogue's indices); a producer
# thread's: these, one a chunk of A it copies a stage (its dense row) and four a chunk of
# B' (ptxas keeps each chunk's 64-bit source and its offsets across the stages). Fitted
# to ptxas (CUDA 13.0, sm_90a) after setmaxnreg.dec: producers of (A, B') chunks (8, 2)
# spilled at 40 registers, (8, 8) at 56, (16, 16) at 96; every configuration where the
# split applies compiles without spills (tests/test_wgmma.py's nvcc tests).
CONSUMER_OVERHEAD = 32
PRODUCER_OVERHEAD = 32
PRODUCER_B_CHUNK = 4
# Producer "tma": no B' chunks; instead its first thread issues the B' boxes (the map's
# address, their coordinates, the bytes announced). ptxas (CUDA 13.0) after setmaxnreg.dec,
# forced on the largest stages: producers of 8, 12, 16 and 24 A chunks compile without
# spills at 48, 56, 56 and 64 registers (PRODUCER_OVERHEAD + A chunks + this, in
# granules) and spill one granule below (tests/test_wgmma.py's nvcc tests).
PRODUCER_TMA_ISSUE = 8
# ptxas (CUDA 13.0) compiles a wgmma m64nNk16 only where the launch register count (before
# any setmaxnreg.inc) holds its N/2 accumulators and about this many more: N = 64, 128, 256
# ask for 58, 90, 154.
WGMMA_OPERAND_REGISTERS = 26


class Producer(str, Enum):
    """Who copies the stages into shared memory."""

    SHARED = "shared"  # the MMA warpgroups themselves, a block barrier a stage
    WARP = "warp"  # one more warpgroup, mbarriers a stage (warp specialisation)
    TMA = "tma"  # the producer warpgroup, its copies by the bulk copy engine


# Parameters that came after the first tuned kernels, with the default that reproduces them.
LATER_PARAMETERS: dict[str, Any] = {"producer": Producer.SHARED.value}
# The name's tag of a producer warpgroup, by what copies.
PRODUCER_TAGS = {Producer.WARP: "_ws", Producer.TMA: "_tma"}


def _granules(registers: int) -> int:
    """``registers`` rounded up to the allocation granule."""
    return -(-registers // REGISTER_GRANULE) * REGISTER_GRANULE


@dataclass(frozen=True)
class WgmmaConfig(TensorCoreConfig):
    """e.g. ``nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90a``: warpgroups (``g2``),
    ``_ws`` after the stages for a producer warpgroup (``..._g2_s4_ws_km_sm90a``), ``_tma``
    for one of bulk copies (``..._g2_s4_tma_km_sm90a``), the arch-specific target
    (``sm90a``); an epilogue's tag last (``..._sm90a_bias_silu``)."""

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
    producer: Producer = Producer.SHARED  # who copies the stages in
    family: ClassVar[str] = FAMILY
    later_parameters: ClassVar[dict[str, Any]] = LATER_PARAMETERS
    enum_fields: ClassVar[dict[str, type[Enum]]] = {**TensorCoreConfig.enum_fields,
                                                     "producer": Producer}
    warp_fields: ClassVar[tuple[str, ...]] = ("warpgroups",)
    arch_suffix: ClassVar[str] = "a"
    name_re: ClassVar[re.Pattern[str]] = name_pattern(FAMILY, r"g(?P<warpgroups>\d+)", "a",
                                                      rf"(?P<producer>{'|'.join(PRODUCER_TAGS.values())})?")
    name_example: ClassVar[str] = "nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90a"

    # ----------------------------------------------------------------- derived sizes
    @property
    def specialized(self) -> bool:
        """Whether a producer warpgroup of its own copies the stages in."""
        return self.producer in PRODUCER_TAGS

    @property
    def tma(self) -> bool:
        """Whether the producer copies B' by the bulk copy engine (a tensor map of it)."""
        return self.producer is Producer.TMA

    def ws_twin(self) -> WgmmaConfig:
        """Producer "tma": the same kernel copying B' by 16-byte copies too (``_ws``), what
        the model estimates it as; else this configuration."""
        return self.replace(producer=Producer.WARP) if self.tma else self

    @property
    def threads(self) -> int:
        """The MMA warpgroups' threads, and the producer warpgroup's where it has one
        (the launch's block)."""
        return WARPGROUP * (self.warpgroups + int(self.specialized))

    @property
    def copy_threads(self) -> int:
        """Threads that issue a stage's copies."""
        return WARPGROUP if self.specialized else self.threads

    @property
    def a_per_thread(self) -> int:
        """16-byte chunks of the gathered A tile a copying thread issues a stage."""
        return -(-self.bk * self.bm // 8 // self.copy_threads)

    @property
    def b_per_thread(self) -> int:
        """16-byte chunks of the B' tile a copying thread issues a stage."""
        return -(-self.bk * self.bn // 8 // self.copy_threads)

    @property
    def a_copied(self) -> bool:
        """Row-major A: the transpose kernel writes a K-major copy that the kernel reads."""
        return self.a_layout is ALayout.ROW_MAJOR

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
        """Registers a thread (a producer warpgroup: an MMA thread's)."""
        if self.specialized:
            return self.accumulators + CONSUMER_OVERHEAD
        return self.accumulators + REGISTER_OVERHEAD

    @property
    def producer_registers(self) -> int:
        """Registers a producer thread needs (0 without one)."""
        if not self.specialized:
            return 0
        b_copies = PRODUCER_TMA_ISSUE if self.tma else PRODUCER_B_CHUNK * self.b_per_thread
        return _granules(PRODUCER_OVERHEAD + self.a_per_thread + b_copies)

    @property
    def block_registers(self) -> int:
        """Registers a block needs: every thread the estimate, or (a producer warpgroup) the
        producer warpgroup and the MMA warpgroups theirs, in granules."""
        if not self.specialized:
            return self.threads * self.registers_estimate
        return WARPGROUP * (self.producer_registers
                            + self.warpgroups * _granules(self.registers_estimate))

    def launch_registers(self, blocks: int) -> int:
        """Registers a thread at launch with ``blocks`` blocks an SM: what ptxas grants
        ``__launch_bounds__(threads, blocks)``, the SM's registers over the threads in
        granules (at most 255)."""
        share = REGISTERS_PER_SM // (blocks * self.threads)
        return min(MAX_REGISTERS, share // REGISTER_GRANULE * REGISTER_GRANULE)

    def register_split(self, blocks: int) -> tuple[int, int, int] | None:
        """A producer warpgroup with ``blocks`` blocks an SM: (registers a thread at launch,
        the producer's after ``setmaxnreg.dec``, the MMA threads' after ``setmaxnreg.inc``), or
        ``None`` where launch gives every thread enough (and without a producer
        warpgroup). setmaxnreg moves registers only inside the block (its pool): the MMA
        threads get launch + (launch - producer) / warpgroups, in granules."""
        if not self.specialized:
            return None
        launch = self.launch_registers(blocks)
        consumer_need = _granules(self.registers_estimate)
        if launch >= max(consumer_need, self.producer_registers):
            return None
        producer = max(MIN_SETMAXNREG, self.producer_registers)
        consumer = (launch + (launch - producer) // self.warpgroups) \
            // REGISTER_GRANULE * REGISTER_GRANULE
        return launch, producer, min(MAX_SETMAXNREG, consumer)

    def fits_registers(self, blocks: int) -> bool:
        """Whether ``blocks`` blocks an SM leave every thread the registers it needs (a
        producer warpgroup: after ``register_split``)."""
        if blocks * self.block_registers > REGISTERS_PER_SM:
            return False
        split = self.register_split(blocks)
        if split is None:
            return True
        launch, producer, consumer = split
        return (producer < launch and consumer >= _granules(self.registers_estimate)
                and launch >= self.bn // 2 + WGMMA_OPERAND_REGISTERS)

    def blocks_by_registers(self) -> int:
        """Blocks an SM the registers allow (0 where not one fits; a producer warpgroup: the
        most that ``fits_registers``)."""
        if not self.specialized:
            return super().blocks_by_registers()
        most = REGISTERS_PER_SM // self.block_registers
        return next((b for b in range(most, 0, -1) if self.fits_registers(b)), 0)

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

    @property
    def barrier_bytes(self) -> int:
        """The mbarriers (a producer warpgroup): full and empty a stage."""
        return 2 * self.stages * BARRIER_BYTES if self.specialized else 0

    @functools.cached_property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the stages, the mbarriers (a producer warpgroup) and the
        slack that aligns them."""
        return self.stages * self.stage_bytes + self.barrier_bytes + ALIGN_SLACK

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

    def _block_register_rules(self) -> Iterator[tuple[str, bool]]:
        if not self.specialized:
            yield from super()._block_register_rules()
            return
        yield (f"block registers (producer {self.producer_registers} + MMA "
               f"~{self.registers_estimate} a thread) fit {REGISTERS_PER_SM}",
               self.fits_registers(1))
        if self.tma:
            yield ("its _ws twin is valid (the model estimates it as that twin)",
                   self._twin_is_valid())

    def _twin_is_valid(self) -> bool:
        try:
            self.ws_twin()
        except ConfigError:
            return False
        return True

    # ----------------------------------------------------------------- naming
    @property
    def warps_tag(self) -> str:
        return f"g{self.warpgroups}"

    @property
    def name_tag(self) -> str:
        return PRODUCER_TAGS.get(self.producer, "")

    @classmethod
    def tag_fields(cls, groups: dict[str, str | None]) -> dict[str, Any]:
        by_tag = {tag: producer for producer, tag in PRODUCER_TAGS.items()}
        return {"producer": by_tag.get(groups["producer"] or "", Producer.SHARED)}

