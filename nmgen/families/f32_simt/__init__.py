"""The FP32 SIMT kernel family (CUDA cores): ``F32_SIMT``."""

from .family import F32_SIMT

__all__ = ["F32_SIMT"]
