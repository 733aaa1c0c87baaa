"""``nmgen bench`` on the device: every (pattern, shape) through ``dispatch``, checked
against the float64 reference, then timed beside cuBLAS SGEMM, TF32 and BF16 and the
family's reference kernel in this process; the device's ceilings measured first."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..compiler.nvrtc import cupy
from ..compiler.pool import CompilePool
from ..dispatch import Dispatcher, gpu_name
from ..families.base import Config
from ..families.registry import family_of, serving
from ..format import DType, NMMatrix, Pattern
from ..gpus import spec_or_h100
from ..problem import ALayout, Problem
from ..progress import Progress
from ..runtime import check
from ..runtime.device import device_info
from ..runtime.timing import time_in_turns, time_ms
from ..shapes import Shape
from .ceilings import Ceilings, measure_ceilings
from .dense import Dense, dense_gemm
from .results import RTOL, BenchRow

BENCH_BASELINES = (Dense.SGEMM, Dense.TF32, Dense.BF16)  # BenchRow's dense columns


def _problem(p: Pattern, vec: int, layout: ALayout, dtype: DType = DType.F32) -> Problem:
    return Problem(p.n, p.m, vec, layout, device_info().arch, dtype)


def precompile(dispatcher: Dispatcher, patterns: Sequence[Pattern], vec: int,
               shapes: Sequence[Shape], layout: ALayout = ALayout.ROW_MAJOR,
               workers: int = 16, dtype: DType = DType.F32) -> list[str]:
    """Compile every kernel dispatch will pick, in parallel, before anything is timed."""
    configs = {c.name: c for p in patterns
               for c in _references(_problem(p, vec, layout, dtype))}
    for p in patterns:
        for shape in shapes:
            config = dispatcher.decide(_problem(p, vec, layout, dtype), shape).config
            configs[config.name] = config
    with CompilePool(workers) as pool:
        return pool.compile(list(configs.values()))


def _references(problem: Problem) -> list[Config]:
    """The reference kernels of the families serving ``problem``, timed beside the
    dispatched one."""
    return [c for f in serving(problem) if (c := f.reference_config(problem)) is not None]


def random_weight(n: int, m: int, vec: int, depth: int, cols: int,
                  dtype: DType = DType.F32) -> NMMatrix:
    """A fresh random N:M weight, its values drawn on the device (then rounded to
    ``dtype``)."""
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    return check.random_weight(rng, n, m, vec, depth, cols, device_values=True, dtype=dtype)


def dense_float64(b: NMMatrix):
    """``b`` as a dense float64 K×N CuPy array, scattered from the compressed form: the
    bench's check is one float64 GEMM (the per-group reference of ``nmgen.reference``
    takes minutes over 400 large problems)."""
    cp = cupy()
    depth, cols = b.shape
    col = cp.arange(cols)
    rows = cp.asarray(b.kept_rows())[:, col // b.vec]  # dense row of each value, W×N
    values = cp.asarray(b.values[:, :cols].astype(np.float64))  # CuPy takes no bfloat16
    live = rows < depth  # rows of the K padding hold zeros
    dense = cp.zeros((depth, cols), cp.float64)
    dense[rows[live], cp.broadcast_to(col, rows.shape)[live]] = values[live]
    return dense


def run_bench(shapes: Sequence[Shape], patterns: Sequence[Pattern], vec: int,
              dispatcher: Dispatcher, repeat: int = 20,
              layout: ALayout = ALayout.ROW_MAJOR,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
              on_row: Callable[[list[BenchRow]], None] = lambda rows: None,
              ) -> tuple[list[BenchRow], Ceilings]:
    cp = cupy()
    ceilings = measure_ceilings()
    log(f"ceilings on {ceilings.device_name}: {ceilings.fp32_tflops:.1f} TFLOP/s FP32 "
        f"(FFMA loop), {ceilings.dram_gbs:.0f} GB/s DRAM (device copy)")
    errors = precompile(dispatcher, patterns, vec, shapes, layout)
    if errors:
        raise RuntimeError("kernels failed to compile: " + "; ".join(errors[:3]))
    rows: list[BenchRow] = []
    total = len(shapes) * len(patterns)
    for rows_m, cols, depth in shapes:
        a = cp.random.standard_normal((rows_m, depth), dtype=cp.float32)
        w = cp.random.standard_normal((depth, cols), dtype=cp.float32)
        dense = {}
        for kind in BENCH_BASELINES:
            gemm = dense_gemm(kind, a, w)
            dense[kind] = time_ms(lambda i, gemm=gemm: gemm(), repeat=repeat)
        del w
        # K-major A: the same values held K×M, passed as its M×K view. The cuBLAS
        # baselines above stay on the row-major copy, so both layouts share one baseline.
        a_op = a if layout is ALayout.ROW_MAJOR else cp.ascontiguousarray(a.T).T
        for p in patterns:
            row = _one(dispatcher, a_op, p, vec, (rows_m, cols, depth), dense, repeat, layout)
            rows.append(row)
            on_row(rows)
            log(f"[{len(rows)}/{total}] {p.n}:{p.m} {rows_m}x{cols}x{depth}: "
                f"{row.speedup:.2f}x SGEMM ({row.source}) err {row.rel_error:.1e}")
    order = {f"{p.n}:{p.m}": i for i, p in enumerate(patterns)}
    rows.sort(key=lambda r: order[r.pattern])  # stable: shapes stay in file order
    return rows, ceilings


def _one(dispatcher: Dispatcher, a, p: Pattern, vec: int, shape: Shape, dense: dict,
         repeat: int, layout: ALayout) -> BenchRow:
    cp = cupy()
    rows_m, cols, depth = shape
    b = random_weight(p.n, p.m, vec, depth, cols)
    out = cp.full((rows_m, cols), cp.nan, cp.float32)  # poisoned: a skipped write shows
    ref = a.astype(cp.float64) @ dense_float64(b)
    err = check.poisoned_error(lambda: dispatcher(a, b, out=out), out, ref)
    timed = {"dispatch": lambda i: dispatcher(a, b, out=out)}
    problem = _problem(p, vec, layout)
    references = _references(problem)
    core = references[0] if references else None
    if core is not None:  # the hand-picked kernel on the same data, checked the same way
        kernel = dispatcher.kernel(core)
        core_err = check.poisoned_error(lambda: kernel(a, b, out=out), out, ref)
        if not core_err < RTOL:
            raise RuntimeError(f"{core.name} is wrong on {rows_m}x{cols}x{depth}: "
                               f"relative error {core_err:.3g}")
        timed["core"] = lambda i: kernel(a, b, out=out)
    del ref
    # In turns: whichever is timed first right after the float64 check ran on a hot GPU.
    times = time_in_turns(timed, rounds=3, repeat=max(1, repeat // 2))
    ms, core_ms = times["dispatch"], times.get("core")
    decision = dispatcher.decide(problem, shape)
    model_ms = family_of(decision.config).estimate_ms(decision.config,
                                                      spec_or_h100(gpu_name()), shape)
    return BenchRow(f"{p.n}:{p.m}", vec, rows_m, cols, depth, ms, dense[Dense.SGEMM],
                    dense[Dense.TF32], dense[Dense.BF16], model_ms, err, decision.source,
                    decision.config.name, core_ms, core.name if core else "")


def bench_to_dir(shapes: Sequence[Shape], patterns: Sequence[Pattern], vec: int,
                 layout: ALayout, db_url: str | None, out: Path, repeat: int, plots: bool,
                 command: str, quiet: bool = False) -> tuple[list[BenchRow], list[Path]]:
    """``nmgen bench``: the run, its tables (``bench.csv``, ``bench.md``, ``bench.json``)
    and plots in ``out``, the ceilings stored in the database. Returns the rows and the
    files written."""
    from ..gpus import table_name
    from ..store.database import connect, default_url
    from ..store.database import shipped_db as shipped
    from ..store.records import record_ceilings
    from .results import write_all, write_csv

    info = device_info()
    store = connect(db_url or default_url())  # made now: the dispatcher reads it first
    shipped_url = [f"sqlite:///{shipped()}"] if shipped().exists() else []
    dispatcher = Dispatcher([db_url, *shipped_url] if db_url else None)  # yours, then ours
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "bench.partial.csv"  # rows so far: a cut run still leaves them
    def on_row(rows: list[BenchRow]) -> None:
        write_csv(rows, partial)
        bar.advance()

    with Progress(len(shapes) * len(patterns), "problems", quiet) as bar:
        rows, ceilings = run_bench(shapes, patterns, vec, dispatcher, repeat=repeat,
                                   layout=layout, on_row=on_row)
    partial.unlink(missing_ok=True)
    gpu = table_name(info.name)
    record_ceilings(store, gpu, info.name, ceilings.fp32_tflops, ceilings.dram_gbs)
    meta = {"device": info.name, "gpu": gpu, "cuda_runtime": info.cuda_version,
            "a_layout": layout.value, "command": command,
            "seconds": round(time.monotonic() - start, 1),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    ceil = {"fp32_tflops": ceilings.fp32_tflops, "dram_gbs": ceilings.dram_gbs}
    paths = write_all(rows, out, ceil, meta)
    if plots:
        from .plots import all_plots

        paths += all_plots(rows, ceil, out, info.name)
    return rows, paths
