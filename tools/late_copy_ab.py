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
from copy_footprint_ab import Chunk, queue_copy, variant_call  # noqa: E402

from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402


def late(tx: launch.Kernel, a, b, out, delay_us: float):
    """The shipped pipeline with copy j queued behind main kernel j-1's readiness and a
    ``delay_us`` GPU wait on the copy stream."""
    ready: list = []  # per call: when each main kernel may start (its copy is done)

    def queue(chunk: Chunk, copy_stream, done: list) -> None:
        if chunk.j == 0:
            ready.clear()
            chunk.plan.launch_copy_a(chunk.source, chunk.space.data.ptr, chunk.main.ptr)
        else:
            copy_stream.wait_event(ready[-1])
            with copy_stream:
                launch._wait_kernel()((1,), (1,), (np.uint64(delay_us * 1e3),))
            queue_copy(chunk.j, chunk.plan, chunk.source, chunk.space.data.ptr, copy_stream,
                       chunk.main, done)
        ready.append(launch._record(chunk.main))
    return variant_call(tx, a, b, out, queue)


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
