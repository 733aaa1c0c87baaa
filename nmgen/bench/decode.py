"""``nmgen bench --decode`` and ``nmgen bench --dtype bf16|f16``: nmgen against PyTorch's
dense GEMM at the same dtype, measured as a model runs it; small M (token-by-token
generation) and, at 16 bits, any M (prefill). A model's layers are far larger than L2
together, so each timed call reads a weight that is not in L2: the bench rotates through
enough copies of each weight (nmgen's and the dense baseline's) that they span twice the
L2 (one copy where a weight alone is larger). Reported beside the time: the compressed
bytes (values and indices) over it, against the bandwidth of a device copy measured in the
same process, and the dense GEMM of cuBLAS at the same dtype (through PyTorch, the faster of
``matmul`` and ``F.linear``: SGEMM with TF32 off for FP32) and, for 2:4 at 16 bits,
PyTorch's semi-structured sparse path (cuSPARSELt), on the same rotated data.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..dispatch import Dispatcher
from ..format import DType, NMMatrix, Pattern
from ..gpus import table_name
from ..problem import ALayout, Problem
from ..runtime.check import random_weight, tolerance
from ..runtime.device import device_info
from ..runtime.launch import upload_layouts
from ..runtime.timing import time_ms
from ..shapes import Shape
from .report import CSV_DTYPE, geomean, markdown_table

L2_SPAN = 2  # the rotated copies of a weight span this many L2s
SEMI_QUEUE_AHEAD_US = 5000.0  # longer than PyTorch's semi-structured call spends on the host


@dataclass(frozen=True)
class DecodeRow:
    pattern: str
    vec: int
    layout: str  # of A: rm (row-major M×K) or km (K-major: a K×M array's M×K view)
    dtype: str  # fp32, bf16 or fp16
    M: int
    N: int
    K: int
    nmgen_ms: float
    baseline_ms: float  # cuBLAS at the same dtype: the faster of matmul and F.linear
    semi_ms: float | None  # PyTorch semi-structured 2:4 (cuSPARSELt), 2:4 at 16 bits
    compressed_bytes: int  # values and uint8 indices
    copy_gbs: float  # a device copy's bandwidth in this process
    rel_error: float
    source: str
    config: str
    gpu: str = ""  # the device the row was timed on (its table name)
    kernel_bytes: int = 0  # the weight as the kernel reads it (its family's layout)

    @property
    def speedup(self) -> float:
        return self.baseline_ms / self.nmgen_ms

    @property
    def weight_bytes(self) -> int:
        """The bytes a call streams: the kernel's layout where known, else the format's."""
        return self.kernel_bytes or self.compressed_bytes

    @property
    def achieved_gbs(self) -> float:
        return self.weight_bytes / self.nmgen_ms / 1e6

    @property
    def bandwidth_frac(self) -> float:
        """The weight's bytes over the time, as a share of a device copy's bandwidth."""
        return self.achieved_gbs / self.copy_gbs

    @property
    def floor_ms(self) -> float:
        """The weight's bytes at the copy's bandwidth."""
        return self.weight_bytes / (self.copy_gbs * 1e6)


def compressed_bytes(shape: Shape, pattern: Pattern, vec: int, dtype: DType) -> int:
    _, cols, depth = shape
    rows = -(-depth // pattern.m) * pattern.n
    return rows * cols * dtype.itemsize + rows * -(-cols // vec)


def copy_gbs() -> float:
    """A 256 MB device-to-device copy: bytes read and written over its time."""
    import torch

    src = torch.empty(2**26, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda i: dst.copy_(src), repeat=10, queue_ahead_us=0)
    return 2 * src.numel() * 4 / ms / 1e6


def _copies(weight_bytes: int) -> int:
    l2 = 50 * 2**20
    return max(1, min(64, math.ceil(L2_SPAN * l2 / max(weight_bytes, 1))))


def run_decode_bench(shapes: Sequence[Shape], patterns: Sequence[Pattern], vec: int,
                     dtype: DType, dispatcher: Dispatcher, repeat: int = 30,
                     on_row: Callable[[list[DecodeRow]], None] = lambda rows: None,
                     log: Callable[[str], None] = print,
                     layout: ALayout = ALayout.ROW_MAJOR) -> list[DecodeRow]:
    """Every shape at every pattern; the weights of one (pattern, N, K) are made once and
    serve each M of the shapes file. The kernels dispatch picks compile first, in
    parallel."""
    import torch

    from .run import precompile

    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 is SGEMM, as in the FP32 bench
    bandwidth = copy_gbs()
    log(f"device copy: {bandwidth:.0f} GB/s")
    errors = precompile(dispatcher, patterns, vec, shapes, layout, dtype=dtype)
    if errors:
        raise RuntimeError("kernels failed to compile: " + "; ".join(errors[:3]))
    rows: list[DecodeRow] = []
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    torch_dtype = {DType.F32: torch.float32, DType.BF16: torch.bfloat16,
                   DType.F16: torch.float16}[dtype]
    total = len(shapes) * len(patterns)
    for pattern in patterns:
        for (cols, depth), group in _by_weight(shapes).items():
            weights = _Weights.make(rng, pattern, vec, cols, depth, dtype, torch_dtype)
            for m_rows in group:
                row = _one(dispatcher, weights, m_rows, bandwidth, repeat, layout)
                rows.append(row)
                on_row(rows)
                log(f"[{len(rows)}/{total}] {pattern} {(m_rows, cols, depth)}: "
                    f"{row.nmgen_ms * 1e3:.1f} us ({row.achieved_gbs:.0f} GB/s), dense "
                    f"{row.baseline_ms * 1e3:.1f} us, {row.speedup:.2f}x ({row.source})")
            del weights
            torch.cuda.empty_cache()
    return rows


def _by_weight(shapes: Sequence[Shape]) -> dict[tuple[int, int], list[int]]:
    """The M of each (N, K), in the order of the shapes file."""
    groups: dict[tuple[int, int], list[int]] = {}
    for m_rows, cols, depth in shapes:
        groups.setdefault((cols, depth), []).append(m_rows)
    return groups


@dataclass
class _Weights:
    """One (pattern, N, K): rotated copies of nmgen's weight (one random weight, a
    separate device copy each), of the dense baseline's in both layouts, and of the
    semi-structured 2:4 weight where that path runs."""

    pattern: Pattern
    vec: int
    dtype: DType
    shape: tuple[int, int]  # (N, K)
    nm: list[NMMatrix]
    dense_kn: list[Any]
    dense_nk: list[Any]
    semi: list[Any] | None
    _reference: Any = None

    @property
    def reference(self) -> Any:
        """The weight in float64 on the device (the check's product), made once."""
        import torch

        if self._reference is None:
            self._reference = torch.as_tensor(self.nm[0].to_dense().astype(np.float64),
                                              device="cuda")
        return self._reference

    @classmethod
    def make(cls, rng: np.random.Generator, pattern: Pattern, vec: int, cols: int,
             depth: int, dtype: DType, torch_dtype: Any) -> _Weights:
        import torch

        size = compressed_bytes((1, cols, depth), pattern, vec, dtype)
        first = random_weight(rng, pattern.n, pattern.m, vec, depth, cols,
                              device_values=True, dtype=dtype)
        nm = [first, *(replace(first, _prepared={}) for _ in range(_copies(size) - 1))]
        copies = _copies(depth * cols * dtype.itemsize)
        kn = [torch.randn(depth, cols, device="cuda").to(torch_dtype) for _ in range(copies)]
        nk = [torch.randn(cols, depth, device="cuda").to(torch_dtype) for _ in range(copies)]
        return cls(pattern, vec, dtype, (cols, depth), nm, kn, nk,
                   _semi_structured(first, pattern, dtype, torch_dtype, len(nm)))


def _one(dispatcher: Dispatcher, weights: _Weights, m_rows: int, bandwidth: float,
         repeat: int, layout: ALayout = ALayout.ROW_MAJOR) -> DecodeRow:
    import torch

    cols, depth = weights.shape
    nm, dtype = weights.nm, weights.dtype
    a = torch.randn(m_rows, depth, device="cuda").to(weights.dense_kn[0].dtype)
    if layout is ALayout.K_MAJOR:  # the same values, held K×M; cuBLAS times its M×K view
        a = a.T.contiguous().T
    out = torch.empty(m_rows, cols, device="cuda", dtype=a.dtype)
    error = _error(dispatcher, a, nm[0], weights.reference, out)
    for weight in nm[1:]:  # each copy laid out on the device before the timing
        upload_layouts(nm[0], weight)
        dispatcher(a, weight, out=out)
    nmgen_ms = time_ms(lambda i: dispatcher(a, nm[i % len(nm)], out=out), repeat=repeat)
    problem = Problem(weights.pattern.n, weights.pattern.m, weights.vec, layout,
                      arch=device_info().arch, dtype=dtype)
    decision = dispatcher.decide(problem, (m_rows, cols, depth))
    baseline_ms = _dense_ms(a, out, weights, repeat)
    semi_ms = _semi_ms(a, weights.semi, repeat) if weights.semi else None
    size = compressed_bytes((m_rows, cols, depth), weights.pattern, weights.vec, dtype)
    kernel_bytes = dispatcher.kernel(decision.config).prepared(nm[0]).nbytes
    return DecodeRow(str(weights.pattern), weights.vec, layout.value, CSV_DTYPE[dtype], m_rows,
                     cols, depth, nmgen_ms, baseline_ms, semi_ms, size, bandwidth, error,
                     decision.source, decision.config.name, table_name(device_info().name),
                     kernel_bytes)


def _dense_ms(a: Any, out: Any, weights: _Weights, repeat: int) -> float:
    """cuBLAS at the same dtype on rotated dense weights: the faster of ``matmul`` on a
    K×N weight and ``F.linear`` on an N×K one (the layout a PyTorch model keeps)."""
    import torch

    kn, nk = weights.dense_kn, weights.dense_nk
    matmul_ms = time_ms(lambda i: torch.matmul(a, kn[i % len(kn)], out=out), repeat=repeat)
    linear_ms = time_ms(lambda i: torch.nn.functional.linear(a, nk[i % len(nk)]),
                        repeat=repeat)
    return min(matmul_ms, linear_ms)


def _error(dispatcher: Dispatcher, a: Any, weight: NMMatrix, reference: Any,
           out: Any) -> float:
    import torch

    out.fill_(float("nan"))
    dispatcher(a, weight, out=out)
    ref = a.double() @ reference
    err = float(torch.linalg.norm(out.double() - ref) / max(float(torch.linalg.norm(ref)),
                                                            1e-30))
    if not err < tolerance(weight.dtype):
        raise RuntimeError(f"nmgen is wrong on {tuple(a.shape)} x {weight.shape}: relative "
                           f"error {err:.3g}")
    return err


def _semi_structured(weight: NMMatrix, pattern: Pattern, dtype: DType, torch_dtype: Any,
                     copies: int) -> list[Any] | None:
    """PyTorch's 2:4 semi-structured sparse weight (cuSPARSELt), rotated copies of
    ``weight``: 2:4 with vector length 1 along K only, at 16 bits; ``None`` where that
    path does not run."""
    if (pattern.n, pattern.m) != (2, 4) or dtype is DType.F32:
        return None
    import torch
    from torch.sparse import to_sparse_semi_structured

    dense = torch.as_tensor(weight.to_dense().T.astype(np.float32), device="cuda")
    dense = dense.to(torch_dtype).contiguous()
    try:
        return [to_sparse_semi_structured(dense.clone()) for _ in range(copies)]
    except (RuntimeError, ValueError, TypeError):
        return None


def _semi_ms(a: Any, sparse: list[Any], repeat: int) -> float | None:
    """Milliseconds of PyTorch's semi-structured ``F.linear`` on the device, each call
    queued behind a wait longer than its host path: PyTorch sets cuSPARSELt up anew on
    every call (pytorch/pytorch#153825), 0.4-2.9 ms a call with the usual 100 us wait
    (``results/tensor_core_h100/llama_l128/summary.txt``), so the figure is the kernel's."""
    import torch

    rows = a.shape[0]
    padded = torch.zeros((max(rows, 32), a.shape[1]), device="cuda", dtype=a.dtype)
    padded[:rows] = a  # cuSPARSELt wants at least 32 rows of the dense operand
    try:
        return time_ms(lambda i: torch.nn.functional.linear(padded, sparse[i % len(sparse)]),
                       repeat=repeat, queue_ahead_us=SEMI_QUEUE_AHEAD_US)
    except (RuntimeError, ValueError, TypeError):
        return None


def write_csv(rows: Sequence[DecodeRow], path: Path) -> None:
    names = [f.name for f in fields(DecodeRow)]
    with path.open("w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=[*names, "speedup", "achieved_gbs", "floor_ms",
                                            "bandwidth_frac"])
        out.writeheader()
        for row in rows:
            out.writerow({**asdict(row), "speedup": f"{row.speedup:.4f}",
                          "achieved_gbs": f"{row.achieved_gbs:.1f}",
                          "floor_ms": f"{row.floor_ms:.5f}",
                          "bandwidth_frac": f"{row.bandwidth_frac:.4f}"})


