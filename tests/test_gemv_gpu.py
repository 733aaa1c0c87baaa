"""GPU: the decode family's software pipeline and wide sum. Configurations that load
groups of rows ahead of their FMAs (``prefetch`` 1 and 2), and split-K ones whose last
block loads many slices' sums at once (``wide_sum``), against float64 and against the same
configuration without, which makes the same FMAs and additions in the same order: equal
bit for bit. Every dtype and A layout, several indices a thread's row, an ``n`` that is no power of
two, lanes whose rows end inside the ring, columns that end inside a block, the output
poisoned with NaN."""

from __future__ import annotations

import numpy as np
import pytest

from nmgen.families.gemv.config import GemvConfig
from nmgen.runtime.check import tolerance
from nmgen.runtime.launch import Kernel

from .gpu_suite import SEED, compile_ahead
from .test_epilogue_gpu import float64, make_a

pytestmark = pytest.mark.gpu

WITHOUT_PREFETCH = [
    GemvConfig(8, 32, 128, rows=1, col_threads=128, lanes=2, cols=8, unroll=8, split_k=8,
               dtype="bf16"),
    GemvConfig(8, 32, 128, rows=4, col_threads=64, lanes=2, cols=8, unroll=4, split_k=2,
               dtype="bf16", a_layout="km"),
    GemvConfig(8, 32, 128, rows=2, col_threads=64, lanes=4, cols=4, unroll=2, split_k=8,
               dtype="f16"),
    GemvConfig(2, 4, 16, rows=4, col_threads=64, lanes=2, cols=1, unroll=8, split_k=2,
               dtype="f16", a_layout="km"),
    GemvConfig(4, 16, 32, rows=1, col_threads=128, lanes=1, cols=4, unroll=4, split_k=4),
    GemvConfig(16, 32, 128, rows=8, col_threads=32, lanes=2, cols=2, unroll=2,
               a_layout="km"),
    GemvConfig(8, 32, 2, rows=2, col_threads=64, lanes=2, cols=4, unroll=4, split_k=3),
    GemvConfig(3, 7, 8, rows=1, col_threads=32, lanes=4, cols=8, unroll=4, split_k=5,
               dtype="bf16"),
]
PAIRS = [(c, c.replace(prefetch=p)) for c in WITHOUT_PREFETCH for p in (1, 2)] + [
    (c, c.replace(wide_sum=1)) for c in WITHOUT_PREFETCH if c.split_k > 1] + [
    (c.replace(rows=16, lanes=1, cols=4, split_k=9), c.replace(rows=16, lanes=1, cols=4,
                                                              split_k=9, wide_sum=1))
    for c in WITHOUT_PREFETCH[:1]]  # 64 outputs a thread: batches of four
# (M, N, K): M = 1 and a row block's edge, N and K that end inside a block and a window
SHAPES = [(1, 333, 257), (5, 1000, 4096 + 13), (17, 129, 700), (64, 2056, 3001)]


def run(kernel: Kernel, weight, a, rows: int, cols: int):
    import cupy as cp

    from nmgen.runtime.check import device_array

    out = device_array(cp.full((rows, cols), np.nan, np.float32), kernel.config.dtype)
    kernel(a, weight, out=out)
    return float64(out)


def test_prefetch_and_wide_sum_match_float64_and_the_kernel_without_them(gpu_cases):
    import cupy as cp

    from nmgen.runtime.check import random_weight

    assert not compile_ahead([c for pair in PAIRS for c in pair])
    rng = np.random.default_rng(SEED)
    wrong = []
    for plain, ahead in PAIRS:
        for rows, cols, depth in SHAPES:
            weight = random_weight(rng, plain.n, plain.m, plain.vec, depth, cols,
                                   dtype=plain.dtype)
            a = make_a(rng, rows, depth, plain.a_layout, plain.dtype)
            ref = float64(a) @ cp.asarray(weight.to_dense().astype(np.float64))
            want = run(Kernel(plain), weight, a, rows, cols)
            got = run(Kernel(ahead), weight, a, rows, cols)
            err = float(cp.linalg.norm(got - ref)) / max(float(cp.linalg.norm(ref)), 1e-30)
            gpu_cases["kernel_cases"] += 2
            if not err < tolerance(plain.dtype) or not bool((got == want).all()):
                wrong.append(f"{ahead.name} M={rows} N={cols} K={depth}: error {err:.3g}, "
                             f"{int((got != want).sum())} values unlike {plain.name}'s")
    assert not wrong, f"seed {SEED}: {len(wrong)} wrong:\n" + "\n".join(wrong[:20])
