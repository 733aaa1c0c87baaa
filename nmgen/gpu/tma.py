"""Tensor maps for Hopper's bulk copy engine (TMA): the 128-byte descriptors a ``tma``
kernel takes by value, one for its A tile and one for its B' tile, encoded by the CUDA
driver (``cuTensorMapEncodeTiled``, through ctypes: CuPy does not wrap it)."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

TensorMap = ctypes.c_uint64 * 16  # a CUtensorMap: 128 bytes, opaque

_FLOAT32 = 7  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
_NO_INTERLEAVE = _NO_SWIZZLE = _NO_L2_PROMOTION = _ZERO_FILL = 0


@functools.cache
def _encode_tiled() -> Any:
    encode = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    encode.restype = ctypes.c_int
    return encode


def addressable(ptr: int, ld: int) -> bool:
    """Whether the engine can read a float32 matrix at ``ptr`` with rows ``ld`` floats
    apart: 16-byte aligned, rows a multiple of 16 bytes apart."""
    return ptr % 16 == 0 and ld % 4 == 0


def encode_matrix(out: ctypes.Array, ptr: int, cols: int, rows: int, ld: int,
                  box: tuple[int, int]) -> None:
    """Write into ``out`` the map of a float32 matrix of ``rows`` x ``cols`` at ``ptr``, rows
    ``ld`` floats apart, copied in boxes of ``box`` = (cols, rows); a box reaching past the
    matrix reads zeros there. Raises ValueError for what the engine cannot address."""
    if not addressable(ptr, ld):
        raise ValueError(f"TMA needs a 16-byte aligned matrix with rows a multiple of 4 "
                         f"floats apart (address {ptr:#x}, row stride {ld} floats)")
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    status = _encode_tiled()(
        ctypes.byref(out), _FLOAT32, u32(2), ctypes.c_void_p(ptr),
        (u64 * 2)(cols, rows), (u64 * 1)(ld * 4), (u32 * 2)(*box), (u32 * 2)(1, 1),
        _NO_INTERLEAVE, _NO_SWIZZLE, _NO_L2_PROMOTION, _ZERO_FILL)
    if status != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {status}) for a "
                           f"{rows} x {cols} matrix, row stride {ld}, box {box}")
