"""The core benchmark: M = N = K = 4096, L = 32, the FP32 family's reference kernels of
16:32, 12:32, 8:32 and 4:32 (and, with ``--only-cores``, the cp.async kernels of GPUs
without the bulk copy engine) for K-major A and row-major A, every kernel checked against
float64 (NaN-poisoned output) before it is timed in turns with cuBLAS SGEMM in one
process. ``--tiles`` and ``--pipelines`` time a grid of other tiles instead.

    python tools/core_bench.py --only-cores --rounds 9 --out results/core_bench_h100
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.bench.report import markdown_table  # noqa: E402
from nmgen.families.f32_simt.config import KernelConfig  # noqa: E402
from nmgen.families.f32_simt.space import (  # noqa: E402
    CORE_KERNELS_CP_ASYNC,
    CORE_TILES,
    core_config,
)
from nmgen.problem import ALayout, Problem  # noqa: E402

# Per pattern by default: (KS windows, stages) of the 128x256 block of 16x8 thread tiles
# in 8x4 warps.
PIPELINES = {"16:32": ((2, 2), (2, 3)), "12:32": ((4, 2), (2, 3)),
             "8:32": ((4, 2), (2, 3)), "4:32": ((4, 2), (2, 3))}
CORE_TILE = "128x256x16x8x8x4"  # MSxNSxMTxNTxWARP_MxWARP_N
CORE_TILE_NAMES = {name: "x".join([*(str(t[k]) for k in ("ms", "ns", "mt", "nt")),
                                    *t["warp"].split("x")]) for name, t in CORE_TILES.items()}
TARGET = {"16:32": 1.87, "12:32": 2.5, "8:32": 3.6, "4:32": 6.2}


def candidates(pattern: str, layout: ALayout, tiles: list[str] | None = None,
               pipelines: list[tuple[int, int]] | None = None,
               tmas: tuple[bool, ...] = (False, True),
               rm_tiles: tuple[str, ...] = ("tx",)) -> list[KernelConfig]:
    n, m = (int(x) for x in pattern.split(":"))
    out = []
    for tile in tiles or [CORE_TILE]:
        ms, ns, mt, nt, wm, wn = (int(x) for x in tile.split("x"))
        for windows, stages in pipelines or PIPELINES[pattern]:
            for tma in tmas:
                for a_tile in rm_tiles if layout is ALayout.ROW_MAJOR else ("tk",):
                    try:
                        out.append(KernelConfig(
                            n, m, 32, ms, ns, m * windows, mt, nt, warp_m=wm, warp_n=wn,
                            stages=stages, a_layout=layout, tma=tma, a_tile=a_tile))
                    except ValueError:  # e.g. past 227 KB of shared memory
                        continue
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patterns", default="16:32,12:32,8:32,4:32")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tiles", default=CORE_TILE, help="MSxNSxMTxNTxWMxWN,...")
    parser.add_argument("--pipelines", default="",
                        help="WINDOWSxSTAGES,... (default: per pattern, PIPELINES)")
    parser.add_argument("--layouts", default="km,rm")
    parser.add_argument("--tma", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--rm-tiles", default="tx",
                        help="A tiles of the row-major candidates (tx, tk, tm, tr)")
    parser.add_argument("--with-core", action="store_true",
                        help="add the reference kernel (f32_simt.space.core_config) of each "
                        "layout")
    parser.add_argument("--only-cores", action="store_true",
                        help="time only the reference kernel and the cp.async one of GPUs "
                             "without TMA (CORE_KERNELS_CP_ASYNC) of each pattern and layout")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import cupy as cp

    from nmgen.bench.dense import Dense, dense_gemm
    from nmgen.compiler.pool import precompile
    from nmgen.runtime.check import ProblemBench, tolerance
    from nmgen.runtime.device import device_info
    from nmgen.runtime.launch import Kernel
    from nmgen.runtime.timing import time_in_turns

    size = args.size
    dense = cp.random.standard_normal((size, size), dtype=cp.float32)
    sgemm = dense_gemm(Dense.SGEMM, dense, dense)
    pipelines = [tuple(int(x) for x in p.split("x")) for p in args.pipelines.split(",") if p]
    tmas = {"both": (False, True), "yes": (True,), "no": (False,)}[args.tma]
    jobs = []
    for p in args.patterns.split(","):
        for layout in (ALayout(x) for x in args.layouts.split(",")):
            n, m = (int(x) for x in p.split(":"))
            core = core_config(Problem(n, m, 32, layout))
            if args.only_cores:
                tile, windows, stages = CORE_KERNELS_CP_ASYNC[(n, m)]
                configs = [*candidates(p, layout, [CORE_TILE_NAMES[tile]], [(windows, stages)],
                                       (False,)), core]
            else:
                configs = candidates(p, layout, args.tiles.split(","), pipelines or None, tmas,
                                     tuple(args.rm_tiles.split(",")))
            if args.with_core and core is not None and core not in configs:
                configs.insert(0, core)
            jobs.append((p, layout, configs))
    for error in precompile([c for _, _, configs in jobs for c in configs], workers=16):
        print("compile error:", error, flush=True)
    rows, record = [], []
    for pattern, layout, configs in jobs:
        n, m = (int(x) for x in pattern.split(":"))
        bench = ProblemBench(Problem(n, m, 32, layout, device_info().arch), size, size, size)
        kernels = {c.name: Kernel(c) for c in configs}
        errors = {name: bench.error(k) for name, k in kernels.items()}
        fns = {name: bench.launcher(k) for name, k in kernels.items()
               if errors[name] < tolerance(bench.problem.dtype)}
        fns["sgemm"] = lambda i: sgemm()
        ms = time_in_turns(fns, rounds=args.rounds)
        for name in kernels:
            t = ms.get(name, float("nan"))
            rows.append([pattern, layout.value, f"`{name}`", f"{errors[name]:.1e}", f"{t:.4f}",
                         f"{ms['sgemm']:.4f}", f"{ms['sgemm'] / t:.3f}x", f"{TARGET[pattern]}x"])
            record.append({"pattern": pattern, "a_layout": layout.value, "config": name,
                           "error": errors[name], "ms": t, "sgemm_ms": ms["sgemm"]})
            print(" | ".join(rows[-1]), flush=True)
    gpu = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    table = markdown_table(["pattern", "A", "kernel", "rel. error", "ms", "SGEMM ms",
                            "speedup", "target"], rows)
    text = (f"# Core benchmark: {gpu}, M=N=K={size}, L=32\n\n"
            f"{args.rounds} rounds in turns per pattern and layout, with cuBLAS SGEMM.\n\n"
            f"{table}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "core_bench.md").write_text(text + "\n")
    (args.out / "core_bench.json").write_text(json.dumps({"gpu": gpu, "size": size,
                                                          "command": " ".join(sys.argv),
                                                          "rows": record}, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
