"""``nmgen bench`` results on the host: the row type, the derived figures, and the CSV,
Markdown and summary writers (no GPU needed: they also run on recorded data)."""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .report import geomean, markdown_table

RTOL = 1e-5


@dataclass(frozen=True)
class BenchRow:
    """One (pattern, shape): nmgen through dispatch and the dense cuBLAS baselines, all
    timed in one process (milliseconds, median of CUDA-event timings)."""

    pattern: str  # "n:m"
    vec: int
    M: int
    N: int
    K: int
    nmgen_ms: float
    sgemm_ms: float
    tf32_ms: float
    bf16_ms: float
    model_ms: float  # the analytic model's prediction for the dispatched kernel
    rel_error: float  # against the float64 reference, output poisoned before the launch
    source: str  # dispatch's decision: exact, nearest or model
    config: str
    # The core benchmark's hand-picked configuration of the pattern (space.core_config)
    # on the same shape and data, checked and timed in the same run; None where the
    # pattern has none or the run did not time it.
    core_ms: float | None = None
    core_config: str = ""

    @property
    def n(self) -> int:
        return int(self.pattern.split(":")[0])

    @property
    def m(self) -> int:
        return int(self.pattern.split(":")[1])

    @property
    def dense_flops(self) -> float:
        return 2.0 * self.M * self.N * self.K

    @property
    def speedup(self) -> float:
        """Over cuBLAS SGEMM, the FP32 dense baseline."""
        return self.sgemm_ms / self.nmgen_ms

    @property
    def ideal(self) -> float:
        return self.m / self.n

    @property
    def pct_ideal(self) -> float:
        return 100.0 * self.speedup / self.ideal

    @property
    def tflops_dense_eq(self) -> float:
        return self.dense_flops / self.nmgen_ms / 1e9

    @property
    def tflops_executed(self) -> float:
        """The FLOPs the kernel really does (n of every m rows)."""
        return self.dense_flops * self.n / self.m / self.nmgen_ms / 1e9

    @property
    def intensity(self) -> float:
        """Executed FLOPs per DRAM byte at the minimum traffic: A, B's values and
        indices, C, each once."""
        kept = self.K * self.n / self.m
        nbytes = 4 * (self.M * self.K + kept * self.N + self.M * self.N) \
            + kept * self.N / self.vec
        return self.dense_flops * self.n / self.m / nbytes

    @property
    def vs_core(self) -> float | None:
        """The hand-picked kernel's time over nmgen's (above 1: the tuned kernel is faster)."""
        return None if self.core_ms is None else self.core_ms / self.nmgen_ms

    @property
    def correct(self) -> bool:
        return self.rel_error < RTOL


DERIVED = ("speedup", "ideal", "pct_ideal", "tflops_dense_eq", "tflops_executed", "intensity",
           "vs_core")
FIELDS = tuple(f.name for f in dataclasses.fields(BenchRow))


