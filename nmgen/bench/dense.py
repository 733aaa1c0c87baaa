"""Dense cuBLAS baselines for ``nmgen bench``, called through CuPy's cuBLAS bindings:
SGEMM (FP32), TF32 tensor cores (FP32 data) and BF16 tensor cores (FP32 accumulate).

All three compute the row-major ``C[M×N] = A[M×K] · W[K×N]``; cuBLAS is column-major,
so each call computes ``Cᵀ = Wᵀ · Aᵀ`` on the same memory.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import numpy as np

from ..build.nvrtc import cupy

CUDA_R_32F, CUDA_R_16BF = 0, 14
COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77
GEMM_DEFAULT = -1
OP_N = 0


class Dense(Enum):
    SGEMM = "sgemm"
    TF32 = "tf32"
    BF16 = "bf16"


def _cublas() -> Any:
    try:
        from cupy_backends.cuda.libs import cublas
    except ImportError:  # older CuPy
        from cupy.cuda import cublas
    return cublas


def _to_bf16(cp: Any, x: Any) -> Any:
    """FP32 → BF16 bits (round to nearest even), as uint16 (CuPy has no bfloat16)."""
    bits = x.view(cp.uint32)
    rounded = bits + cp.uint32(0x7FFF) + ((bits >> 16) & cp.uint32(1))
    return (rounded >> 16).astype(cp.uint16)


def dense_gemm(kind: Dense, a: Any, w: Any) -> Callable[[], Any]:
    """A no-argument callable computing ``a @ w`` (FP32 output) with ``kind``.
    ``a`` is M×K and ``w`` K×N, both C-contiguous float32 CuPy arrays."""
    cp = cupy()
    rows, depth = a.shape
    cols = w.shape[1]
    out = cp.empty((rows, cols), cp.float32)
    if kind is Dense.SGEMM:
        return lambda: cp.matmul(a, w, out=out)
    cublas = _cublas()
    data_type = CUDA_R_16BF if kind is Dense.BF16 else CUDA_R_32F
    compute = COMPUTE_32F if kind is Dense.BF16 else COMPUTE_32F_FAST_TF32
    if kind is Dense.BF16:
        a, w = _to_bf16(cp, a), _to_bf16(cp, w)
    alpha, beta = np.ones(1, np.float32), np.zeros(1, np.float32)
    handle = cp.cuda.device.get_cublas_handle()

    def run() -> Any:
        cublas.gemmEx(handle, OP_N, OP_N, cols, rows, depth, alpha.ctypes.data,
                      w.data.ptr, data_type, cols, a.data.ptr, data_type, depth,
                      beta.ctypes.data, out.data.ptr, CUDA_R_32F, cols, compute,
                      GEMM_DEFAULT)
        return out

    return run
