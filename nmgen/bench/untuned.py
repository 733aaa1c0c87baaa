"""``nmgen bench-untuned``: what a problem nobody tuned runs at, against its full tune.

For every (pattern, L, shape): the kernel dispatch picks on first use from databases
holding none of these problems (``untuned``: a transfer or the model), the winner of a
full tune of the same problem (``tuned``, an exact record of another database) and
cuBLAS SGEMM (``dense``), checked against float64 and timed in turns in one process.
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

from ..dispatch import Decision, Dispatcher
from ..families.base import Config
from ..format import DType, Pattern
from ..gpus import Arch, gpu_spec
from ..problem import ALayout, Problem
from ..runtime.device import DeviceInfo
from ..shapes import Shape
from .report import geomean, markdown_table

UNTUNED_SOURCES = ("transfer", "model")
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
    untuned_source: str = ""  # transfer or model
    untuned_origin: str = ""  # the tuned problem a transfer came from, or "model"
    untuned_config: str = ""
    tuned_config: str = ""

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
    of a problem (it would not be untuned) or the tuned one lacks an exact record."""
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


def table_device(gpu: str) -> DeviceInfo:
    """A stand-in for the device of GPU table entry ``gpu`` (planning without a GPU;
    records of any CUDA runtime then count as another runtime's)."""
    spec = gpu_spec(gpu)
    return DeviceInfo(f"NVIDIA {spec.name.upper()}", spec.sms, spec.arch.number // 10,
                      spec.arch.number % 10, 0)


def plan_table(planned: Sequence[Planned]) -> str:
    """The kernels each comparison times."""
    rows = [[p.problem.pattern, p.problem.vec, "x".join(map(str, p.shape)),
             f"{p.untuned.source} ({p.untuned.origin or '-'})", p.untuned.config.name,
             p.tuned.config.name, len(p.quick)] for p in planned]
    return markdown_table(["pattern", "L", "shape", "untuned from", "untuned kernel",
                           "tuned kernel", "quick candidates"], rows)


def row_of(planned: Planned, times: dict[str, float]) -> UntunedRow:
    """The row of a comparison from its timings (``untuned``, ``tuned``, ``dense`` and
    any quick candidates by kernel name)."""
    p, (m, n, k) = planned.problem, planned.shape
    quick = [times[c.name] for c in planned.quick if c.name in times]
    return UntunedRow(p.pattern, p.vec, m, n, k, times["untuned"], times["tuned"],
                      times["dense"], min(quick) if quick else None, planned.untuned.source,
                      planned.untuned.origin, planned.untuned.config.name,
                      planned.tuned.config.name)


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
    """Per (pattern, L): geometric means of untuned/tuned, quick/tuned and the speedups
    over SGEMM, and the worst untuned/tuned."""
    groups: dict[tuple[str, int], list[UntunedRow]] = {}
    for row in rows:
        groups.setdefault((row.pattern, row.vec), []).append(row)
    table = []
    for (pattern, vec), sel in groups.items():
        quick = [r.quick_ms / r.tuned_ms for r in sel if r.quick_ms]
        table.append([pattern, vec, len(sel), f"{geomean([r.ratio for r in sel]):.3f}",
                      f"{max(r.ratio for r in sel):.3f}",
                      f"{geomean(quick):.3f}" if quick else "-",
                      f"{geomean([r.dense_ms / r.untuned_ms for r in sel]):.2f}x",
                      f"{geomean([r.dense_ms / r.tuned_ms for r in sel]):.2f}x"])
    return markdown_table(["pattern", "L", "shapes", "untuned / tuned (geomean)",
                           "worst", "quick / tuned", "untuned × SGEMM", "tuned × SGEMM"],
                          table)


def run(planned: Sequence[Planned], repeat: int = 20,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
        on_row: Callable[[list[UntunedRow]], None] = lambda rows: None) -> list[UntunedRow]:
    """On the GPU: every comparison checked against float64, then timed in turns."""
    from ..build.pool import CompilePool
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
        log(f"[{len(rows)}/{len(planned)}] {r.pattern} L={r.vec} {r.M}x{r.N}x{r.K}: "
            f"untuned {r.untuned_ms:.4f} ms ({r.untuned_source}), tuned {r.tuned_ms:.4f} "
            f"ms, SGEMM {r.dense_ms:.4f} ms")
    return rows


def _timings(item: Planned, kernels: dict, repeat: int) -> dict[str, float]:
    """One comparison's kernels on fresh data, each checked against float64 (output
    poisoned), then timed in turns with SGEMM on the same A."""
    from ..build.nvrtc import cupy
    from ..runtime import check
    from ..runtime.timing import time_in_turns
    from .dense import Dense, dense_gemm
    from .run import dense_float64, random_weight

    cp = cupy()
    (m, n, k), p = item.shape, item.problem
    a = cp.random.standard_normal((m, k), dtype=cp.float32)
    a_op = cp.ascontiguousarray(a.T).T if p.a_layout is ALayout.K_MAJOR else a
    sgemm = dense_gemm(Dense.SGEMM, a, cp.random.standard_normal((k, n), dtype=cp.float32))
    b = random_weight(p.n, p.m, p.vec, k, n)
    out = cp.full((m, n), cp.nan, cp.float32)
    ref = a.astype(cp.float64) @ dense_float64(b)
    timed: dict[str, Callable[[int], object]] = {"dense": lambda i: sgemm()}
    named = {"untuned": item.untuned.config, "tuned": item.tuned.config,
             **{c.name: c for c in item.quick}}
    for label, config in named.items():
        call = _call(kernels[config.name], a_op, b, out)
        err = check.poisoned_error(lambda call=call: call(0), out, ref)
        if not err < check.tolerance(p.dtype):
            raise RuntimeError(f"{config.name} is wrong on {m}x{n}x{k}: relative error "
                               f"{err:.3g}")
        timed[label] = call
    del ref
    return time_in_turns(timed, rounds=3, repeat=max(1, repeat // 2))


def _call(kernel, a, b, out) -> Callable[[int], object]:
    return lambda i: kernel(a, b, out=out)


def untuned_to_dir(planned: Sequence[Planned], out: Path, repeat: int, command: str,
                   quiet: bool = False) -> tuple[list[UntunedRow], list[Path]]:
    """The run on this GPU; ``untuned.csv`` (rows so far in ``untuned.partial.csv`` while
    it runs), ``untuned.md`` and ``untuned.json`` in ``out``."""
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
    paths[1].write_text("# Untuned against tuned\n\n" + summary_table(rows) + "\n"
                        + rows_table(rows))
    info = device_info()
    paths[2].write_text(json.dumps({
        "device": info.name, "cuda_runtime": info.cuda_version, "command": command,
        "seconds": round(time.monotonic() - start, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=1) + "\n")
    return rows, paths


def rows_table(rows: Sequence[UntunedRow]) -> str:
    return markdown_table(
        ["pattern", "L", "M", "N", "K", "untuned ms", "tuned ms", "SGEMM ms", "quick ms",
         "untuned / tuned", "untuned from"],
        [[r.pattern, r.vec, r.M, r.N, r.K, f"{r.untuned_ms:.4f}", f"{r.tuned_ms:.4f}",
          f"{r.dense_ms:.4f}", f"{r.quick_ms:.4f}" if r.quick_ms else "-", f"{r.ratio:.3f}",
          f"{r.untuned_source} ({r.untuned_origin})"] for r in rows])
