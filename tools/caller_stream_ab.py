"""Fewer waits between streams in the pipelined row-major call.

Replayed from a CUDA graph, the pipelined call of the thirty-first session read about
0.5 % faster than launched as usual (tools/queue_ahead_ab.py: 1.049 against 1.055 of
K-major at 4:32), and the wait queued ahead of each timed call was not what made the
difference. The graph turns the waits between streams into edges: the two pipeline
streams (of the greatest priority) waited for the caller's work, stream 1 for copy 0's
end, and the caller for both streams' last kernels. The launcher now runs chunks 0, 2, ...
on the caller's own stream and the odd ones on a second stream of the least priority
(``launch._second_stream``): no wait before copy 0 and one at the end. The variants,
timed in turns in one process after a float64 check (NaN-poisoned output) of each:

  km                          the K-major kernel on K-major A (the bound),
  tx                          the launcher,
  tx, two greatest streams    the launcher of before (two streams of the greatest
                              priority that wait for the caller's, and it for them),
  tx, caller even, greatest   the launcher with a second stream of the greatest priority,
  tx graph                    the launcher's call replayed from a CUDA graph.

    python tools/caller_stream_ab.py --pattern 4:32,8:32 --rounds 9 [--side-caller]

--side-caller calls from a non-blocking stream of the process instead of CuPy's default
(legacy) stream. The first run (caller_stream_run1.md) was taken before the launcher
changed: its "tx" is the launcher of before, "caller even, least" the launcher of now.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import (  # noqa: E402
    checked_ratios,
    greatest_streams,
    pipeline_tool,
    row_major_core,
)
from graph_core_ab import replayed  # noqa: E402
from in_stream_copy_ab import in_stream  # noqa: E402

from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402


def one(pattern: Pattern, size: int, args) -> list[str]:
    shape = tuple(int(x) for x in args.shape.split("x")) if args.shape else None
    a, b, out, ref, km, tx, fns = row_major_core(pattern, size, shape)
    tx_name = list(fns)[1]
    greatest = greatest_streams(a.device.id)
    delay = launch.COPY_1_DELAY_NS
    fns["tx, two greatest streams"] = in_stream(tx, a, b, out, greatest, delay)
    fns["tx, caller even, greatest"] = in_stream(tx, a, b, out, (None, greatest[1]), delay)
    fns["tx graph"] = replayed(fns[tx_name])
    label = f"{pattern.n}:{pattern.m}" + (f" {args.shape}" if shape else "")
    return checked_ratios(fns, out, ref, label, args.rounds)


def main() -> None:
    def options(parser) -> None:
        parser.add_argument("--side-caller", action="store_true",
                            help="call from a non-blocking stream, not CuPy's default one")
        parser.add_argument("--shape", default="", metavar="MxNxK",
                            help="this problem instead of size^3")

    side = "--side-caller" in sys.argv
    if side:
        main.side = launch._cupy().cuda.Stream(non_blocking=True)  # alive as the process
        main.side.use()
    title = "Fewer waits between streams" + (", called from a side stream" if side else "")
    pipeline_tool(__doc__, title, one, options)


if __name__ == "__main__":
    main()
