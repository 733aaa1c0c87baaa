"""``nmgen bench-untuned``: what a problem nobody tuned runs at, against its full tune.

For every (pattern, L, shape) at one dtype: the kernel dispatch picks on first use from
databases holding none of these problems (``untuned``: a transfer or the model), the
winner of a full tune of the same problem (``tuned``, an exact record of another
database) and cuBLAS's dense GEMM of the dtype (``dense``: SGEMM for FP32, BF16 or FP16
tensor cores with FP32 accumulation), checked against float64 and timed in turns in one
process.
With ``quick``, the kernels a quick tune (``dispatch(..., tune="quick")``) would time are
timed beside them, and ``quick_ms`` is the fastest. Planning (which kernels, the checks
that the databases are what they claim) and the tables run without a GPU.
"""

from __future__ import annotations

import csv
import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..dispatch import Decision, Dispatcher
from ..families.base import Config
from ..format import DType, NMMatrix, Pattern
from ..gpus import Arch
from ..problem import ALayout, Problem
from ..shapes import Shape
from .dense import dense_of
from .report import CSV_DTYPE, geomean, markdown_table

UNTUNED_SOURCES = ("transfer", "other_gpu", "model")  # no record of this GPU's own
TUNED_SOURCES = ("exact", "exact-other-cuda")


@dataclass(frozen=True)
class Planned:
    """One comparison: the problem, the shape, the untuned and tuned decisions and the
    quick tune's candidates (empty unless asked for)."""

    problem: Problem
    shape: Shape
    untuned: Decision
    tuned: Decision
    quick: tuple[Config, ...] = ()


@dataclass(frozen=True)
class UntunedRow:
    """Milliseconds (median of timings in turns) of one (pattern, L, shape)."""

    pattern: str
    vec: int
    M: int
    N: int
    K: int
    untuned_ms: float
    tuned_ms: float
    dense_ms: float
    quick_ms: float | None = None
    untuned_source: str = ""  # transfer, other_gpu or model
    untuned_origin: str = ""  # the tuned problem (or GPU) it came from, or "model"
    untuned_config: str = ""
    tuned_config: str = ""
    dtype: str = "fp32"  # of A, the weight and the output: fp32, bf16 or fp16

    @property
    def dense(self) -> str:
        """The dense baseline of ``dense_ms``: cuBLAS's GEMM of the row's dtype."""
        return dense_of(DType.parse(self.dtype)).label

    @property
    def ratio(self) -> float:
        """Untuned time over tuned time (1.0: as fast as a full tune)."""
        return self.untuned_ms / self.tuned_ms


FIELDS = [f.name for f in dataclasses.fields(UntunedRow)]


def parse_problems(text: str) -> list[tuple[Pattern, int]]:
    """``2:4/32,8:32/128``: patterns with their vector lengths."""
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        pattern, _, vec = item.partition("/")
        if not vec.isdigit() or int(vec) < 1:
            raise ValueError(f"--problems {item!r}: expected PATTERN/L, e.g. 8:32/128")
        out.append((Pattern.parse(pattern), int(vec)))
    if not out:
        raise ValueError(f"--problems {text!r}: no problem given (e.g. 2:4/32,8:32/128)")
    return out


def plan(problems: Sequence[tuple[Pattern, int]], shapes: Sequence[Shape],
         untuned: Dispatcher, tuned: Dispatcher, arch: Arch,
         layout: ALayout = ALayout.ROW_MAJOR,
         dtype: DType = DType.F32, quick: bool = False) -> list[Planned]:
    """The kernels of every comparison. Raises where the untuned databases hold a record
    of a problem (it would not be untuned), the tuned one lacks an exact record or holds
    records of an older generator (its tuned choice would skip them)."""
    for url, count in tuned.older_generator_problems().items():
        raise ValueError(f"the tuned database {url} holds {count} problems of an older "
                         "generator: `nmgen carry --from-rev REV --db URL` first")
    out, held, missing = [], [], []
    for pattern, vec in problems:
        problem = Problem(pattern.n, pattern.m, vec, layout, arch, dtype)
        for shape in shapes:
            first, best = untuned.decide(problem, shape), tuned.decide(problem, shape)
            if first.source not in UNTUNED_SOURCES:
                held.append(f"{problem} {shape} ({first.source})")
            if best.source not in TUNED_SOURCES:
                missing.append(f"{problem} {shape}")
            candidates = tuple(untuned.quick_candidates(problem, shape)) if quick else ()
            out.append(Planned(problem, shape, first, best, candidates))
    if held:
        raise ValueError(f"the untuned databases hold records of {len(held)} problems, "
                         f"e.g. {held[0]}")
    if missing:
        raise ValueError(f"the tuned database lacks {len(missing)} problems, e.g. "
                         f"{missing[0]}: tune them first")
    return out


