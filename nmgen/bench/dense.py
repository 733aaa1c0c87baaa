"""Dense cuBLAS baselines for ``nmgen bench`` and ``nmgen bench-untuned``, called through
CuPy's cuBLAS bindings: SGEMM (FP32), TF32 tensor cores (FP32 data), and BF16 and FP16
tensor cores (FP32 accumulate).

All compute the row-major ``C[M×N] = A[M×K] · W[K×N]``; cuBLAS is column-major, so each
call computes ``Cᵀ = Wᵀ · Aᵀ`` on the same memory.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import numpy as np

from ..compiler.nvrtc import cupy
from ..format import DType

CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14  # cudaDataType
COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77  # cublasComputeType_t
GEMM_DEFAULT = -1
OP_N = 0


class Dense(Enum):
    SGEMM = "sgemm"
    TF32 = "tf32"
    BF16 = "bf16"
    F16 = "f16"

    @property
    def label(self) -> str:
        """The baseline as tables name it."""
        return {"sgemm": "SGEMM", "tf32": "TF32 GEMM", "bf16": "BF16 GEMM",
                "f16": "FP16 GEMM"}[self.value]


# cudaDataType of the inputs A and W of each cublasGemmEx kind, and its compute type.
INPUT_TYPE = {Dense.TF32: CUDA_R_32F, Dense.BF16: CUDA_R_16BF, Dense.F16: CUDA_R_16F}
COMPUTE_TYPE = {Dense.TF32: COMPUTE_32F_FAST_TF32, Dense.BF16: COMPUTE_32F,
                Dense.F16: COMPUTE_32F}
SAME_DTYPE = {DType.F32: Dense.SGEMM, DType.BF16: Dense.BF16, DType.F16: Dense.F16}


def dense_of(dtype: DType) -> Dense:
    """cuBLAS's GEMM of ``dtype``'s inputs: SGEMM for FP32, FP32 accumulate at 16 bits."""
    return SAME_DTYPE[dtype]


def gemm_types(kind: Dense, same_dtype_out: bool = False) -> tuple[int, int, int]:
    """(A and W's cudaDataType, C's, the compute type) of a cublasGemmEx ``kind``: C in
    FP32, or with ``same_dtype_out`` in the inputs' type."""
    if kind not in INPUT_TYPE:
        raise ValueError(f"{kind.name} is no cublasGemmEx baseline")
    inputs = INPUT_TYPE[kind]
    return inputs, inputs if same_dtype_out else CUDA_R_32F, COMPUTE_TYPE[kind]


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


def _inputs(cp: Any, kind: Dense, x: Any) -> Any:
    """A float32 operand in ``kind``'s input type (BF16 as uint16 bits)."""
    if kind is Dense.BF16:
        return _to_bf16(cp, x)
    if kind is Dense.F16:
        return x.astype(cp.float16)
    return x


def _output(cp: Any, data_type: int, shape: tuple[int, int]) -> Any:
    """C of cudaDataType ``data_type`` (BF16 as uint16 bits)."""
    dtype = {CUDA_R_32F: cp.float32, CUDA_R_16F: cp.float16, CUDA_R_16BF: cp.uint16}
    return cp.empty(shape, dtype[data_type])


def dense_gemm(kind: Dense, a: Any, w: Any, same_dtype_out: bool = False
               ) -> Callable[[], Any]:
    """A no-argument callable computing ``a @ w`` with ``kind``: FP32 output, or with
    ``same_dtype_out`` the 16-bit kinds' output in their inputs' dtype (as nmgen's kernels
    of that dtype write it; BF16 as uint16 bits). ``a`` is M×K and ``w`` K×N, both
    C-contiguous float32 CuPy arrays, rounded here to a 16-bit kind's input type."""
    cp = cupy()
    rows, depth = a.shape
    cols = w.shape[1]
    if kind is Dense.SGEMM:
        out = cp.empty((rows, cols), cp.float32)
        return lambda: cp.matmul(a, w, out=out)
    cublas = _cublas()
    input_type, output_type, compute = gemm_types(kind, same_dtype_out)
    a, w = _inputs(cp, kind, a), _inputs(cp, kind, w)
    out = _output(cp, output_type, (rows, cols))
    alpha, beta = np.ones(1, np.float32), np.zeros(1, np.float32)
    handle = cp.cuda.device.get_cublas_handle()

    def run() -> Any:
        cublas.gemmEx(handle, OP_N, OP_N, cols, rows, depth, alpha.ctypes.data,
                      w.data.ptr, input_type, cols, a.data.ptr, input_type, depth,
                      beta.ctypes.data, out.data.ptr, output_type, cols, compute,
                      GEMM_DEFAULT)
        return out

    return run
