"""A/B of versions of the kernel template in one process: each configuration rendered
from a base template file (A) and from the working tree's template (B), or from each of
the ``--variants`` files (B, C, ...), all checked against float64 (NaN-poisoned output),
then timed in turns beside cuBLAS SGEMM.

Why in one process: a change worth a few per cent is smaller than what moves between two
machines or two runs; timed in turns on one GPU, clock drift touches both alike.

    git show HEAD~1:templates/nm_spmm_f32.cu.j2 > /tmp/base.cu.j2
    python tools/template_ab.py --base /tmp/base.cu.j2 --out results/template_ab_h100
    python tools/template_ab.py --base /tmp/base.cu.j2 --nvcc-only   # no GPU
    python tools/template_ab.py --base templates/nm_spmm_f32.cu.j2 --variants v1.j2,v2.j2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _ab import add_variant_args, configs_of, nvcc_table, precompile, save_report  # noqa: E402

from nmgen.codegen import render, render_text  # noqa: E402
from nmgen.config import Arch  # noqa: E402
from nmgen.report import markdown_table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="template file of version A")
    parser.add_argument("--variants", default="",
                        help="template files of versions B, C, ... (default: the working tree's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--time-wrong", action="store_true",
                        help="time versions that fail the float64 check too (diagnostic "
                             "variants that skip work on purpose)")
    add_variant_args(parser, "compile every version with nvcc here instead (no GPU)")
    args = parser.parse_args()
    paths = [Path(v) for v in args.variants.split(",")] if args.variants else [None]
    if len(paths) > 6:
        parser.error("at most 6 variants")
    # label -> (what it is, template text; None: the working tree's template)
    versions = {"A": (args.base.name, args.base.read_text())}
    for label, path in zip("BCDEFG", paths, strict=False):
        versions[label] = (path.name, path.read_text()) if path else ("working tree", None)

    def sources_of(configs):
        """{label: source} per configuration; says where a version is A's code again."""
        out = []
        for config in configs:
            per_config = {label: render(config) if text is None else render_text(config, text)
                          for label, (_, text) in versions.items()}
            same = [x for x, s in per_config.items() if x != "A" and s.code == per_config["A"].code]
            if same:  # a variant that does not reach this configuration's code
                print(f"{config.name}: {', '.join(same)} render the same source as A",
                      file=sys.stderr)
            out.append(per_config)
        return out

    if args.nvcc_only:
        configs = configs_of(args.configs, Arch.SM90, args.winners)
        nvcc_table([(c.name, label, source)
                    for c, per_config in zip(configs, sources_of(configs), strict=True)
                    for label, source in per_config.items()], args.cuobjdump)
        return

    import cupy as cp

    from nmgen.gpu.dense import Dense, dense_gemm
    from nmgen.gpu.launch import Kernel, device_info
    from nmgen.gpu.measure import ProblemBench
    from nmgen.gpu.timing import time_in_turns
    from nmgen.results import RTOL

    configs = configs_of(args.configs, device_info().arch, args.winners)
    sources = sources_of(configs)
    precompile([s for per_config in sources for s in per_config.values()])
    size = args.size
    a = cp.random.standard_normal((size, size), dtype=cp.float32)
    sgemm = dense_gemm(Dense.SGEMM, a, a)
    labels = list(versions)
    rows, record = [], []
    for config, per_config in zip(configs, sources, strict=True):
        bench = ProblemBench(config.n, config.m, 32, config.a_layout, size, size, size)
        # The version's code under the configuration's name and launch.
        kernels = {label: Kernel(config, source) for label, source in per_config.items()}
        errors = {label: bench.error(k) for label, k in kernels.items()}
        fns = {label: bench.launcher(k) for label, k in kernels.items()
               if errors[label] < RTOL or args.time_wrong}
        fns["sgemm"] = lambda i: sgemm()
        ms = time_in_turns(fns, rounds=args.rounds)
        times = {label: ms.get(label, float("nan")) for label in labels}
        rows.append([config.name, *(f"{errors[x]:.1e}" for x in labels),
                     *(f"{times[x]:.4f}" for x in labels),
                     *(f"{ms['sgemm'] / times[x]:.3f}x" for x in labels),
                     *(f"{times['A'] / times[x]:.3f}" for x in labels[1:])])
        record.append({"config": config.name, "sgemm_ms": ms["sgemm"],
                       **{f"error_{x.lower()}": errors[x] for x in labels},
                       **{f"ms_{x.lower()}": times[x] for x in labels}})
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
        del bench
    table = markdown_table(["configuration", *(f"error {x}" for x in labels),
                            *(f"{x} ms" for x in labels), *(f"{x} / SGEMM" for x in labels),
                            *(f"A ms / {x} ms" for x in labels[1:])], rows)
    gpu = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    named = ", ".join(f"{x}: {what}" for x, (what, _) in versions.items())
    text = f"{gpu}, M=N=K={size}, L=32; {named}; {args.rounds} rounds in turns\n\n{table}"
    save_report(args.out, "template_ab", text, {
        "gpu": gpu, "size": size, "versions": {x: what for x, (what, _) in versions.items()},
        "rows": record})


if __name__ == "__main__":
    main()
