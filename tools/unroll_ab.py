"""A/B of the compute loop's unroll: the core benchmark's best kernels (or --configs) with
the per-stage row loop unrolled fully and by 16, 8, 4.

Why: a fully unrolled stage of a 16x8 thread tile is ~4000 FFMAs, ~70 KB of code per
loop body, which streams through the instruction caches every stage, and the unroll sets
how long nvcc takes (--nvcc-only). Every variant is checked against float64 (NaN-poisoned
output) before it is timed; cuBLAS SGEMM is timed in the same process.

    python tools/unroll_ab.py --out results/unroll_h100
    python tools/unroll_ab.py --nvcc-only > results/unroll_h100/nvcc_seconds.txt   # no GPU
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _ab import add_variant_args, configs_of, nvcc_table, precompile  # noqa: E402

from nmgen.codegen import KernelSource, render  # noqa: E402
from nmgen.config import Arch  # noqa: E402
from nmgen.report import markdown_table  # noqa: E402

ROW_LOOP = re.compile(r"#pragma unroll \d+(\s*\n\s*for \(int w = 0; w < WS; \+\+w\))")


def with_unroll(source: KernelSource, unroll: int) -> KernelSource:
    code, count = ROW_LOOP.subn(rf"#pragma unroll {unroll}\1", source.code)
    if count != 1:
        raise RuntimeError(f"{source.name}: the row loop's pragma was not found once")
    return KernelSource(source.config, code)


def variants_of(arch: Arch, unrolls: list[int], names: str = "", winners: int = 0
                ) -> list[tuple]:
    """(configuration, row unroll, source) for the named kernels, by default the core's
    best (unroll 0: full)."""
    return [(c, u or c.ws, with_unroll(render(c), u or c.ws))
            for c in configs_of(names, arch, winners) for u in unrolls]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unrolls", default="0,16,8,4", help="0: full (WS)")
    add_variant_args(parser, "time nvcc on each variant instead (sm_90, no GPU)")
    args = parser.parse_args()
    unrolls = [int(u) for u in args.unrolls.split(",")]
    if args.nvcc_only:
        nvcc_table([(c.name, f"unroll {u}", src)
                    for c, u, src in variants_of(Arch.SM90, unrolls, args.configs, args.winners)],
                   args.cuobjdump)
        return

    import cupy as cp

    from nmgen.gpu.dense import Dense, dense_gemm
    from nmgen.gpu.launch import Kernel, device_info
    from nmgen.gpu.measure import ProblemBench
    from nmgen.gpu.timing import time_ms
    from nmgen.results import RTOL

    variants = variants_of(device_info().arch, unrolls, args.configs, args.winners)
    precompile([v[2] for v in variants])
    s = args.size
    a = cp.random.standard_normal((s, s), dtype=cp.float32)
    sgemm = dense_gemm(Dense.SGEMM, a, a)
    sgemm_ms = time_ms(lambda i: sgemm())
    rows, record, bench, problem = [], [], None, None
    for config, unroll, source in variants:
        if problem != (config.n, config.m, config.a_layout):  # one problem alive at a time
            problem = (config.n, config.m, config.a_layout)
            bench = ProblemBench(config.n, config.m, 32, config.a_layout, s, s, s)
        kernel = Kernel(config, source)  # the variant's code; same name and launch
        err = bench.error(kernel)
        ms = bench.time_ms(kernel, repeat=30) if err < RTOL else float("nan")
        rows.append([config.name, unroll, f"{err:.1e}", f"{ms:.4f}", f"{sgemm_ms / ms:.3f}x"])
        record.append({"config": config.name, "unroll": unroll, "error": err, "ms": ms,
                       "speedup": sgemm_ms / ms})
        print(" | ".join(map(str, rows[-1])), file=sys.stderr, flush=True)
    table = markdown_table(["configuration", "row unroll", "rel. error", "ms",
                            "speedup over SGEMM"], rows)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, M=N=K={s}, "
          f"SGEMM {sgemm_ms:.3f} ms\n\n{table}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "unroll.md").write_text(table)
        (args.out / "unroll.json").write_text(json.dumps(
            {"sgemm_ms": sgemm_ms, "size": s, "rows": record}, indent=1) + "\n")


if __name__ == "__main__":
    main()
