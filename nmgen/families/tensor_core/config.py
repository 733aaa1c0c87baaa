"""``TensorCoreConfig``: what a tensor-core family's configuration shares with the other's.

A block computes a ``bm × bn`` tile of C from one column group (``L % bn == 0``: the block
shares one index set) over ``stages``-deep pipelined stages of ``windows`` windows, ``bk =
windows·n`` compressed rows a stage (whole ``k16`` steps), BF16 or FP16 operands and FP32
accumulators. A family adds how its warps split the tile (its ``warp_fields``), what its
instruction needs of the target, and its sizes (threads, registers, shared memory).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from enum import Enum
from typing import Any, ClassVar, Self

from ...epilogue import Epilogue
from ...format import MAX_M, DType
from ...gpus import REGISTERS_PER_SM, Arch
from ...problem import ALayout
from ..space import ConfigError, ConfigRecord

DTYPES = frozenset({DType.BF16, DType.F16})
MAX_REGISTERS = 255
MAX_ACCUMULATORS = 128  # FP32 accumulators a thread
MAX_STAGE_ROWS = 128  # compressed rows a stage (bk)
ELEMENT_BYTES = 2


def name_pattern(family: str, warps: str, arch_suffix: str = "", tag: str = ""
                 ) -> re.Pattern[str]:
    """The kernel names of ``family`` (``TensorCoreConfig.name``): ``warps`` matches the
    part that names the block's warps, a group a warp field; ``tag`` the family's optional
    tag after the stages (``TensorCoreConfig.name_tag``)."""
    return re.compile(
        rf"^nm_{family}_(?P<dtype>bf16|f16)_n(?P<n>\d+)m(?P<m>\d+)l(?P<vec>\d+)"
        rf"_b(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)_{warps}"
        rf"_s(?P<stages>\d+){tag}_(?P<layout>rm|km)_sm(?P<arch>\d+){arch_suffix}$")


class TensorCoreConfig(ConfigRecord):
    """The shared side of a tensor-core family's frozen configuration dataclass: derived
    sizes, validation (the rules in order, the family's among them), the name and its
    parsing. The dataclass declares the fields, the family's rules and sizes."""

    enum_fields: ClassVar[dict[str, type[Enum]]] = {"a_layout": ALayout, "arch": Arch,
                                                     "dtype": DType}

    n: int
    m: int
    vec: int  # L
    bm: int  # block tile rows (M)
    bn: int  # block tile columns (N)
    windows: int  # windows of m dense rows a main-loop stage
    stages: int  # pipeline depth
    a_layout: ALayout
    arch: Arch
    dtype: DType
    epilogue: Epilogue  # bias and activation on the output (not tuned)
    # the family's sizes
    threads: int
    accumulators: int  # FP32 accumulators a thread
    registers_estimate: int  # registers a thread
    smem_bytes: int  # dynamic shared memory a block

    warp_fields: ClassVar[tuple[str, ...]]  # the fields that split the tile among warps
    arch_suffix: ClassVar[str] = ""  # after the arch in the name (``a``: arch-specific)
    name_re: ClassVar[re.Pattern[str]]  # ``name_pattern`` of the family
    name_example: ClassVar[str]

    # ----------------------------------------------------------------- derived sizes
    @property
    def bk(self) -> int:
        """Compressed rows of B' (and gathered rows of A) a stage."""
        return self.windows * self.n

    @property
    def bkd(self) -> int:
        """Dense rows of A (along K) a stage covers: the row-major window tile's width."""
        return self.windows * self.m

    @property
    def a_copied(self) -> bool:
        """Whether row-major A is first copied K-major by the transpose kernel (and the
        kernel reads the copy)."""
        return False

    @property
    def tma(self) -> bool:
        """Whether the kernel copies the values by the bulk copy engine (it then takes
        their tensor map after its other arguments)."""
        return False

    @property
    def gathers_windows(self) -> bool:
        """Whether the kernel reads row-major A's dense windows and gathers their kept
        columns itself."""
        return self.a_layout is ALayout.ROW_MAJOR and not self.a_copied

    @property
    def a_stage_depth(self) -> int:
        """Elements of each of its ``bm`` rows of A a block reads a stage: the dense
        window (row-major A gathered in the kernel) or the gathered rows."""
        return self.bkd if self.gathers_windows else self.bk

    # ----------------------------------------------------------------- rules
    def _rules(self) -> Iterator[tuple[str, bool]]:
        sizes = ("n", "m", "vec", "bm", "bn", "windows", *self.warp_fields, "stages")
        if not all(getattr(self, size) >= 1 for size in sizes):
            yield "all sizes >= 1", False
            return
        yield ("1 <= n <= m", self.n <= self.m)
        yield (f"m <= {MAX_M}", self.m <= MAX_M)
        yield ("dtype bf16 or f16 (tensor-core operands)", self.dtype in DTYPES)
        yield from self._target_rules()
        yield ("bk = windows * n a multiple of 16 (whole k16 steps)", self.bk % 16 == 0)
        yield (f"bk <= {MAX_STAGE_ROWS}", self.bk <= MAX_STAGE_ROWS)
        yield from self._block_rules()
        yield from self._resource_rules()

    def _target_rules(self) -> Iterator[tuple[str, bool]]:
        """What the family's instructions need of the arch, the A layout and ``bn``."""
        raise NotImplementedError

    def _block_rules(self) -> Iterator[tuple[str, bool]]:
        """How the family's warps split the block tile, and its pipeline depth."""
        raise NotImplementedError

    def _resource_rules(self) -> Iterator[tuple[str, bool]]:
        yield (f"accumulators a thread <= {MAX_ACCUMULATORS}",
               self.accumulators <= MAX_ACCUMULATORS)
        yield (f"registers (~{self.registers_estimate}) <= {MAX_REGISTERS}",
               self.registers_estimate <= MAX_REGISTERS)
        yield from self._block_register_rules()
        yield (f"shared memory {self.smem_bytes} B <= {self.arch.max_smem_per_block} B "
               f"({self.arch.value} limit per block)",
               self.smem_bytes <= self.arch.max_smem_per_block)

    def _block_register_rules(self) -> Iterator[tuple[str, bool]]:
        """A block's registers fit the SM's: every thread the estimate."""
        yield (f"threads * registers ({self.threads} * ~{self.registers_estimate}) <= "
               f"{REGISTERS_PER_SM}", self.threads * self.registers_estimate <= REGISTERS_PER_SM)

    def blocks_by_registers(self) -> int:
        """Blocks an SM its registers allow (0 where not one fits): every thread the
        estimate."""
        return REGISTERS_PER_SM // (self.threads * self.registers_estimate)

    # ----------------------------------------------------------------- naming
    @property
    def warps_tag(self) -> str:
        """The name's part for the warp fields."""
        raise NotImplementedError

    @property
    def name_tag(self) -> str:
        """The family's optional part of the name after the stages (``_<tag>``, matched by
        the ``tag`` of its ``name_pattern`` and read back by ``tag_fields``); none here."""
        return ""

    @classmethod
    def tag_fields(cls, groups: dict[str, str | None]) -> dict[str, Any]:
        """The fields that a name's tag (``name_tag``) states, from its pattern's groups."""
        return {}

    @functools.cached_property
    def name(self) -> str:
        """``nm_<family>_<dtype>_n<n>m<m>l<L>_b<bm>x<bn>x<bk>_<warps>_s<stages>[_<tag>]
        _<layout>_<arch>``: block tile bm x bn x bk (compressed rows a stage), the warps
        (``warps_tag``), stages, the family's tag if any (``name_tag``); an epilogue's tag
        last."""
        return (f"nm_{self.family}_{self.dtype.value}_n{self.n}m{self.m}l{self.vec}"
                f"_b{self.bm}x{self.bn}x{self.bk}_{self.warps_tag}_s{self.stages}{self.name_tag}"
                f"_{self.a_layout.value}_{self.arch.value.replace('_', '')}{self.arch_suffix}"
                f"{self.epilogue.suffix}")

    @classmethod
    def from_name(cls, name: str) -> Self:
        base, epilogue = Epilogue.split_name(name)
        match = cls.name_re.match(base)
        if not match:
            raise ConfigError(f"{name!r} is not a {cls.family} kernel name "
                              f"(e.g. {cls.name_example})")
        g = match.groupdict()
        n, bk = int(g["n"]), int(g["bk"])
        if bk % n:
            raise ConfigError(f"{name!r}: {bk} compressed rows a stage are not whole windows "
                              f"of n={n}")
        sizes = {size: int(g[size]) for size in ("m", "vec", "bm", "bn", "stages",
                                                 *cls.warp_fields)}
        return cls(n=n, windows=bk // n, **sizes,  # type: ignore[call-arg]
                   a_layout=ALayout(g["layout"]), arch=Arch(f"sm_{g['arch']}"),
                   dtype=DType(g["dtype"]), epilogue=epilogue, **cls.tag_fields(g))
