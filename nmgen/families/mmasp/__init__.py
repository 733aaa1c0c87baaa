"""The ``mma.sp`` family: weights whose kept elements fit the hardware's 2:4 (element-wise
2:4 checkpoints, 1:4, 1:2, 2:8, ... at any L) on the sparse tensor cores of every GPU from
sm_80 (``mma.sp::ordered_metadata`` m16n8k32), BF16 and FP16 (docs/design.md §12)."""

from .family import MMASP

__all__ = ["MMASP"]
