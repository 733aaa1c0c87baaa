"""``nmgen bench`` on the device: every (pattern, shape) through ``dispatch``, checked
against the float64 reference, then timed beside cuBLAS SGEMM, TF32 and BF16 in this
process; the device's ceilings measured first."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from ..config import ALayout
from ..dispatch import Dispatcher, problem_key
from ..format import Pattern, reference
from ..model import GPUS, estimate, gpu_spec
from ..results import BenchRow
from .ceilings import Ceilings, measure_ceilings
from .dense import Dense, dense_gemm
from .launch import _cupy
from .measure import random_weight
from .timing import CompilePool, time_ms

Shape = tuple[int, int, int]


def _spec(gpu: str):
    return GPUS[gpu] if gpu in GPUS else replace(gpu_spec("h100"), name=gpu)


def precompile(dispatcher: Dispatcher, patterns: Sequence[Pattern], vec: int,
               shapes: Sequence[Shape], workers: int = 16) -> list[str]:
    """Compile every kernel dispatch will pick, in parallel, before anything is timed."""
    configs = {}
    for p in patterns:
        for rows, cols, depth in shapes:
            key = problem_key(p.n, p.m, vec, ALayout.ROW_MAJOR, rows, cols, depth)
            config = dispatcher.decide(key).config
            configs[config.name] = config
    with CompilePool(workers) as pool:
        return pool.compile(list(configs.values()))


def run_bench(shapes: Sequence[Shape], patterns: Sequence[Pattern], vec: int,
              dispatcher: Dispatcher, repeat: int = 20,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)
              ) -> tuple[list[BenchRow], Ceilings]:
    cp = _cupy()
    ceilings = measure_ceilings()
    log(f"ceilings on {ceilings.device_name}: {ceilings.fp32_tflops:.1f} TFLOP/s FP32 "
        f"(FFMA loop), {ceilings.dram_gbs:.0f} GB/s DRAM (device copy)")
    errors = precompile(dispatcher, patterns, vec, shapes)
    if errors:
        raise RuntimeError("kernels failed to compile: " + "; ".join(errors[:3]))
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    rows: list[BenchRow] = []
    total = len(shapes) * len(patterns)
    for rows_m, cols, depth in shapes:
        a = cp.asarray(rng.standard_normal((rows_m, depth), dtype=np.float32))
        w = cp.asarray(rng.standard_normal((depth, cols), dtype=np.float32))
        dense = {}
        for kind in Dense:
            gemm = dense_gemm(kind, a, w)
            dense[kind] = time_ms(lambda i, gemm=gemm: gemm(), repeat=repeat)
        del w
        for p in patterns:
            row = _one(dispatcher, rng, a, p, vec, (rows_m, cols, depth), dense, repeat)
            rows.append(row)
            log(f"[{len(rows)}/{total}] {p.n}:{p.m} {rows_m}x{cols}x{depth}: "
                f"{row.speedup:.2f}x SGEMM ({row.source}) err {row.rel_error:.1e}")
    order = {f"{p.n}:{p.m}": i for i, p in enumerate(patterns)}
    rows.sort(key=lambda r: order[r.pattern])  # stable: shapes stay in file order
    return rows, ceilings


def _one(dispatcher: Dispatcher, rng: np.random.Generator, a, p: Pattern, vec: int,
         shape: Shape, dense: dict, repeat: int) -> BenchRow:
    cp = _cupy()
    rows_m, cols, depth = shape
    b = random_weight(rng, p.n, p.m, vec, depth, cols)
    out = cp.full((rows_m, cols), cp.nan, cp.float32)  # poisoned: a skipped write shows
    dispatcher(a, b, out=out)
    ref = reference(a, b)
    err = float(cp.linalg.norm(out - ref) / max(float(cp.linalg.norm(ref)), 1e-30))
    err = err if np.isfinite(err) else float("inf")
    ms = time_ms(lambda i: dispatcher(a, b, out=out), repeat=repeat)
    key = problem_key(p.n, p.m, vec, ALayout.ROW_MAJOR, rows_m, cols, depth)
    decision = dispatcher.decide(key)
    model_ms = estimate(decision.config, _spec(key.gpu), rows_m, cols, depth).time_ms
    return BenchRow(f"{p.n}:{p.m}", vec, rows_m, cols, depth, ms, dense[Dense.SGEMM],
                    dense[Dense.TF32], dense[Dense.BF16], model_ms, err, decision.source,
                    decision.config.name)
