"""What a kernel must serve: the problem, less its shape (``Problem``), and the layouts of
the dense operand. Tuned records, dispatch and the families' spaces are keyed on it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from .format import MAX_INDEX, MAX_M, DType, Pattern, check_vec
from .gpus import Arch

E = TypeVar("E", bound=Enum)


def _member(kind: type[E], value: Any, what: str) -> E:
    try:
        return kind(value)
    except ValueError:
        taken = ", ".join(str(m.value) for m in kind)
        raise ValueError(f"{what} {value!r}: expected one of {taken}") from None


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
        """Refuse what no kernel serves (a pattern or L the format refuses, an unknown A
        layout or arch) here, not later where a key or a space reads it."""
        if not (type(self.n) is int and type(self.m) is int and 1 <= self.n <= self.m <= MAX_M):
            pattern = Pattern(self.n, self.m)  # refuses it, or makes NumPy ints Python's
            object.__setattr__(self, "n", pattern.n)
            object.__setattr__(self, "m", pattern.m)
        if not (type(self.vec) is int and 1 <= self.vec <= MAX_INDEX):
            object.__setattr__(self, "vec", check_vec(self.vec))
        object.__setattr__(self, "a_layout", _member(ALayout, self.a_layout, "A layout"))
        object.__setattr__(self, "arch", _member(Arch, self.arch, "arch"))
        object.__setattr__(self, "dtype", DType.parse(self.dtype))

    @property
    def pattern(self) -> str:
        return f"{self.n}:{self.m}"

    def __str__(self) -> str:
        return (f"{self.pattern} L={self.vec} {self.dtype.value} {self.a_layout.value} "
                f"{self.arch.value}")