def write_csv(rows: Sequence[BenchRow], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(FIELDS + DERIVED)
        for r in rows:
            writer.writerow(["" if (v := getattr(r, k)) is None else v for k in FIELDS]
                            + [_figure(getattr(r, k)) for k in DERIVED])


def _figure(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def read_csv(path: Path) -> list[BenchRow]:
    """Rows written by ``write_csv`` (older files without the core columns too)."""
    types = {f.name: f.type for f in dataclasses.fields(BenchRow)}
    cast = {"int": int, "float": float, "str": str,
            "float | None": lambda v: float(v) if v else None}
    with path.open(newline="") as f:
        return [BenchRow(**{k: cast[types[k]](v) for k, v in rec.items() if k in types})
                for rec in csv.DictReader(f)]


def shapes_table(rows: Sequence[BenchRow]) -> str:
    return markdown_table(
        ["pattern", "M", "N", "K", "nmgen ms", "SGEMM ms", "speedup", "% of ideal",
         "TF32 ms", "BF16 ms", "TFLOP/s (dense-eq.)", "model ms", "dispatch", "rel. error",
         "core ms"],
        [[r.pattern, r.M, r.N, r.K, f"{r.nmgen_ms:.4f}", f"{r.sgemm_ms:.4f}",
          f"{r.speedup:.2f}x", f"{r.pct_ideal:.0f}%", f"{r.tf32_ms:.4f}", f"{r.bf16_ms:.4f}",
          f"{r.tflops_dense_eq:.1f}", f"{r.model_ms:.4f}", r.source, f"{r.rel_error:.1e}",
          "–" if r.core_ms is None else f"{r.core_ms:.4f}"]
         for r in rows])


def summary(rows: Sequence[BenchRow]) -> list[dict]:
    """Per pattern: speedup over SGEMM (geometric mean, min, max), percent of ideal, and
    the dense tensor-core baselines' speedups over SGEMM for reference."""
    out = []
    for pattern in dict.fromkeys(r.pattern for r in rows):
        sel = [r for r in rows if r.pattern == pattern]
        speed = [r.speedup for r in sel]
        out.append({
            "pattern": pattern, "shapes": len(sel), "geomean": geomean(speed),
            "min": min(speed), "max": max(speed),
            "pct_ideal": geomean([r.pct_ideal for r in sel]),
            "tf32_geomean": geomean([r.sgemm_ms / r.tf32_ms for r in sel]),
            "bf16_geomean": geomean([r.sgemm_ms / r.bf16_ms for r in sel]),
            "wrong": sum(not r.correct for r in sel),
            "exact": sum(r.source == "exact" for r in sel),
            **_against_core(sel),
        })
    return out


def _against_core(rows: Sequence[BenchRow]) -> dict:
    """The tuned kernels against the hand-picked one, over the shapes where it was timed:
    geometric mean and least of core time / nmgen time, and the shapes where nmgen chose
    another kernel and was slower (at all, and by more than 3 %). Where the tuned kernel
    is the hand-picked one, the two timings of one kernel differ by noise alone: those
    shapes are counted apart."""
    timed = [r for r in rows if r.vs_core is not None]
    if not timed:
        return {"core_shapes": 0}
    ratios = [r.vs_core for r in timed]
    other = [r.vs_core for r in timed if r.config != r.core_config]
    return {"core_shapes": len(ratios), "core_same_kernel": len(ratios) - len(other),
            "vs_core_geomean": geomean(ratios), "vs_core_min": min(ratios),
            "vs_core_min_other": min(other, default=None),
            "slower_than_core": sum(x < 1 for x in other),
            "slower_than_core_3pct": sum(x < 1 / 1.03 for x in other)}


def summary_table(rows: Sequence[BenchRow]) -> str:
    return markdown_table(
        ["pattern", "shapes", "geomean speedup", "min", "max", "geomean % of ideal",
         "TF32 / SGEMM", "BF16 / SGEMM", "tuned (exact)", "wrong",
         "core / nmgen (geomean, min)", "another kernel, slower than core (>3 %)",
         "same kernel as core"],
        [[s["pattern"], s["shapes"], f"{s['geomean']:.2f}x", f"{s['min']:.2f}x",
          f"{s['max']:.2f}x", f"{s['pct_ideal']:.0f}%", f"{s['tf32_geomean']:.2f}x",
          f"{s['bf16_geomean']:.2f}x", s["exact"], s["wrong"], *_core_cells(s)]
         for s in summary(rows)])


def by_m_table(rows: Sequence[BenchRow], metric: str = "speedup", fmt: str = "{:.2f}x") -> str:
    """Geometric mean of ``metric`` (a BenchRow property) of each pattern over the shapes of
    each M: the speedup over SGEMM by default."""
    ms = sorted({r.M for r in rows})
    body = []
    for pattern in dict.fromkeys(r.pattern for r in rows):
        cells = [[getattr(r, metric) for r in rows if r.pattern == pattern and m == r.M]
                 for m in ms]
        body.append([pattern, *(fmt.format(geomean(c)) if c else "–" for c in cells)])
    return markdown_table(["pattern", *(f"M = {m}" for m in ms)], body)


def markdown_report(rows: Sequence[BenchRow]) -> str:
    """bench.md: the summary, the speedup and the dense-equivalent rate by M, then every
    shape."""
    return ("## Summary\n\n" + summary_table(rows)
            + "\n## Geomean speedup over SGEMM by M\n\n" + by_m_table(rows)
            + "\n## Geomean dense-equivalent TFLOP/s by M\n\n"
            + by_m_table(rows, "tflops_dense_eq", "{:.1f}")
            + "\n## Every shape\n\n" + shapes_table(rows))


def _core_cells(s: dict) -> list[str]:
    if not s["core_shapes"]:
        return ["not timed"] * 3
    others = s["core_shapes"] - s["core_same_kernel"]
    return [f"{s['vs_core_geomean']:.3f}, {s['vs_core_min']:.3f}",
            f"{s['slower_than_core']} ({s['slower_than_core_3pct']}) of {others}",
            f"{s['core_same_kernel']} of {s['core_shapes']}"]


def write_all(rows: Sequence[BenchRow], out: Path, ceilings: dict | None = None,
              meta: dict | None = None) -> list[Path]:
    """bench.csv, bench.md (summary, then every shape) and bench.json (ceilings, run)."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "bench.csv")
    (out / "bench.md").write_text(markdown_report(rows))
    (out / "bench.json").write_text(json.dumps({"ceilings": ceilings, **(meta or {}),
                                                "summary": summary(rows)}, indent=2) + "\n")
    return [out / "bench.csv", out / "bench.md", out / "bench.json"]
