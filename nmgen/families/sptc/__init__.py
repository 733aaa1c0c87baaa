"""The sparse-tensor-core family: element-wise 2:4 weights (and every pattern whose kept
elements fit 2:4) on Hopper's ``wgmma.mma_async.sp`` (docs/design.md §12)."""

from .family import SPTC

__all__ = ["SPTC"]
