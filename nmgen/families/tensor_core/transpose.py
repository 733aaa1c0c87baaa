"""Row-major A copied K-major before a tensor-core kernel that reads it so (``a_copied``
configurations): the transpose kernel's geometry and template arguments (its source is the
shared ``transpose.cuh.j2``) and the launch plan of the pair (its time:
``model.transpose_ms``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import PreparedWeight
from ..plan import A, Call, Device, Launch, LaunchPlan, Pointer, Scalar, Workspace
from . import launch
from .config import TensorCoreConfig

A_COPY = "a_copy"
# A block of THREADS threads (8 x 8 elements each, warps of 64 rows of M by 32 of K)
# covers TILE_M rows of M by TILE_K of K.
THREADS = 256
TILE_M = 128
TILE_K = THREADS // 32 // (TILE_M // 64) * 32


def entry(config: TensorCoreConfig) -> str:
    """The transpose kernel's name: the main kernel's, ``_transpose`` added."""
    return config.name + "_transpose"


def template_arguments() -> dict[str, Any]:
    return {"transpose_tile_m": TILE_M, "transpose_tile_k": TILE_K,
            "transpose_threads": THREADS}


def plan(config: TensorCoreConfig, weight: PreparedWeight, shape: tuple[int, int], call: Call,
         device: Device) -> LaunchPlan:
    """The transpose kernel writing the K-major copy into a workspace (rows padded to 16
    bytes), then the main kernel reading it."""
    depth, _ = shape
    ldt = -(-call.rows // launch.VECTOR_ELEMS) * launch.VECTOR_ELEMS  # 16-byte rows
    vec = launch.a_vectorized(call)  # 16-byte reads of A
    transpose = Launch(
        entry(config), (-(-ldt // TILE_M), -(-depth // TILE_K), 1), THREADS, 0,
        (Pointer(A), Pointer(A_COPY), Scalar("i32", call.rows), Scalar("i32", depth),
         Scalar("i64", call.lda), Scalar("i64", ldt), Scalar("i32", int(vec))))
    # The kernel reads the copy: K-major, ldt apart, workspaces 256-byte aligned.
    main = launch.plan(config, weight, shape, Call(call.rows, ldt, True), device, A_COPY)
    return LaunchPlan((transpose, *main.launches),
                      (Workspace(A_COPY, depth * ldt, np.dtype(np.uint16)),))
