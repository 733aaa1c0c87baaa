"""What a kernel must serve: the problem, less its shape (``Problem``), and the layouts of
the dense operand. Tuned records, dispatch and the families' spaces are keyed on it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .format import DType
from .gpus import Arch


class ALayout(str, Enum):
    """Memory layout of the dense operand ``A`` (logically ``M×K``)."""

    ROW_MAJOR = "rm"  # M×K, K contiguous: what frameworks hold
    K_MAJOR = "km"  # K×M, M contiguous: the seed paper's layout


@dataclass(frozen=True)
class Problem:
    """A pattern ``n:m`` with vector length ``vec`` (L), the A layout, the compile target
    and the dtype of values and activations."""

    n: int
    m: int
    vec: int
    a_layout: ALayout = ALayout.ROW_MAJOR
    arch: Arch = Arch.SM90
    dtype: DType = DType.F32

    def __post_init__(self) -> None:
        object.__setattr__(self, "a_layout", ALayout(self.a_layout))
        object.__setattr__(self, "arch", Arch(self.arch))
        object.__setattr__(self, "dtype", DType.parse(self.dtype))

    @property
    def pattern(self) -> str:
        return f"{self.n}:{self.m}"

    def __str__(self) -> str:
        return (f"{self.pattern} L={self.vec} {self.dtype.value} {self.a_layout.value} "
                f"{self.arch.value}")
