"""Probe of the overlapped copy ("to"): the copy kernels alone and the whole call, on the
default stream and on a stream of its own (programmatic dependent launch may not overlap
on the legacy default stream). H100, M = N = K = 4096, L = 32.

    python tools/overlap_probe.py --pattern 4:32 --config NAME_rm_to_tma_sm90
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.config import ALayout, KernelConfig  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", required=True, help="kernel names, comma-separated")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    import cupy as cp

    from nmgen.gpu.launch import Kernel
    from nmgen.gpu.measure import ProblemBench

    def timed(fn, stream) -> float:
        for _ in range(3):
            fn()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(args.repeat):
            fn()
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / args.repeat

    size = args.size
    for name in args.configs.split(","):
        config = KernelConfig.from_name(name)
        bench = ProblemBench(config.n, config.m, config.vec, ALayout(config.a_layout), size,
                             size, size)
        kernel = Kernel(config)
        a = bench.a_buffers[0]
        print(name, "error", bench.error(kernel), flush=True)
        side = cp.cuda.Stream(non_blocking=True)
        for label, stream in (("default stream", cp.cuda.Stream.null), ("own stream", side)):
            call = functools.partial(kernel, a, bench.weight, out=bench.out, stream=stream)
            with stream:
                ms = timed(call, stream)
            print(f"  {label}: {ms:.4f} ms", flush=True)
        plan = next((v for k, v in bench.weight._prepared.items()
                     if isinstance(k, tuple) and k[0] == "plan"), None)
        if plan is not None and plan.copy_a is not None and plan.copy_a.counters:
            from nmgen.gpu.launch import _launch  # to: the persistent copy alone

            copy_a = plan.copy_a
            work = cp.empty((size, copy_a.ld), cp.float32)
            counters = cp.zeros(copy_a.counters, cp.int32)
            copy_a.args[0].value, copy_a.args[4].value = work.data.ptr, counters.data.ptr
            copy_a.tma_rows.point_at(a.data.ptr)
            alone = functools.partial(_launch, copy_a.function, copy_a.grid, copy_a.threads, 0,
                                      copy_a.params, 0)
            ms = timed(alone, cp.cuda.Stream.null)
            print(f"  copy kernel alone (grid {copy_a.grid}): {ms:.4f} ms", flush=True)
        if plan is not None and plan.copy_a is not None and not plan.copy_a.counters:
            work = cp.empty((size, plan.copy_a.ld), cp.float32)  # tx: the copy kernel alone
            copy = functools.partial(plan.launch_copy_a, a.data.ptr, work.data.ptr, 0)
            ms = timed(copy, cp.cuda.Stream.null)
            print(f"  copy kernel alone (grid {plan.copy_a.grid}): {ms:.4f} ms", flush=True)

if __name__ == "__main__":
    main()
