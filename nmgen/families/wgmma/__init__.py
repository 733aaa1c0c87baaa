"""The Hopper tensor-core kernel family (BF16 and FP16 on ``wgmma.mma_async``): ``WGMMA``."""

from .family import WGMMA

__all__ = ["WGMMA"]
