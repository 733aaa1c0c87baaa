"""The wgmma family's launch plan: the tensor-core kernel's (``tensor_core.launch``), after
a transpose kernel for row-major A, which writes the K-major copy the kernel reads into a
workspace (rows padded to 16 bytes)."""

from __future__ import annotations

import numpy as np

from ..base import PreparedWeight
from ..plan import A, Call, Device, Launch, LaunchPlan, Pointer, Scalar, Workspace
from ..tensor_core import launch as tc_launch
from .config import WgmmaConfig
from .render import TRANSPOSE_THREADS, TRANSPOSE_TILE_K, TRANSPOSE_TILE_M, transpose_entry

A_COPY = "a_copy"
ELEMS_16B = 8  # 16-bit elements of 16 bytes


def plan(config: WgmmaConfig, weight: PreparedWeight, shape: tuple[int, int], call: Call,
         device: Device) -> LaunchPlan:
    if not config.a_copied:
        return tc_launch.plan(config, weight, shape, call, device)
    depth, _ = shape
    ldt = -(-call.rows // ELEMS_16B) * ELEMS_16B  # the copy's rows, 16-byte aligned
    vec = call.a_aligned and call.lda % ELEMS_16B == 0  # 16-byte reads of A
    transpose = Launch(
        transpose_entry(config), (-(-ldt // TRANSPOSE_TILE_M), -(-depth // TRANSPOSE_TILE_K), 1),
        TRANSPOSE_THREADS, 0,
        (Pointer(A), Pointer(A_COPY), Scalar("i32", call.rows), Scalar("i32", depth),
         Scalar("i64", call.lda), Scalar("i64", ldt), Scalar("i32", int(vec))))
    # The kernel reads the copy: K-major, ldt apart, workspaces 256-byte aligned.
    main = tc_launch.plan(config, weight, shape, Call(call.rows, ldt, True), device, A_COPY)
    return LaunchPlan((transpose, *main.launches),
                      (Workspace(A_COPY, depth * ldt, np.dtype(np.uint16)),))
