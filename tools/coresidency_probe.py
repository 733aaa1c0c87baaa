"""Does a transpose copy run beside a register-capped main kernel, or after it?

The K-major main kernel with its registers capped (``__maxnreg__``) leaves room on each SM
for one small copy block (tools/chunked_tx_ab.py --caps). Timed in turns, in one process:

  main          the capped K-major kernel on all of A,
  copy          the transpose of all of A in blocks of --copy-threads,
  main + copy   both at once: the main kernel launched first on one stream, the copy just
                after on another (greatest priority), the caller waiting for both.

If the copy runs beside the main kernel, "main + copy" takes about as long as "main";
if it only gets SMs the main kernel leaves, about as long as the two one after another.

    python tools/coresidency_probe.py --pattern 4:32 --cap 120 --copy-threads 128
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chunked_tx_ab import coresident, prefer_shared  # noqa: E402

from nmgen.config import ALayout  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402
from nmgen.gpu.bench import random_weight  # noqa: E402
from nmgen.gpu.launch import _cupy, device_info, operand  # noqa: E402
from nmgen.gpu.timing import time_in_turns  # noqa: E402
from nmgen.space import Problem, core_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="4:32")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--cap", type=int, default=120)
    parser.add_argument("--copy-threads", type=int, default=128)
    parser.add_argument("--copy-tile", type=int, default=64,
                        help="side of the copy's shared-memory tile (64 as shipped)")
    parser.add_argument("--carveout", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cp = _cupy()
    pattern = Pattern.parse(args.pattern)
    size = args.size
    a = cp.random.standard_normal((size, size), dtype=cp.float32)
    a_km = cp.ascontiguousarray(a.T).T
    b = random_weight(pattern.n, pattern.m, 32, size, size)
    out = cp.empty((size, size), cp.float32)
    config = core_config(Problem(pattern.n, pattern.m, 32, ALayout.ROW_MAJOR,
                                 device_info().arch))
    import nmgen.codegen as codegen
    codegen.COPY_A_TILE = launch.COPY_A_TILE = args.copy_tile  # rendering and the grid
    tx, km = coresident(config, args.cap, args.copy_threads)
    if args.carveout:
        prefer_shared(tx)
        prefer_shared(km)
    a_op = operand(a, "a")
    plan = tx._cached_plan(b, a_op, size, size)
    space = cp.empty(size * plan.copy_a.ld, cp.float32)
    least, greatest = launch._priority_range()
    side = cp.cuda.Stream(non_blocking=True, priority=greatest)
    other = cp.cuda.Stream(non_blocking=True, priority=least)

    def copy(stream_ptr: int) -> None:
        shipped = launch.COPY_A_THREADS
        launch.COPY_A_THREADS = args.copy_threads
        try:
            plan.launch_copy_a(a_op.ptr, space.data.ptr, stream_ptr)
        finally:
            launch.COPY_A_THREADS = shipped

    def both(i: int) -> None:
        caller = cp.cuda.get_current_stream()
        begin = launch._record(caller)
        other.wait_event(begin)
        side.wait_event(begin)
        with other:
            km(a_km, b, out=out)
        copy(side.ptr)
        caller.wait_event(launch._record(other))
        caller.wait_event(launch._record(side))

    def spans(calls: int = 20) -> tuple[float, float]:
        """Median (main end, copy end) in us after the shared start, launched as in
        "main + copy"."""
        import statistics
        main_ends, copy_ends = [], []
        for _ in range(calls):
            cp.cuda.Device().synchronize()
            start, main_end, copy_end = (cp.cuda.Event() for _ in range(3))
            start.record()
            other.wait_event(start)
            side.wait_event(start)
            with other:
                km(a_km, b, out=out)
            main_end.record(other)
            copy(side.ptr)
            copy_end.record(side)
            cp.cuda.Device().synchronize()
            main_ends.append(cp.cuda.get_elapsed_time(start, main_end) * 1e3)
            copy_ends.append(cp.cuda.get_elapsed_time(start, copy_end) * 1e3)
        return statistics.median(main_ends), statistics.median(copy_ends)

    fns = {"main": lambda i: km(a_km, b, out=out),
           "copy": lambda i: copy(cp.cuda.get_current_stream().ptr),
           "main + copy": both}
    times = time_in_turns(fns, rounds=args.rounds, repeat=10)
    carveout = "max shared" if args.carveout else "default"
    print(f"# {device_info().name}, {args.pattern}, {size}^3, cap {args.cap}, copy "
          f"{args.copy_threads} threads, tile {args.copy_tile}, carveout {carveout}")
    for name, t in times.items():
        print(f"| {name} | {t:.4f} ms |")
    main_end, copy_end = spans()
    print(f"| launched together: main ends at {main_end:.1f} us, copy at {copy_end:.1f} us |")
    print(f"| main + copy - main | {times['main + copy'] - times['main']:.4f} ms "
          f"(copy alone {times['copy']:.4f}) |")


if __name__ == "__main__":
    main()
