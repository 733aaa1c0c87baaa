"""Does the pipelined copy's speed depend on which hardware queues its streams land on?

CUDA spreads streams over a few hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS,
8 by default) in the order they are made; two streams on one queue are ordered as if
they were one. Here the pipeline's second stream (Kernel._run_pipelined runs the even
chunks on the caller's stream, the odd ones on launch._second_stream) is made after
0..S other streams, kept alive, and the shipped pipeline is timed with each in turns with
the K-major kernel, in one process, each checked against float64 first. (Until the
thirty-second session the pipeline had three streams of its own, and this tool made all
three after the others.)

    python tools/stream_queues_ab.py --pattern 4:32,8:32 --shifts 8 --rounds 7
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _ab import checked_ratios, core_pair, problem_inputs  # noqa: E402

from nmgen.config import ALayout  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402


def stream_sets(shifts: int) -> list:
    """Second streams made after 0, 1, ... ``shifts - 1`` other streams each, with the
    launcher's priority (the least); the other streams are kept."""
    cp = launch._cupy()
    least = launch._priority_range()[0]
    kept, sets = [], []
    for shift in range(shifts):
        kept += [cp.cuda.Stream(non_blocking=True) for _ in range(shift)]
        sets.append(cp.cuda.Stream(non_blocking=True, priority=least))
    stream_sets.kept = kept  # alive as long as the process
    return sets


def with_streams(second, call):
    def timed(i: int) -> None:
        device = launch._cupy().cuda.Device().id
        shipped = launch._SECOND_STREAMS.get(device)
        launch._SECOND_STREAMS[device] = second
        try:
            call(i)
        finally:
            launch._SECOND_STREAMS[device] = shipped
    return timed


def one(pattern: Pattern, size: int, sets: list, rounds: int) -> list[str]:
    cp = launch._cupy()
    a, b, out, ref = problem_inputs(pattern, ALayout.ROW_MAJOR, size, size, size)
    a_km = cp.ascontiguousarray(a.T).T
    km, tx = core_pair(pattern)
    fns = {f"km {km.name}": lambda i: km(a_km, b, out=out)}
    for shift, second in enumerate(sets):
        fns[f"tx, second stream after {shift} more"] = with_streams(
            second, lambda i: tx(a, b, out=out))
    return checked_ratios(fns, out, ref, f"{pattern.n}:{pattern.m}", rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="4:32,8:32")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--shifts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--passes", type=int, default=1,
                        help="time every set this many times over (is a slow set slow again?)")
    parser.add_argument("--side-caller", action="store_true",
                        help="call from a non-blocking stream, not CuPy's default (legacy) one")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    connections = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "unset (8)")
    caller = "a non-blocking stream" if args.side_caller else "the default stream"
    lines = [f"# Pipeline streams after other streams ({launch.device_info().name}, "
             f"M = N = K = {args.size}, CUDA_DEVICE_MAX_CONNECTIONS {connections}, "
             f"called from {caller})", "",
             "| pattern | version | ms | over km |", "| --- | --- | --- | --- |"]
    side = launch._cupy().cuda.Stream(non_blocking=True) if args.side_caller else None
    if side is not None:
        side.use()
    sets = stream_sets(args.shifts)
    for _ in range(args.passes):
        for text in args.pattern.split(","):
            lines += one(Pattern.parse(text), args.size, sets, args.rounds)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
