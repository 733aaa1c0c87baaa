"""Core benchmark (issue 2): hand-picked grid at M = N = K = 4096, L = 32, against cuBLAS
SGEMM timed in the same process. Every configuration is checked against the float64
reference before it is timed; the best row-major configuration of each pattern is also
run with K-major A.

    python tools/bench_core.py --out results/core_h100
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

import nmgen  # noqa: E402
from nmgen.config import ALayout, ConfigError, KernelConfig  # noqa: E402
from nmgen.gpu.timing import precompile, time_ms  # noqa: E402
from nmgen.report import markdown_table  # noqa: E402
from nmgen.results import RTOL  # noqa: E402

NM_SPMM_SPEEDUP = {"16:32": 1.87, "12:32": 2.5, "8:32": 3.6, "4:32": 6.2}  # issue 2 targets
TILES = (  # MSxNSxMTxNTxWARP_MxWARP_N
    "128x128x8x8x8x4", "64x256x8x8x4x8", "128x256x8x8x8x4", "128x128x8x16x8x4",
    "128x256x16x8x8x4", "256x128x16x8x8x4", "128x128x16x8x8x4", "64x256x16x8x4x8",
    "64x512x8x16x8x4",
)
KS_WINDOWS = (1, 2, 4)


def grid(n: int, m: int, vec: int, tiles=TILES, windows=KS_WINDOWS, packings=(False, True),
         stages=(2, 3), a_tiles=("tk", "tm"), tmas=(False,)) -> list[KernelConfig]:
    configs = []
    for tile, window, packing, stage, a_tile, tma in itertools.product(
            tiles, windows, packings, stages, a_tiles, tmas):
        ms, ns, mt, nt, wm, wn = (int(x) for x in tile.split("x"))
        with contextlib.suppress(ConfigError):
            configs.append(KernelConfig(n, m, vec, ms, ns, m * window, mt, nt, warp_m=wm,
                                        warp_n=wn, packing=packing, stages=stage,
                                        a_tile=a_tile, tma=tma))
    return configs


def measure(config: KernelConfig, a, b, ref, ref_norm: float, size: int, sgemm_ms: float,
            repeat: int) -> dict:
    """Check ``config`` against the float64 reference (NaN-poisoned output), then time it."""
    import cupy as cp

    kernel = nmgen.Kernel(config)
    out = cp.full((size, size), cp.nan, cp.float32)
    kernel(a, b, out=out)
    err = float(cp.linalg.norm(out.astype(cp.float64) - ref)) / ref_norm
    row = {"config": config.name, "pattern": f"{config.n}:{config.m}",
           "a_layout": config.a_layout.value, "error": err, "ok": bool(err < RTOL)}
    if row["ok"]:
        t = time_ms(lambda i: kernel(a, b, out=out), warmup=3, repeat=repeat)
        row.update(ms=t, tflops_dense_eq=2 * size**3 / t / 1e9, speedup=sgemm_ms / t)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--vec", type=int, default=32)
    parser.add_argument("--patterns", default="16:32,12:32,8:32,4:32")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiles", default=",".join(TILES), help="MSxNSxMTxNTxWMxWN,...")
    parser.add_argument("--windows", default="1,2,4", help="KS in windows of m")
    parser.add_argument("--packing", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--stages", default="2,3")
    parser.add_argument("--a-tiles", default="tk,tm")
    parser.add_argument("--tma", choices=("both", "yes", "no"), default="no",
                        help="copies by the bulk copy engine (sm_90; copied A tiles, tx)")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite bench_core.md from OUT/bench_core.json (no GPU)")
    args = parser.parse_args()
    if args.report_only:
        print(write_report(json.loads((args.out / "bench_core.json").read_text()), args.out))
        return

    import cupy as cp

    args.out.mkdir(parents=True, exist_ok=True)
    size = args.size
    props = cp.cuda.runtime.getDeviceProperties(0)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    a_rm = cp.asarray(rng.standard_normal((size, size), dtype=np.float32))
    a_km = cp.ascontiguousarray(a_rm.T).T  # same logical A, K-major storage
    w_dense = cp.asarray(rng.standard_normal((size, size), dtype=np.float32))

    sgemm_ms = time_ms(lambda i: cp.matmul(a_rm, w_dense), warmup=5, repeat=args.repeat)
    dense_tflops = 2 * size**3 / sgemm_ms / 1e9
    print(f"{gpu}: cuBLAS SGEMM {size}^3 {sgemm_ms:.3f} ms = {dense_tflops:.1f} TFLOP/s",
          flush=True)

    rows, summary = [], []
    for pattern in args.patterns.split(","):
        n, m = (int(x) for x in pattern.split(":"))
        b = nmgen.prune(w_dense.get(), pattern, args.vec)
        ref = nmgen.reference(a_rm, b)
        ref_norm = float(cp.linalg.norm(ref))
        configs = grid(n, m, args.vec, args.tiles.split(","),
                       [int(w) for w in args.windows.split(",")],
                       {"both": (False, True), "yes": (True,), "no": (False,)}[args.packing],
                       [int(x) for x in args.stages.split(",")], args.a_tiles.split(","),
                       {"both": (False, True), "yes": (True,), "no": (False,)}[args.tma])
        errors = precompile(configs, workers=min(16, os.cpu_count() or 1))
        for e in errors:
            print("compile error:", e, flush=True)

        results = []
        for config in configs:
            r = measure(config, a_rm, b, ref, ref_norm, size, sgemm_ms, args.repeat)
            results.append(r)
            print(f"  {r['config']}: " + (f"{r['ms']:.3f} ms {r['speedup']:.2f}x"
                                           if r["ok"] else f"WRONG rel err {r['error']:.3g}"),
                  flush=True)
        ok = [r for r in results if r["ok"]]
        best = min(ok, key=lambda r: r["ms"])
        km_config = KernelConfig.from_name(best["config"]).replace(a_layout=ALayout.K_MAJOR.value,
                                                                  a_tile="tk")
        km = measure(km_config, a_km, b, ref, ref_norm, size, sgemm_ms, args.repeat)
        rm_again = measure(KernelConfig.from_name(best["config"]), a_rm, b, ref, ref_norm,
                           size, sgemm_ms, args.repeat)
        rows.extend(results + [km, rm_again])
        summary.append({
            "pattern": pattern, "best": best["config"], "ms": rm_again["ms"],
            "tflops_dense_eq": rm_again["tflops_dense_eq"], "speedup": rm_again["speedup"],
            "target": NM_SPMM_SPEEDUP.get(pattern), "km_ms": km.get("ms"),
            "rm_over_km": rm_again["ms"] / km["ms"] if km["ok"] else None,
            "wrong": len(results) - len(ok),
        })

    record = {"gpu": gpu, "size": size, "vec": args.vec, "sgemm_ms": sgemm_ms,
              "sgemm_tflops": dense_tflops, "summary": summary, "rows": rows}
    (args.out / "bench_core.json").write_text(json.dumps(record, indent=2))
    print(write_report(record, args.out))


def write_report(record: dict, out: Path) -> str:
    """bench_core.md from the run's record: the best kernel of each pattern, then the best
    of each row-major A tile against K-major A."""
    summary = record["summary"]
    table = markdown_table(
        ["pattern", "best configuration", "ms", "dense-eq TFLOP/s", "speedup", "target",
         "row-major / K-major time", "row-major - K-major (us)", "wrong configs"],
        [[s["pattern"], f"`{s['best']}`", f"{s['ms']:.3f}", f"{s['tflops_dense_eq']:.1f}",
          f"{s['speedup']:.2f}x", f"{s['target']}x",
          f"{s['rm_over_km']:.3f}" if s["rm_over_km"] else "n/a",
          f"{1000 * (s['ms'] - s['km_ms']):.1f}" if s["km_ms"] else "n/a", s["wrong"]]
         for s in summary])
    text = (f"# Core benchmark: {record['gpu']}, M=N=K={record['size']}, L={record['vec']}\n\n"
            f"cuBLAS SGEMM (same process): {record['sgemm_ms']:.3f} ms, "
            f"{record['sgemm_tflops']:.1f} TFLOP/s\n\n" + table
            + "\nBest kernel of each row-major A tile, its time over the K-major time of the "
            "row-major winner's tile:\n\n" + tile_table(record))
    (out / "bench_core.md").write_text(text)
    return text


def tile_table(record: dict) -> str:
    best: dict[tuple[str, str], float] = {}
    for row in record["rows"]:
        if row["ok"] and row["a_layout"] == "rm":
            key = (row["pattern"], KernelConfig.from_name(row["config"]).a_tile.value)
            best[key] = min(best.get(key, float("inf")), row["ms"])
    tiles = sorted({tile for _, tile in best})
    return markdown_table(
        ["pattern", *tiles],
        [[s["pattern"], *(f"{best[(s['pattern'], t)] / s['km_ms']:.3f}"
                          if (s["pattern"], t) in best and s["km_ms"] else "–" for t in tiles)]
         for s in record["summary"]])


if __name__ == "__main__":
    main()
