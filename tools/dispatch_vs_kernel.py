"""Is a bench outlier the dispatch path or the GPU? Times ``nmgen.dispatch`` and a direct
call of the kernel it picks, on the same data, in turns over many rounds, with and
without the 100 us queue-ahead wait that keeps the host path out of the events.

    python tools/dispatch_vs_kernel.py --problem 16:32,rm,256,2048,2048 \
        --problem 8:32,km,4096,2048,2048 --rounds 9

Prints one line a round (ms): dispatch and kernel with the wait, then without it; a
dispatch path slower than the kernel only without the wait is host time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _ab import problem_inputs  # noqa: E402

from nmgen.config import ALayout  # noqa: E402
from nmgen.dispatch import Dispatcher, problem_key  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import measure  # noqa: E402
from nmgen.gpu.timing import time_ms  # noqa: E402


def parse_problem(text: str) -> tuple[Pattern, ALayout, int, int, int]:
    pattern, layout, *dims = text.split(",")
    return (Pattern.parse(pattern), ALayout(layout), *map(int, dims))


def one(dispatcher: Dispatcher, problem, rounds: int, repeat: int) -> None:
    p, layout, rows, cols, depth = problem
    a, b, out, ref = problem_inputs(p, layout, rows, cols, depth)
    config = dispatcher.decide(problem_key(p.n, p.m, 32, layout, rows, cols, depth)).config
    kernel = dispatcher.kernel(config)
    fns = {"dispatch": lambda i: dispatcher(a, b, out=out),
           "kernel": lambda i: kernel(a, b, out=out)}
    for name, fn in fns.items():
        err = measure.poisoned_error(lambda fn=fn: fn(0), out, ref)
        print(f"{name} relative error {err:.1e}", flush=True)
    print(f"{p.n}:{p.m} {layout.value} {rows}x{cols}x{depth} {config.name}")
    print("round  dispatch   kernel   (no wait) dispatch   kernel")
    samples: dict[str, list[float]] = {}
    for r in range(rounds):
        cells = []
        for wait in (100.0, 0.0):
            for name, fn in fns.items():
                t = time_ms(fn, warmup=1, repeat=repeat, queue_ahead_us=wait)
                samples.setdefault(f"{name}/{wait:g}", []).append(t)
                cells.append(f"{t:8.4f}")
        print(f"{r:5d}  {cells[0]} {cells[1]}            {cells[2]} {cells[3]}", flush=True)
    print("median " + "  ".join(f"{k} {statistics.median(v):.4f}" for k, v in samples.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", action="append", required=True, type=parse_problem,
                        help="PATTERN,LAYOUT,M,N,K (layout rm or km)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    dispatcher = Dispatcher()
    for problem in args.problem:
        one(dispatcher, problem, args.rounds, args.repeat)


if __name__ == "__main__":
    main()
