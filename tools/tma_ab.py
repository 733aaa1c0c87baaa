"""Experiment: a stage's copies on Hopper's bulk copy engine (TMA) against the shipped
``cp.async`` copies, in one process (H100/H200 only).

The variant template (``--variant``, e.g. results/tma_h100/variant_tma.cu.j2) has one
thread issue, per stage, a 2-D tensor copy of the A tile, one of the B' tile and a bulk
copy of the index table, all counted on one mbarrier a buffer. Its two tensor maps are
encoded here (``nmgen.gpu.tma.encode_matrix``) and put in device memory where the shipped
kernel's ROWS table pointer goes (an unpacked K-major kernel
does not read that table), so both versions launch with the same arguments otherwise.

Each version is checked against float64 (NaN-poisoned output), then timed in turns with
cuBLAS SGEMM:

    python tools/tma_ab.py --variant results/tma_h100/variant_tma.cu.j2 \
        --configs NAME,NAME --rounds 7 --out results/tma_h100/run1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from _ab import save_report  # noqa: E402

from nmgen.codegen import render, render_text  # noqa: E402
from nmgen.config import KernelConfig  # noqa: E402
from nmgen.report import markdown_table  # noqa: E402

TMA_STATIC_SMEM = 128  # the variant's mbarriers (ptxas reports 128 bytes of static smem)


def tma_kernel(config: KernelConfig, source, bench):
    """The variant's Kernel with its launch plan made by hand: the tensor maps of this
    bench's A and of the weight's B' in place of the ROWS pointer."""
    import cupy as cp

    from nmgen.gpu.launch import Kernel, device_layout, operand
    from nmgen.gpu.tma import TensorMap, encode_matrix

    kernel = Kernel(config, source)
    a = bench.a_buffers[0]
    a_op = operand(a, "a")
    m_rows, lda = kernel._check_a(a_op, bench.weight)
    plan = kernel._plan(bench.weight, a_op.device, m_rows, lda, a_op.ptr % 16 == 0)
    layout = device_layout(bench.weight, config)
    rows_b, ldb = layout.values.shape
    k_dim = bench.weight.shape[0]
    map_a, map_b = TensorMap(), TensorMap()
    encode_matrix(map_a, a_op.ptr, m_rows, k_dim, lda, (config.ms, config.ks))
    encode_matrix(map_b, layout.values.data.ptr, ldb, rows_b, ldb, (config.ns, config.ws))
    maps = bytes(map_a) + bytes(map_b)
    buffer = cp.asarray(np.frombuffer(maps, np.uint8))
    assert buffer.data.ptr % 128 == 0
    plan.args[3].value = buffer.data.ptr
    plan.keep = buffer  # the maps live as long as the plan
    key = ("plan", kernel._source_key, a_op.device, m_rows, lda, a_op.ptr % 16 == 0)
    bench.weight._prepared[key] = plan
    return kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", type=Path, required=True)
    parser.add_argument("--configs", required=True, help="comma-separated kernel names")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-stages", type=int, default=0,
                        help="allow configurations of up to this many stages (the shipped "
                             "limit is config.MAX_STAGES)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.max_stages:
        import nmgen.config
        nmgen.config.MAX_STAGES = args.max_stages

    import cupy as cp

    from nmgen.config import ALayout
    from nmgen.gpu.dense import Dense, dense_gemm
    from nmgen.gpu.launch import Kernel
    from nmgen.gpu.measure import ProblemBench
    from nmgen.gpu.timing import time_in_turns
    from nmgen.results import RTOL

    text = args.variant.read_text()
    size = args.size
    a = cp.random.standard_normal((size, size), dtype=cp.float32)
    sgemm = dense_gemm(Dense.SGEMM, a, a)
    rows, record = [], []
    for name in args.configs.split(","):
        config = KernelConfig.from_name(name)
        if config.a_layout is not ALayout.K_MAJOR:
            raise SystemExit(f"{name}: the experiment covers K-major A only")
        bench = ProblemBench(config.n, config.m, 32, config.a_layout, size, size, size)
        shipped = Kernel(config, render(config))
        kernels = {"shipped": shipped}
        if config.smem_bytes + TMA_STATIC_SMEM <= config.arch.max_smem_per_block:
            kernels["tma"] = tma_kernel(config, render_text(config, text), bench)
        errors = {x: bench.error(k) for x, k in kernels.items()}
        errors.setdefault("tma", float("nan"))
        a0 = bench.a_buffers[0]  # the tensor map holds this buffer's address
        weight, out_c = bench.weight, bench.out
        fns = {x: (lambda i, k=k, a=a0, w=weight, o=out_c: k(a, w, out=o))
               for x, k in kernels.items() if errors[x] < RTOL}
        fns["sgemm"] = lambda i: sgemm()
        ms = time_in_turns(fns, rounds=args.rounds)
        t_s, t_t = ms.get("shipped", float("nan")), ms.get("tma", float("nan"))
        rows.append([name, f"{errors['shipped']:.1e}", f"{errors['tma']:.1e}", f"{t_s:.4f}",
                     f"{t_t:.4f}", f"{ms['sgemm'] / t_s:.3f}x", f"{ms['sgemm'] / t_t:.3f}x",
                     f"{t_s / t_t:.3f}"])
        record.append({"config": name, "sgemm_ms": ms["sgemm"], "errors": errors,
                       "ms_shipped": t_s, "ms_tma": t_t})
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    gpu = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    table = markdown_table(["configuration", "error shipped", "error TMA", "shipped ms",
                            "TMA ms", "shipped / SGEMM", "TMA / SGEMM",
                            "shipped ms / TMA ms"], rows)
    out = (f"{gpu}, M=N=K={size}, L=32, K-major A; variant {args.variant.name}; "
           f"{args.rounds} rounds in turns\n\n{table}")
    save_report(args.out, "tma_ab", out, {"gpu": gpu, "size": size, "rows": record})


if __name__ == "__main__":
    main()
