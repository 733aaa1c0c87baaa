"""The decode kernel family (small M, memory-bound; FP32, BF16, FP16): ``GEMV``."""

from .family import GEMV

__all__ = ["GEMV"]
