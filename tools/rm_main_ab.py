"""Which main kernel runs best behind the pipelined copy of row-major A: the K-major core
kernel and row-major (tx) candidates of several tiles and pipelines, all timed in turns in
one process after a float64 check (NaN-poisoned output). Each time is given over the
K-major core kernel's, which is what "row-major A within 5 % of K-major A" compares with.

The best K-major kernel need not be the best one behind the copy: the copies that run
beside a main kernel slow it (results/copy_order_h100/), and a deeper pipeline may hide
that better.

    python tools/rm_main_ab.py --pattern 4:32 --tiles 64x256x16x4x4x8 \
        --pipelines 4x2,2x3,2x2 --out results/rm_main_h100
    python tools/rm_main_ab.py ... --copy-template results/register_copy_h100/register_copy.cu.j2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _ab import precompile, save_report  # noqa: E402
from tma_core_ab import candidates  # noqa: E402

from nmgen.codegen import render, render_text  # noqa: E402
from nmgen.config import ALayout  # noqa: E402
from nmgen.report import markdown_table  # noqa: E402
from nmgen.space import Problem, core_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pattern", default="4:32", help="patterns, comma-separated")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--tiles", default="64x256x16x4x4x8", help="MSxNSxMTxNTxWMxWN,...")
    parser.add_argument("--pipelines", default="4x2,2x3,2x2", help="WINDOWSxSTAGES,...")
    parser.add_argument("--tma", choices=("both", "yes", "no"), default="yes")
    parser.add_argument("--copy-template", type=Path,
                        help="also each row-major candidate rendered from this template "
                             "(a version of the transpose kernel)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from nmgen.gpu.launch import Kernel, device_info
    from nmgen.gpu.measure import ProblemBench
    from nmgen.gpu.timing import time_in_turns
    from nmgen.results import RTOL

    size, arch = args.size, device_info().arch
    tmas = {"both": (False, True), "yes": (True,), "no": (False,)}[args.tma]
    pipelines = [tuple(int(x) for x in p.split("x")) for p in args.pipelines.split(",")]
    variant = args.copy_template.read_text() if args.copy_template else None
    rows, record = [], []
    for pattern in args.pattern.split(","):
        n, m = (int(x) for x in pattern.split(":"))
        benches = {layout: ProblemBench(n, m, 32, layout, size, size, size) for layout in ALayout}
        core = core_config(Problem(n, m, 32, ALayout.K_MAJOR, arch))
        sources = {("km", core.name): render(core)}
        for config in candidates(pattern, ALayout.ROW_MAJOR, args.tiles.split(","), pipelines,
                                 tmas):
            sources[("rm", config.name)] = render(config)
            if variant is not None:
                sources[("rm+copy", config.name)] = render_text(config, variant)
        precompile(list(sources.values()))
        kernels = {key: Kernel(source.config, source) for key, source in sources.items()}
        fns = {}
        for key, kernel in kernels.items():
            bench = benches[kernel.config.a_layout]
            error = bench.error(kernel)
            if not error < RTOL:
                raise RuntimeError(f"{key}: relative error {error:.3g}")
            fns[key] = bench.launcher(kernel)
        times = time_in_turns(fns, rounds=args.rounds)
        bound = times[("km", core.name)]
        for (what, name), t in times.items():
            rows.append([pattern, what, f"`{name}`", f"{t:.4f}", f"{t / bound:.3f}"])
            record.append({"pattern": pattern, "version": what, "config": name, "ms": t,
                           "over_km_core": t / bound})
            print(" | ".join(rows[-1]), flush=True)
        del benches
    gpu = device_info().name
    table = markdown_table(["pattern", "version", "kernel", "ms", "over K-major core"], rows)
    text = (f"{gpu}, M=N=K={size}, L=32; {args.rounds} rounds in turns; rm+copy: the "
            f"transpose of {args.copy_template}\n\n{table}")
    save_report(args.out, "rm_main_ab", text, {"gpu": gpu, "size": size, "rows": record})


if __name__ == "__main__":
    main()