def plan_table(planned: Sequence[Planned]) -> str:
    """The kernels each comparison times."""
    rows = [[p.problem.pattern, p.problem.vec, CSV_DTYPE[p.problem.dtype],
             "x".join(map(str, p.shape)), f"{p.untuned.source} ({p.untuned.origin or '-'})",
             p.untuned.config.name, p.tuned.config.name, len(p.quick)] for p in planned]
    return markdown_table(["pattern", "L", "dtype", "shape", "untuned from", "untuned kernel",
                           "tuned kernel", "quick candidates"], rows)


def row_of(planned: Planned, times: dict[str, float]) -> UntunedRow:
    """The row of a comparison from its timings (``untuned``, ``tuned``, ``dense`` and
    any quick candidates by kernel name)."""
    p, (m, n, k) = planned.problem, planned.shape
    quick = [times[c.name] for c in planned.quick if c.name in times]
    return UntunedRow(p.pattern, p.vec, m, n, k, times["untuned"], times["tuned"],
                      times["dense"], min(quick) if quick else None, planned.untuned.source,
                      planned.untuned.origin, planned.untuned.config.name,
                      planned.tuned.config.name, CSV_DTYPE[p.dtype])


def write_csv(rows: Sequence[UntunedRow], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow(dataclasses.asdict(row))


def read_csv(path: Path) -> list[UntunedRow]:
    numbers = {"vec": int, "M": int, "N": int, "K": int, "untuned_ms": float,
               "tuned_ms": float, "dense_ms": float}
    rows = []
    with path.open(newline="") as f:
        for raw in csv.DictReader(f):
            values = {k: numbers[k](v) if k in numbers else v for k, v in raw.items()}
            values["quick_ms"] = float(raw["quick_ms"]) if raw["quick_ms"] else None
            rows.append(UntunedRow(**values))
    return rows


def summary_table(rows: Sequence[UntunedRow]) -> str:
    """Per (pattern, L, dtype): geometric means of untuned/tuned, quick/tuned and the
    speedups over the dense baseline (named in its column), and the worst untuned/tuned."""
    groups: dict[tuple[str, int, str], list[UntunedRow]] = {}
    for row in rows:
        groups.setdefault((row.pattern, row.vec, row.dtype), []).append(row)
    table = []
    for (pattern, vec, dtype), sel in groups.items():
        quick = [r.quick_ms / r.tuned_ms for r in sel if r.quick_ms]
        table.append([pattern, vec, dtype, len(sel), f"{geomean([r.ratio for r in sel]):.3f}",
                      f"{max(r.ratio for r in sel):.3f}",
                      f"{geomean(quick):.3f}" if quick else "-", sel[0].dense,
                      f"{geomean([r.dense_ms / r.untuned_ms for r in sel]):.2f}x",
                      f"{geomean([r.dense_ms / r.tuned_ms for r in sel]):.2f}x"])
    return markdown_table(["pattern", "L", "dtype", "shapes", "untuned / tuned (geomean)",
                           "worst", "quick / tuned", "dense (cuBLAS)", "untuned × dense",
                           "tuned × dense"], table)


def run(planned: Sequence[Planned], repeat: int = 20,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
        on_row: Callable[[list[UntunedRow]], None] = lambda rows: None) -> list[UntunedRow]:
    """On the GPU: every comparison checked against float64, then timed in turns."""
    from ..compiler.pool import CompilePool
    from ..runtime.launch import Kernel

    configs = {c.name: c for p in planned
               for c in (p.untuned.config, p.tuned.config, *p.quick)}
    with CompilePool(16) as pool:
        errors = pool.compile(list(configs.values()))
    if errors:
        raise RuntimeError("kernels failed to compile: " + "; ".join(errors[:3]))
    kernels = {name: Kernel(c) for name, c in configs.items()}
    rows: list[UntunedRow] = []
    for item in planned:
        rows.append(row_of(item, _timings(item, kernels, repeat)))
        on_row(rows)
        r = rows[-1]
        log(f"[{len(rows)}/{len(planned)}] {r.pattern} L={r.vec} {r.dtype} "
            f"{r.M}x{r.N}x{r.K}: untuned {r.untuned_ms:.4f} ms ({r.untuned_source}), tuned "
            f"{r.tuned_ms:.4f} ms, {r.dense} {r.dense_ms:.4f} ms")
    return rows


def _timings(item: Planned, kernels: dict, repeat: int) -> dict[str, float]:
    """One comparison's kernels on fresh data in the problem's dtype, each checked
    against float64 of the rounded inputs (output poisoned), then timed in turns with
    cuBLAS's GEMM of that dtype on the same A values."""
    from ..runtime import check
    from ..runtime.timing import time_in_turns

    (m, n, k), p = item.shape, item.problem
    a, b, out, ref, dense = _fresh_data(p, item.shape)
    timed: dict[str, Callable[[int], object]] = {"dense": lambda i: dense()}
    named = {"untuned": item.untuned.config, "tuned": item.tuned.config,
             **{c.name: c for c in item.quick}}
    for label, config in named.items():
        call = _call(kernels[config.name], a, b, out)
        err = check.poisoned_error(lambda call=call: call(0), out, ref)
        if not err < check.tolerance(p.dtype):
            raise RuntimeError(f"{config.name} is wrong on {m}x{n}x{k}: relative error "
                               f"{err:.3g}")
        timed[label] = call
    del ref
    return time_in_turns(timed, rounds=3, repeat=max(1, repeat // 2))


def _fresh_data(problem: Problem, shape: Shape) -> tuple[Any, NMMatrix, Any, Any,
                                                         Callable[[], Any]]:
    """Random A (in the problem's dtype and layout) and weight, the output, the float64
    product of the rounded inputs, and cuBLAS's GEMM of the dtype on the same A values
    (row-major, its output in that dtype too) with a dense weight of its own."""
    from ..compiler.nvrtc import cupy
    from ..runtime.check import as_float64
    from ..runtime.device import empty_like_caller, operand
    from .dense import dense_gemm
    from .run import dense_float64, random_weight

    cp = cupy()
    (m, n, k), p = shape, problem
    a32 = cp.random.standard_normal((m, k), dtype=cp.float32)
    w32 = cp.random.standard_normal((k, n), dtype=cp.float32)
    dense = dense_gemm(dense_of(p.dtype), a32, w32, same_dtype_out=True)
    a = _a_operand(a32, p.dtype, p.a_layout)
    b = random_weight(p.n, p.m, p.vec, k, n, p.dtype)
    out = empty_like_caller(a, operand(a, "a"), (m, n), p.dtype)
    return a, b, out, as_float64(a) @ dense_float64(b), dense


def _a_operand(a: Any, dtype: DType, layout: ALayout) -> Any:
    """The float32 M×K ``a`` in ``dtype`` (CuPy; a torch tensor for bf16) and ``layout``:
    K-major is the same values held K×M, passed as its M×K view."""
    from ..compiler.nvrtc import cupy
    from ..runtime.check import device_array

    if layout is ALayout.K_MAJOR:
        return device_array(cupy().ascontiguousarray(a.T), dtype).T
    return device_array(a, dtype)


def _call(kernel, a, b, out) -> Callable[[int], object]:
    return lambda i: kernel(a, b, out=out)


def untuned_to_dir(planned: Sequence[Planned], out: Path, repeat: int, command: str,
                   quiet: bool = False) -> tuple[list[UntunedRow], list[Path]]:
    """The run on this GPU; ``untuned.csv`` (rows so far in ``untuned.partial.csv`` while
    it runs), ``untuned.md`` and ``untuned.json`` (each with the dtype and its dense
    baseline) in ``out``."""
    import json
    import time

    from ..progress import Progress
    from ..runtime.device import device_info

    out.mkdir(parents=True, exist_ok=True)
    partial = out / "untuned.partial.csv"
    start = time.monotonic()
    with Progress(len(planned), "problems", quiet) as bar:
        def on_row(rows: list[UntunedRow]) -> None:
            write_csv(rows, partial)
            bar.advance()

        rows = run(planned, repeat, on_row=on_row)
    partial.unlink(missing_ok=True)
    paths = [out / "untuned.csv", out / "untuned.md", out / "untuned.json"]
    write_csv(rows, paths[0])
    dtype, dense = dtype_and_baseline(planned)
    paths[1].write_text(f"# Untuned against tuned, {dtype} (dense: {dense})\n\n"
                        + summary_table(rows) + "\n" + rows_table(rows))
    info = device_info()
    paths[2].write_text(json.dumps({
        "device": info.name, "cuda_runtime": info.cuda_version, "command": command,
        "dtype": dtype, "dense": dense,
        "seconds": round(time.monotonic() - start, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=1) + "\n")
    return rows, paths


def dtype_and_baseline(planned: Sequence[Planned]) -> tuple[str, str]:
    """The problems' dtype (``plan`` makes them of one) and the dense baseline timed with
    them, as ``untuned.md`` and ``untuned.json`` name them: ``("bf16", "cuBLAS BF16
    GEMM")``."""
    dtypes = list(dict.fromkeys(p.problem.dtype for p in planned))
    return (", ".join(CSV_DTYPE[d] for d in dtypes),
            ", ".join(f"cuBLAS {dense_of(d).label}" for d in dtypes))


def rows_table(rows: Sequence[UntunedRow]) -> str:
    return markdown_table(
        ["pattern", "L", "dtype", "M", "N", "K", "untuned ms", "tuned ms", "dense ms",
         "quick ms", "untuned / tuned", "untuned from"],
        [[r.pattern, r.vec, r.dtype, r.M, r.N, r.K, f"{r.untuned_ms:.4f}",
          f"{r.tuned_ms:.4f}", f"{r.dense_ms:.4f}", f"{r.quick_ms:.4f}" if r.quick_ms else "-",
          f"{r.ratio:.3f}", f"{r.untuned_source} ({r.untuned_origin})"] for r in rows])
