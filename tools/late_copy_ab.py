"""Copies of a pipelined row-major launch held back into the previous main kernel's tail,
against the shipped pipeline.

tools/block_timeline.py shows (H100, 4096^3, 4:32) that the main blocks which share their
SM with copy blocks take 93-101 us where the others take 80-82 us, and that a third of
the main blocks do. Here copy j (j >= 1) waits, on the GPU, until main kernel j-1 can
start plus D us (``--delays``), so that it runs while main kernel j-1's blocks end and
free their slots instead of beside them. Timed in turns in one process after a float64
check of every version:

  km            the K-major kernel on K-major A (the bound),
  tx            the shipped pipeline,
  tx late D     copy j D us after main kernel j-1 became ready.

    python tools/late_copy_ab.py --pattern 4:32,8:32 --delays 40,60,70,80 --rounds 9
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _ab import checked_ratios, float_list, pipeline_tool, row_major_core  # noqa: E402
from copy_footprint_ab import chunk_plans, end_call, queue_copy, queue_main, start_call  # noqa: E402

from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402


def late(tx: launch.Kernel, a, b, out, delay_us: float):
    """The shipped pipeline with copy j queued behind main kernel j-1's readiness and a
    ``delay_us`` GPU wait on the copy stream."""
    a_op, depth, chunks, plans, starts = chunk_plans(tx, a, b)
    copy_stream, main_streams = launch._pipeline_streams(a_op.device)
    n_cols = b.shape[1]

    def call(i: int) -> None:
        caller, spaces = start_call(plans, depth, (copy_stream, *main_streams))
        done: list = []
        ready = None
        for j, rows in enumerate(chunks):
            plan, space, main = plans[rows], spaces[j % 2].data.ptr, main_streams[j % 2]
            source = a_op.ptr + 4 * starts[j] * depth
            if j == 0:
                plan.launch_copy_a(source, space, main.ptr)
            else:
                copy_stream.wait_event(ready)
                with copy_stream:
                    launch._wait_kernel()((1,), (1,), (np.uint64(delay_us * 1e3),))
                queue_copy(j, plan, source, space, copy_stream, main, done)
            ready = launch._record(main)  # main kernel j may start: its copy is done
            queue_main(plan, space, out.data.ptr + 4 * starts[j] * n_cols, main, done)
        end_call(caller, done)
    return call


def one(pattern: Pattern, size: int, args: argparse.Namespace) -> list[str]:
    a, b, out, ref, _, tx, fns = row_major_core(pattern, size)
    for delay in args.delays:
        fns[f"tx late {delay:g}"] = late(tx, a, b, out, delay)
    return checked_ratios(fns, out, ref, f"{pattern.n}:{pattern.m}", args.rounds, 300)


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--delays", default=[40.0, 60.0, 70.0, 80.0], type=float_list)
    pipeline_tool(__doc__, "Copies held back into the previous main kernel's tail", one, options)


if __name__ == "__main__":
    main()
