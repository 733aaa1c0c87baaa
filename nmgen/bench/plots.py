"""``nmgen bench`` plots (matplotlib, the ``plots`` extra): speedup over cuBLAS per shape
with the ideal line, a roofline with the device's measured ceilings, and predicted
against measured time. They read only recorded rows, so they can be redrawn anywhere."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .results import BenchRow


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("plots need matplotlib: pip install -e '.[plots]'") from exc
    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    return plt


def _patterns(rows: Sequence[BenchRow]) -> list[str]:
    return list(dict.fromkeys(r.pattern for r in rows))


def speedup_plot(rows: Sequence[BenchRow], path: Path, title: str = "") -> Path:
    plt = _pyplot()
    patterns = _patterns(rows)
    fig, axes = plt.subplots(len(patterns), 1, figsize=(12, 2.8 * len(patterns)),
                             squeeze=False, sharex=True)
    for ax, pattern in zip(axes[:, 0], patterns, strict=True):
        sel = [r for r in rows if r.pattern == pattern]
        x = range(len(sel))
        ax.bar(x, [r.speedup for r in sel], color="tab:blue", label="nmgen (FP32)")
        ax.axhline(sel[0].ideal, color="tab:red", linestyle="--",
                   label=f"ideal {sel[0].ideal:.3g}x")
        ax.plot(x, [r.sgemm_ms / r.tf32_ms for r in sel], "k.", markersize=4,
                label="cuBLAS TF32")
        ax.plot(x, [r.sgemm_ms / r.bf16_ms for r in sel], "g.", markersize=4,
                label="cuBLAS BF16")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        top = max([sel[0].ideal] + [r.speedup for r in sel] + [r.sgemm_ms / r.bf16_ms
                                                               for r in sel])
        ax.set_ylim(0, top * 1.3)  # room for the legend
        ax.set_ylabel(f"{pattern}\nspeedup vs SGEMM")
        ax.legend(loc="upper left", fontsize=7, ncol=4)
    axes[-1, 0].set_xlabel("shape (order of the shapes file)")
    fig.suptitle(title or "nmgen speedup over cuBLAS SGEMM")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def roofline_plot(rows: Sequence[BenchRow], ceilings: dict, path: Path,
                  title: str = "") -> Path:
    plt = _pyplot()
    peak, bw = ceilings["fp32_tflops"], ceilings["dram_gbs"]
    fig, ax = plt.subplots(figsize=(8, 6))
    ridge = peak * 1e3 / bw  # FLOP/byte where the two ceilings meet
    dense_ai = [2 * r.M * r.N * r.K / (4 * (r.M * r.K + r.K * r.N + r.M * r.N)) for r in rows]
    lo = min(min(r.intensity for r in rows) / 2, ridge / 4)
    hi = max(max(r.intensity for r in rows), max(dense_ai)) * 2
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, x * bw / 1e3) for x in xs], "k-",
            label=f"measured ceilings: {peak:.1f} TFLOP/s FP32, {bw:.0f} GB/s DRAM")
    for pattern in _patterns(rows):
        sel = [r for r in rows if r.pattern == pattern]
        ax.plot([r.intensity for r in sel], [r.tflops_executed for r in sel], "o",
                markersize=4, label=f"nmgen {pattern} (executed FLOPs)")
    dense = {(r.M, r.N, r.K): r for r in rows}.values()
    ax.plot([2 * r.M * r.N * r.K / (4 * (r.M * r.K + r.K * r.N + r.M * r.N)) for r in dense],
            [r.dense_flops / r.sgemm_ms / 1e9 for r in dense], "kx", markersize=5,
            label="cuBLAS SGEMM")
    return _save_loglog(plt, fig, ax, path, "arithmetic intensity (FLOP / DRAM byte)",
                        "TFLOP/s", title or "Roofline")


def model_plot(rows: Sequence[BenchRow], path: Path, title: str = "") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for pattern in _patterns(rows):
        sel = [r for r in rows if r.pattern == pattern]
        ax.plot([r.model_ms for r in sel], [r.nmgen_ms for r in sel], "o", markersize=4,
                label=pattern)
    lo = min(min(r.model_ms, r.nmgen_ms) for r in rows) / 1.5
    hi = max(max(r.model_ms, r.nmgen_ms) for r in rows) * 1.5
    ax.plot([lo, hi], [lo, hi], "k--", linewidth=0.8, label="measured = predicted")
    return _save_loglog(plt, fig, ax, path, "model prediction (ms)", "measured (ms)",
                        title or "Analytic model against measurement")


def _save_loglog(plt, fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def all_plots(rows: Sequence[BenchRow], ceilings: dict, out: Path, device: str = "") -> list[Path]:
    suffix = f" ({device})" if device else ""
    return [speedup_plot(rows, out / "speedup.png", f"nmgen speedup over cuBLAS SGEMM{suffix}"),
            roofline_plot(rows, ceilings, out / "roofline.png", f"Roofline{suffix}"),
            model_plot(rows, out / "model.png", f"Model against measurement{suffix}")]
