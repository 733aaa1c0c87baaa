"""Would splitting the first chunk along K shorten the pipelined call? An experiment.

In the shipped pipeline (Kernel._run_pipelined) main kernel 0 waits for all of copy 0,
which runs alone (15.8 us of a 4:32 call at 4096^3, results/copy_order_h100/timeline7.md).
Here chunk 0 is done in two halves of K instead: copy 0a (the first K/2 columns of the
chunk's rows) on main stream 0, main kernel 0a on them (C = A_a B_a), copy 0b on the copy
stream behind a 2 us wait (so that main kernel 0a takes the SMs first), then main kernel
0b (C += A_b B_b), compiled from a version of the template whose epilogue adds to C
(results/ksplit_h100/accumulate.cu.j2). Chunks 1.. are as shipped. Each version is
checked against float64 (NaN-poisoned output), then timed in turns with the K-major
kernel and the shipped pipeline.

    python tools/ksplit_first_chunk_ab.py --pattern 4:32,8:32 --rounds 9
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from _ab import checked_ratios, float_list, pipeline_tool, row_major_core  # noqa: E402
from copy_footprint_ab import (  # noqa: E402
    chunk_plans,
    end_call,
    queue_copy,
    queue_main,
    start_call,
    streams_before_29,
)

from nmgen.codegen import render_text  # noqa: E402
from nmgen.format import NMMatrix, Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402

ACCUMULATE = Path(__file__).resolve().parent.parent / "results/ksplit_h100/accumulate.cu.j2"


def halves(b: NMMatrix) -> tuple[NMMatrix, NMMatrix]:
    """``b``'s first and second K/2 rows (K a multiple of 2m), as weights of their own."""
    depth, cols = b.shape
    half = depth // 2
    if half % b.m:
        raise ValueError(f"K = {depth}: halves must be whole windows of {b.m}")
    rows = half // b.m * b.n
    return tuple(NMMatrix.from_compressed(b.values[part], b.indices[part], (b.n, b.m), b.vec,
                                          (half, cols))
                 for part in (slice(0, rows), slice(rows, None)))


def ksplit_pipeline(tx: launch.Kernel, a, b, out, delay_us: float):
    """The shipped pipeline with chunk 0 split along K (module docstring)."""
    a_op, depth, chunks, plans, firsts = chunk_plans(tx, a, b)
    top, bottom = halves(b)
    adder = launch.Kernel(tx.config, render_text(tx.config, ACCUMULATE.read_text()))
    rows0, half = chunks[0], depth // 2
    plan_top = tx._cached_plan(top, a_op, rows0, depth)
    plan_bottom = adder._cached_plan(bottom, a_op, rows0, depth)
    copy_stream, main_streams = streams_before_29(a_op.device)
    n_cols = b.shape[1]

    def call(i: int) -> None:
        caller, spaces = start_call(plans, depth, (copy_stream, *main_streams))
        main0 = main_streams[0]
        space_top = spaces[0].data.ptr
        space_bottom = space_top + 4 * half * plan_top.copy_a.ld
        plan_top.launch_copy_a(a_op.ptr, space_top, main0.ptr)
        copy_stream.wait_event(launch._record(main0))
        plan_top.launch(space_top, out.data.ptr, main0.ptr)
        launch._wait_kernel()((1,), (1,), (np.uint64(delay_us * 1e3),), stream=copy_stream)
        plan_bottom.launch_copy_a(a_op.ptr + 4 * half, space_bottom, copy_stream.ptr)
        main0.wait_event(launch._record(copy_stream))
        done: list = []
        queue_main(plan_bottom, space_bottom, out.data.ptr, main0, done)
        for j in range(1, len(chunks)):
            plan, space, main = plans[chunks[j]], spaces[j % 2], main_streams[j % 2]
            queue_copy(j, plan, a_op.ptr + 4 * firsts[j] * depth, space.data.ptr, copy_stream,
                       main, done)
            queue_main(plan, space.data.ptr, out.data.ptr + 4 * firsts[j] * n_cols, main, done)
        end_call(caller, done)
    call.weights = (top, bottom)  # their device layouts, which the plans point at, stay
    return call


def one(pattern: Pattern, size: int, args: argparse.Namespace) -> list[str]:
    a, b, out, ref, _, tx, fns = row_major_core(pattern, size)
    for delay in args.delays:
        fns[f"tx, chunk 0 in two halves of K, copy 0b {delay:g} us later"] = ksplit_pipeline(
            tx, a, b, out, delay)
    return checked_ratios(fns, out, ref, str(pattern), args.rounds)


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--delays", default=[2.0, 0.0], type=float_list)
    pipeline_tool(__doc__, "Chunk 0 split along K", one, options)


if __name__ == "__main__":
    main()
