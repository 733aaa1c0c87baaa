"""A/B of two versions of the kernel template in one process: each configuration rendered
from a base template file (A) and from the working tree's template (B), both checked
against float64 (NaN-poisoned output), then timed in turns beside cuBLAS SGEMM.

Why in one process: a change worth a few per cent is smaller than what moves between two
machines or two runs; timed in turns on one GPU, clock drift touches both alike.

    git show HEAD~1:templates/nm_spmm_f32.cu.j2 > /tmp/base.cu.j2
    python tools/template_ab.py --base /tmp/base.cu.j2 --out results/template_ab_h100
    python tools/template_ab.py --base /tmp/base.cu.j2 --nvcc-only   # no GPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _ab import add_variant_args, configs_of, nvcc_table, precompile  # noqa: E402

from nmgen.codegen import render, render_text  # noqa: E402
from nmgen.config import Arch  # noqa: E402
from nmgen.report import markdown_table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="template file of version A")
    parser.add_argument("--rounds", type=int, default=5)
    add_variant_args(parser, "compile both versions with nvcc here instead (no GPU)")
    args = parser.parse_args()
    base = args.base.read_text()
    if args.nvcc_only:
        nvcc_table([(c.name, label, source) for c in configs_of(args.configs, Arch.SM90)
                    for label, source in (("A", render_text(c, base)), ("B", render(c)))],
                   args.cuobjdump)
        return

    import cupy as cp

    from nmgen.gpu.dense import Dense, dense_gemm
    from nmgen.gpu.launch import Kernel, device_info
    from nmgen.gpu.measure import ProblemBench
    from nmgen.gpu.timing import time_in_turns
    from nmgen.results import RTOL

    configs = configs_of(args.configs, device_info().arch)
    sources = [(render_text(c, base), render(c)) for c in configs]
    precompile([s for pair in sources for s in pair])
    size = args.size
    a = cp.random.standard_normal((size, size), dtype=cp.float32)
    sgemm = dense_gemm(Dense.SGEMM, a, a)
    rows, record = [], []
    for config, pair in zip(configs, sources, strict=True):
        bench = ProblemBench(config.n, config.m, 32, config.a_layout, size, size, size)
        kernels = {}
        for label, source in zip("AB", pair, strict=True):
            kernels[label] = Kernel(config)
            kernels[label].source = source  # the version's code; same name and launch
        errors = {label: bench.error(k) for label, k in kernels.items()}
        fns = {label: bench.launcher(k) for label, k in kernels.items()
               if errors[label] < RTOL}
        fns["sgemm"] = lambda i: sgemm()
        ms = time_in_turns(fns, rounds=args.rounds)
        sg = ms["sgemm"]
        a_ms, b_ms = ms.get("A", float("nan")), ms.get("B", float("nan"))
        rows.append([config.name, f"{errors['A']:.1e}", f"{errors['B']:.1e}", f"{a_ms:.4f}",
                     f"{b_ms:.4f}", f"{sg / a_ms:.3f}x", f"{sg / b_ms:.3f}x",
                     f"{a_ms / b_ms:.3f}"])
        record.append({"config": config.name, "error_a": errors["A"], "error_b": errors["B"],
                       "ms_a": a_ms, "ms_b": b_ms, "sgemm_ms": sg})
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
        del bench
    table = markdown_table(["configuration", "error A", "error B", "A ms", "B ms",
                            "A / SGEMM", "B / SGEMM", "A ms / B ms"], rows)
    gpu = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    text = (f"{gpu}, M=N=K={size}, L=32; A: {args.base.name}, B: working tree; "
            f"{args.rounds} rounds in turns\n\n{table}")
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "template_ab.md").write_text(text + "\n")
        (args.out / "template_ab.json").write_text(json.dumps(
            {"gpu": gpu, "size": size, "base": args.base.name, "rows": record}, indent=1) + "\n")


if __name__ == "__main__":
    main()
