"""Correctness check and timing of one problem on the device (what a tuning trial does).

Random inputs (fresh per problem), a float64 reference computed once, the output
poisoned with NaN before every checked launch, and CUDA-event timing with rotating A
buffers when the working set fits in L2 (docs/design.md §4).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compiler.nvrtc import cupy
from ..format import DType, NMMatrix, reference
from ..problem import ALayout, Problem
from .device import empty_like_caller, operand
from .launch import Kernel
from .timing import time_ms

L2_BYTES = 50 * 2**20
# Relative error (Frobenius norm, against float64 of the rounded inputs) a correct kernel
# stays under: fp32 accumulation of K products, output rounded to the dtype.
TOLERANCE = {DType.F32: 1e-5, DType.F16: 2e-3, DType.BF16: 1e-2}


def tolerance(dtype: DType) -> float:
    return TOLERANCE[dtype]


def random_weight(rng: np.random.Generator, n: int, m: int, vec: int, depth: int,
                  cols: int, device_values: bool = False, dtype: DType = DType.F32
                  ) -> NMMatrix:
    """A random N:M weight built in compressed form (pruning a large dense matrix on the
    host costs seconds per tuned shape): every (window, group) keeps n random rows, rows of
    the K padding only where its window has fewer than n real ones. ``device_values``
    draws the values on the GPU (the 100 Llama shapes' values take minutes on the host)."""
    windows, groups = -(-depth // m), -(-cols // vec)
    keys = rng.random((windows, groups, m))
    keys[-1, :, depth - (windows - 1) * m:] = 2.0  # the last window's padding: kept last
    keep = np.sort(np.argsort(keys, axis=-1)[..., :n], axis=-1)
    indices = keep.transpose(0, 2, 1).reshape(windows * n, groups)
    if device_values:
        values = _device_rng(rng).standard_normal((windows * n, cols),
                                                  dtype=np.float32).get()
    else:
        values = rng.standard_normal((windows * n, cols), dtype=np.float32)
    padding = (np.arange(windows * n) // n * m)[:, None] + indices >= depth  # W x G
    values[padding[:, np.arange(cols) // vec]] = 0.0  # what the padding holds: zeros
    return NMMatrix.from_compressed(values, indices, (n, m), vec, (depth, cols), dtype=dtype)


def _device_rng(rng: np.random.Generator) -> Any:
    """A CuPy generator seeded from ``rng``: drawing on the device is ~10x faster than on
    the host for the large shapes, and stays reproducible from one seed."""
    return cupy().random.RandomState(int(rng.integers(1 << 31)))


def poisoned_error(launch: Callable[[], object], out: Any, ref: Any,
                   ref_norm: float | None = None) -> float:
    """Relative error of what ``launch`` writes into ``out`` (NaN-poisoned first, so an
    element it skips shows) against the float64 ``ref``; ``inf`` for a non-finite one."""
    cp = cupy()
    if hasattr(out, "fill_"):  # torch
        out.fill_(float("nan"))
    else:
        out.fill(float("nan"))
    launch()
    if ref_norm is None:
        ref_norm = max(float(cp.linalg.norm(ref)), 1e-30)
    err = float(cp.linalg.norm(as_float64(out) - ref)) / ref_norm
    return err if np.isfinite(err) else float("inf")


def as_float64(x: Any) -> Any:
    """A CuPy float64 copy of a CuPy array or a CUDA torch tensor."""
    if hasattr(x, "double") and hasattr(x, "is_cuda"):  # torch
        return cupy().asarray(x.double())
    return x.astype(cupy().float64)


def device_array(x: Any, dtype: DType) -> Any:
    """``x``, a float32 CuPy array, in ``dtype``: CuPy for fp32 and fp16, a torch tensor for
    bf16 (CuPy has none)."""
    if dtype is DType.F32:
        return x
    if dtype is DType.F16:
        return x.astype(cupy().float16)
    import torch

    return torch.as_tensor(x, device="cuda").to(torch.bfloat16)


class ProblemBench:
    """One problem (pattern, L, layout, dtype, M, N, K) with fresh random data on the
    device. Where the weight is small beside the L2 (decode shapes), timed calls rotate
    through copies of its device layout that span twice the L2, as a model's layers do:
    a weight read from L2 would time a kernel on bandwidth no model gives it."""

    def __init__(self, problem: Problem, rows: int, cols: int, depth: int,
                 seed: int | None = None):
        rng = np.random.default_rng(seed if seed is not None
                                    else int.from_bytes(os.urandom(4), "little"))
        self.problem = problem
        self.shape = (rows, cols, depth)
        dtype = problem.dtype
        self.weight = random_weight(rng, problem.n, problem.m, problem.vec, depth, cols,
                                    device_values=True, dtype=dtype)
        size = dtype.itemsize
        working_set = size * (rows * depth + rows * cols) + self.weight.values.nbytes
        copies = max(1, min(8, -(-2 * L2_BYTES // max(working_set, 1))))
        device_rng = _device_rng(rng)
        self.a_buffers = [self._make_a(device_rng, problem.a_layout) for _ in range(copies)]
        # the same values, laid out on the device once a copy (each has its own layouts)
        weight_copies = max(1, min(16, -(-2 * L2_BYTES // max(self.weight.values.nbytes, 1))))
        self.weights = [self.weight, *(self.weight.copy() for _ in range(weight_copies - 1))]
        first = self.a_buffers[0]
        self.out = empty_like_caller(first, operand(first, "a"), (rows, cols), dtype)
        self._ref: Any = None

    def _make_a(self, device_rng: Any, layout: ALayout) -> Any:
        rows, _, depth = self.shape
        if layout is ALayout.ROW_MAJOR:
            a = device_rng.standard_normal((rows, depth), dtype=np.float32)
            return device_array(a, self.problem.dtype)
        a = device_rng.standard_normal((depth, rows), dtype=np.float32)
        return device_array(a, self.problem.dtype).T

    def error(self, kernel: Kernel) -> float:
        """Relative error against the float64 reference (NaN-poisoned output)."""
        cp = cupy()
        if self._ref is None:
            self._ref = reference(as_float64(self.a_buffers[0]), self.weight)
            self._ref_norm = max(float(cp.linalg.norm(self._ref)), 1e-30)
        return poisoned_error(lambda: kernel(self.a_buffers[0], self.weight, out=self.out),
                              self.out, self._ref, self._ref_norm)

    def launcher(self, kernel: Kernel) -> Callable[[int], object]:
        """``fn(i)``: one launch of ``kernel`` on the ``i``-th A buffer and weight copy
        (rotating); every weight copy is laid out on the device here, before any timing."""
        buffers, weights, out = self.a_buffers, self.weights, self.out
        for weight in weights:
            kernel(buffers[0], weight, out=out)
        return lambda i: kernel(buffers[i % len(buffers)], weights[i % len(weights)], out=out)

    def time_ms(self, kernel: Kernel, warmup: int = 3, repeat: int = 15,
                budget_ms: float = math.inf) -> float:
        return time_ms(self.launcher(kernel), warmup=warmup, repeat=repeat,
                       budget_ms=budget_ms)


@dataclass(frozen=True)
class Timed:
    """One candidate kernel on a problem's fresh data: its median time where it was
    correct, otherwise why it has none (``wrong``: it ran, and missed the tolerance)."""

    config: Any
    time_ms: float | None
    error: str | None = None
    wrong: bool = False


def time_candidates(problem: Problem, shape: tuple[int, int, int], configs: list[Any],
                    rounds: int = 3, budget_ms: float = 200.0) -> list[Timed]:
    """Check each of ``configs`` against float64 on fresh random data of ``problem`` at
    ``shape`` (M, N, K), then time the correct ones ``rounds`` times in turns, their
    repeats sized to about ``budget_ms`` of GPU time in all (median of each)."""
    from .timing import time_in_turns

    bench = ProblemBench(problem, *shape)
    failed: dict[str, Timed] = {}
    kernels: dict[str, Kernel] = {}
    for config in configs:
        try:
            kernel = Kernel(config)
            err = bench.error(kernel)
        except Exception as exc:  # a kernel that fails to compile or launch is a result
            failed[config.name] = Timed(config, None, f"{type(exc).__name__}: {exc}")
            continue
        if err < tolerance(problem.dtype):
            kernels[config.name] = kernel
        else:
            failed[config.name] = Timed(config, None, f"relative error {err:.3g}", True)
    times: dict[str, float] = {}
    if kernels:
        first = {name: bench.time_ms(k, warmup=1, repeat=3) for name, k in kernels.items()}
        repeat = int(budget_ms / (len(kernels) * rounds * max(max(first.values()), 1e-3)))
        times = time_in_turns({name: bench.launcher(k) for name, k in kernels.items()},
                              rounds=rounds, repeat=max(3, min(15, repeat)))
    return [failed.get(c.name) or Timed(c, times[c.name]) for c in configs]