def summary_table(rows: Sequence[DecodeRow]) -> str:
    """By pattern and M: geomean speedup over dense, share of the copy bandwidth reached,
    and over semi-structured 2:4 where it ran."""
    cells = []
    for key in dict.fromkeys((r.pattern, r.vec, r.dtype, r.M) for r in rows):
        sel = [r for r in rows if (r.pattern, r.vec, r.dtype, r.M) == key]
        semi = [r.semi_ms / r.nmgen_ms for r in sel if r.semi_ms]
        cells.append([*key, len(sel), f"{geomean([r.speedup for r in sel]):.2f}x",
                      f"{geomean([r.nmgen_ms / r.floor_ms for r in sel]):.2f}",
                      f"{geomean([r.bandwidth_frac for r in sel]):.0%}",
                      f"{geomean(semi):.2f}x" if semi else "-"])
    return markdown_table(["pattern", "L", "dtype", "M", "shapes", "over dense (geomean)",
                           "time / floor", "of copy bandwidth", "over semi-structured"], cells)


def speedup_plot(rows: Sequence[DecodeRow], path: Path, title: str) -> Path:
    """Speedup over the dense GEMM of the same dtype, shape by shape (file order), one
    panel a pattern, with the ideal (m/n) and PyTorch's semi-structured 2:4 where it ran."""
    from .plots import _pyplot

    plt = _pyplot()
    patterns = list(dict.fromkeys(r.pattern for r in rows))
    fig, axes = plt.subplots(len(patterns), 1, figsize=(12, 2.8 * len(patterns)),
                             squeeze=False, sharex=True)
    for ax, pattern in zip(axes[:, 0], patterns, strict=True):
        sel = [r for r in rows if r.pattern == pattern]
        x = range(len(sel))
        ideal = Pattern.parse(pattern).m / Pattern.parse(pattern).n
        ax.bar(x, [r.speedup for r in sel], color="tab:blue", label=f"nmgen ({sel[0].dtype})")
        ax.axhline(ideal, color="tab:red", linestyle="--", label=f"ideal {ideal:.3g}x")
        semi = [(i, r.baseline_ms / r.semi_ms) for i, r in enumerate(sel) if r.semi_ms]
        if semi:
            ax.plot(*zip(*semi, strict=True), "g.", markersize=5, label="semi-structured 2:4")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_ylim(0, max([ideal] + [r.speedup for r in sel]) * 1.3)
        ax.set_ylabel(f"{pattern}\nover dense")
        ax.legend(loc="upper left", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("shape (order of the shapes file)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def decode_bench_to_dir(shapes: Sequence[Shape], patterns: Sequence[Pattern], vec: int,
                        dtype: DType, db_url: str | None, out: Path, repeat: int,
                        command: str, quiet: bool = False,
                        layout: ALayout = ALayout.ROW_MAJOR, plots: bool = True
                        ) -> tuple[list[DecodeRow], list[Path]]:
    """``nmgen bench --decode`` (or a 16-bit dtype): the run, ``bench.csv``, ``bench.md``
    and ``bench.json`` in ``out``."""
    import json
    import time

    from ..progress import Progress
    from ..store.database import shipped_db

    shipped = [f"sqlite:///{shipped_db()}"] if shipped_db().exists() else []
    dispatcher = Dispatcher([db_url, *shipped] if db_url else None)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with Progress(len(shapes) * len(patterns), "problems", quiet) as bar:
        rows = run_decode_bench(shapes, patterns, vec, dtype, dispatcher, repeat,
                                on_row=lambda r: (write_csv(r, out / "bench.csv"),
                                                  bar.advance()),
                                log=lambda s: print(s, flush=True), layout=layout)
    table = summary_table(rows)
    (out / "bench.md").write_text(f"## {CSV_DTYPE[dtype]}, L = {vec}, A {layout.value}\n\n"
                                  f"{table}")
    info = device_info()
    (out / "bench.json").write_text(json.dumps({
        "device": info.name, "cuda_runtime": info.cuda_version, "command": command,
        "seconds": round(time.monotonic() - start, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=2) + "\n")
    paths = [out / "bench.csv", out / "bench.md", out / "bench.json"]
    if plots and rows:
        paths.append(speedup_plot(rows, out / "speedup.png", f"nmgen {CSV_DTYPE[dtype]}, "
                                  f"L = {vec}, A {layout.value}, over dense on {info.name}"))
    return rows, paths
