"""Other chunk plans for the pipelined copy of row-major A (a smaller first chunk, so that
main blocks start sooner), with two or more main-kernel streams, against the shipped
pipeline.

tools/block_timeline.py shows (H100, 4096^3, 4:32) that the pipeline's main blocks do as
much work in all as the K-major kernel's (its undisturbed blocks are even faster); what
it loses is block slots left idle, most of all the 14.4 us before the first main block
(copy 0 of 1024 rows, then the launch). A smaller first chunk shortens that, but on two
main streams main kernel j also waits for main kernel j-2 (stream order), which chunks of
unequal size turn into idle slots; hence more streams (and as many workspaces). Session
25 timed such plans on two streams with the copy of then (results/chunked_tx_h100/).

  km                  the K-major kernel on K-major A (the bound),
  tx                  the shipped pipeline,
  tx PLAN, S streams  chunks of PLAN rows (e.g. 512+512+1024+1024+1024), main kernels
                      on S streams in turns, S workspaces (copy j waits for main j-S);
                      copy 0 on main stream 0, copy 1 2 us after it on the copy stream,
                      as shipped.

    python tools/chunk_plan_ab.py --pattern 4:32 --streams 2,3 \
        --plans 1024+1024+1024+1024,512+512+1024+1024+1024
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _ab import checked_ratios, int_list, pipeline_tool, row_major_core  # noqa: E402
from copy_footprint_ab import queue_first_copy  # noqa: E402

from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402


def planned(tx: launch.Kernel, a, b, out, chunks: list[int], streams: int):
    """The shipped pipeline's order with ``chunks`` and ``streams`` main streams."""
    cp = launch._cupy()
    a_op = launch.operand(a, "a")
    depth, n_cols = a.shape[1], b.shape[1]
    plans = {rows: tx._cached_plan(b, a_op, rows, depth) for rows in set(chunks)}
    starts = [sum(chunks[:j]) for j in range(len(chunks))]
    least, greatest = launch._priority_range()
    copy_stream = cp.cuda.Stream(non_blocking=True, priority=greatest)
    mains = [cp.cuda.Stream(non_blocking=True, priority=least) for _ in range(streams)]
    words = depth * max(p.copy_a.ld for p in plans.values())

    def call(i: int) -> None:
        caller = cp.cuda.get_current_stream()
        spaces = [cp.empty(words, np.float32) for _ in range(streams)]
        begin = launch._record(caller)
        for stream in (copy_stream, *mains):
            stream.wait_event(begin)
        done: list = []
        for j, rows in enumerate(chunks):
            plan, space, main = plans[rows], spaces[j % streams].data.ptr, mains[j % streams]
            source = a_op.ptr + 4 * starts[j] * depth
            if j == 0:
                queue_first_copy(plan, source, space, main, copy_stream)
            else:
                if j >= streams:
                    copy_stream.wait_event(done[j - streams])  # its workspace is free
                plan.launch_copy_a(source, space, copy_stream.ptr)
                main.wait_event(launch._record(copy_stream))
            plan.launch(space, out.data.ptr + 4 * starts[j] * n_cols, main.ptr)
            done.append(launch._record(main))
        for event in done[-streams:]:
            caller.wait_event(event)
    return call


def one(pattern: Pattern, size: int, args: argparse.Namespace) -> list[str]:
    a, b, out, ref, _, tx, fns = row_major_core(pattern, size)
    for text in args.plans:
        chunks = [int(x) for x in text.split("+")]
        if sum(chunks) != size or any(c % tx.config.ms for c in chunks):
            raise SystemExit(f"plan {text}: chunks must be multiples of {tx.config.ms} "
                             f"rows summing to {size}")
        for streams in args.streams:
            fns[f"tx {text}, {streams} streams"] = planned(tx, a, b, out, chunks, streams)
    return checked_ratios(fns, out, ref, f"{pattern.n}:{pattern.m}", args.rounds, 300)


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--plans", required=True, type=lambda s: s.split(","))
        parser.add_argument("--streams", default=[2, 3], type=int_list)
    pipeline_tool(__doc__, "Chunk plans of the pipelined copy", one, options, pattern='4:32')


if __name__ == "__main__":
    main()
