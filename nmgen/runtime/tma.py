"""Tensor maps for Hopper's bulk copy engine (TMA): the 128-byte descriptors a kernel
takes by value (a plan's ``TensorMap2D`` arguments), encoded by the CUDA driver
(``cuTensorMapEncodeTiled``, through ctypes: CuPy does not wrap it)."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

TensorMap = ctypes.c_uint64 * 16  # a CUtensorMap: 128 bytes, opaque

# CU_TENSOR_MAP_DATA_TYPE_* by element size: the engine copies bits, so 2-byte elements
# (bf16, fp16) go as UINT16
_DATA_TYPE = {4: 7, 2: 1}  # FLOAT32, UINT16
_NO_INTERLEAVE = _NO_SWIZZLE = _NO_L2_PROMOTION = _ZERO_FILL = 0
_SWIZZLE_128B = 3  # CU_TENSOR_MAP_SWIZZLE_128B
SWIZZLE_SPAN = 128  # bytes of a box row the 128-byte swizzle takes at most


@functools.cache
def _encode_tiled() -> Any:
    encode = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    encode.restype = ctypes.c_int
    return encode


def addressable(ptr: int, ld: int, itemsize: int = 4) -> bool:
    """Whether the engine can read a matrix at ``ptr`` with rows ``ld`` elements apart:
    16-byte aligned, rows a multiple of 16 bytes apart."""
    return ptr % 16 == 0 and ld * itemsize % 16 == 0


def encode_matrix(out: ctypes.Array, ptr: int, cols: int, rows: int, ld: int,
                  box: tuple[int, int], itemsize: int = 4, swizzle_128b: bool = False
                  ) -> None:
    """Write into ``out`` the map of a matrix of ``rows`` x ``cols`` elements of
    ``itemsize`` bytes at ``ptr``, rows ``ld`` elements apart, copied in boxes of ``box`` =
    (cols, rows); a box reaching past the matrix reads zeros there. ``swizzle_128b``: boxes
    land in the 128-byte swizzle (rows of at most 128 bytes). Raises ValueError for what
    the engine cannot address."""
    if not addressable(ptr, ld, itemsize):
        raise ValueError(f"TMA needs a 16-byte aligned matrix with rows a multiple of 16 "
                         f"bytes apart (address {ptr:#x}, row stride {ld} elements of "
                         f"{itemsize} bytes)")
    if swizzle_128b and box[0] * itemsize > SWIZZLE_SPAN:
        raise ValueError(f"a 128-byte swizzled box row holds at most {SWIZZLE_SPAN} bytes "
                         f"(box {box} of {itemsize}-byte elements)")
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    status = _encode_tiled()(
        ctypes.byref(out), _DATA_TYPE[itemsize], u32(2), ctypes.c_void_p(ptr),
        (u64 * 2)(cols, rows), (u64 * 1)(ld * itemsize), (u32 * 2)(*box), (u32 * 2)(1, 1),
        _NO_INTERLEAVE, _SWIZZLE_128B if swizzle_128b else _NO_SWIZZLE,
        _NO_L2_PROMOTION, _ZERO_FILL)
    if status != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {status}) for a "
                           f"{rows} x {cols} matrix, row stride {ld}, box {box}")
