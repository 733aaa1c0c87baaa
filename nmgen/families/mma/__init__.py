"""The tensor-core kernel family (BF16 and FP16 on ``mma.sync`` m16n8k16): ``MMA``."""

from .family import MMA

__all__ = ["MMA"]
