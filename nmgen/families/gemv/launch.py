"""The decode family's launch plan: the main kernel (a grid of column blocks x row blocks x
K slices) and, with split-K, the reduction of the slices' FP32 partial sums."""

from __future__ import annotations

from ..base import PreparedWeight
from ..plan import A, C, Call, Device, Launch, LaunchPlan, Pointer, Scalar, Workspace
from .config import GemvConfig

SPLIT_SUMS = "split_sums"
REDUCE_THREADS = 256


def plan(config: GemvConfig, weight: PreparedWeight, shape: tuple[int, int], call: Call,
         device: Device) -> LaunchPlan:
    c = config
    depth, cols = shape
    values, indices = weight.arrays["values"], weight.arrays["indices"]
    chunks = -(-depth // c.kc)
    per_split = -(-chunks // c.split_k)
    out = SPLIT_SUMS if c.split_k > 1 else C
    grid = (-(-cols // c.columns), -(-call.rows // c.rows), c.split_k)
    i32 = lambda v: Scalar("i32", v)  # noqa: E731
    i64 = lambda v: Scalar("i64", v)  # noqa: E731
    main = Launch(c.name, grid, c.threads, 0, (
        Pointer(A), Pointer("values"), Pointer("indices"), Pointer(out), i32(call.rows),
        i32(cols), i32(depth), i64(call.lda), i64(values.shape[1]), i64(indices.shape[1]),
        i32(chunks), i32(per_split)))
    if c.split_k == 1:
        return LaunchPlan((main,))
    blocks = max(1, min(-(-call.rows * cols // REDUCE_THREADS), device.sms * 8))
    reduce = Launch(c.name + "_reduce", (blocks, 1, 1), REDUCE_THREADS, 0, (
        Pointer(SPLIT_SUMS), Pointer(C), i32(call.rows), i32(cols)))
    return LaunchPlan((main, reduce), (Workspace(SPLIT_SUMS, c.split_k * call.rows * cols),))
