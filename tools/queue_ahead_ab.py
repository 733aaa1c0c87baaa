"""Does the host's side of the pipelined row-major call leak into its timing?

``time_ms`` queues each timed call behind a ``QUEUE_AHEAD_US`` (100 us) wait on the GPU, so
that the host's cost of making the call stays out of the figure. That holds while the
call's host path is shorter than the wait; the pipelined row-major call makes 9 launches,
event records and waits. This tool measures each call's host path (the GPU kept busy behind
a long wait, so that nothing blocks) and times the K-major core kernel, the shipped
row-major launch and its CUDA-graph replay behind waits of several lengths, in turns, in
one process, every version first checked against float64 on a poisoned output:

    python tools/queue_ahead_ab.py --pattern 4:32,8:32 --rounds 9 --queues 100,200,400
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import float_list, pipeline_tool, row_major_core  # noqa: E402
from graph_core_ab import replayed  # noqa: E402

from nmgen.format import Pattern  # noqa: E402


def host_us(fn, calls: int = 30) -> float:
    """Median host microseconds of ``fn(i)`` while the GPU is busy behind a long wait."""
    import cupy as cp
    import numpy as np

    from nmgen.gpu.launch import _wait_kernel

    stream = cp.cuda.get_current_stream()
    spans = []
    for i in range(calls):
        _wait_kernel()((1,), (1,), (np.uint64(2_000_000),), stream=stream)  # 2 ms
        start = time.perf_counter()
        fn(i)
        spans.append(1e6 * (time.perf_counter() - start))
        stream.synchronize()
    return statistics.median(spans)


def one(pattern: Pattern, size: int, args) -> list[str]:
    from nmgen.gpu import measure
    from nmgen.gpu.timing import time_ms

    a, b, out, ref, km, tx, fns = row_major_core(pattern, size)
    km_name, tx_name = list(fns)
    versions = {"km": fns[km_name], "tx": fns[tx_name], "tx graph": replayed(fns[tx_name])}
    for name, fn in versions.items():
        err = measure.poisoned_error(lambda fn=fn: fn(0), out, ref)
        if not err < 1e-5:
            raise RuntimeError(f"{name} is wrong: relative error {err:.3g}")
    host = {name: host_us(fn) for name, fn in versions.items()}
    samples = {(name, q): [] for q in args.queues for name in versions}
    for _ in range(args.rounds):
        for name, q in samples:
            samples[name, q].append(time_ms(versions[name], warmup=1, repeat=10,
                                            queue_ahead_us=q))
    times = {key: statistics.median(v) for key, v in samples.items()}
    label = f"{pattern.n}:{pattern.m}"
    lines = []
    for q in args.queues:
        bound = times["km", q]
        for name in versions:
            t = times[name, q]
            lines.append(f"| {label} | {name}, wait {q:g} us (host path {host[name]:.0f} us)"
                         f" | {t:.4f} | {t / bound:.3f} |")
            print(lines[-1], flush=True)
    print(f"{label}: {km_name}, {tx_name}", flush=True)
    return lines


def extra(parser) -> None:
    parser.add_argument("--queues", type=float_list, default=[100.0, 200.0, 400.0],
                        help="GPU waits ahead of each timed call, us")


def main() -> None:
    pipeline_tool(__doc__, "Timed behind GPU waits of several lengths", one, extra)


if __name__ == "__main__":
    main()
