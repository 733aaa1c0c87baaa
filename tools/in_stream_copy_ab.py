"""Each chunk's copy on its main kernel's stream, against the pipeline of before.

tools/block_timeline.py shows (H100, 4096^3, 4:32) main kernel j (j >= 1) starting 4-5 us
after copy j's last block ends, in the pipeline shipped until the twenty-ninth session:
copy j ran on a copy stream of the greatest priority, and main kernel j, on one of two
main streams of the least, waited for it through an event. Replayed from a CUDA graph,
where such waits are graph edges, that pipeline reads 1.052 instead of 1.063-1.065
(tools/graph_core_ab.py). Here stream j % 2 runs copy j then main kernel j, so that the
only wait between streams is copy 1's (after copy 0, plus COPY_1_DELAY_NS on the GPU):
main kernel j follows its copy in stream order, and copy j (j >= 2) follows main kernel
j-2, which read the same workspace, in stream order too. Copy j still overlaps main
kernel j-1, on the other stream. Timed in turns in one process after a float64 check
(NaN-poisoned output) of each:

  km                        the K-major kernel on K-major A (the bound),
  tx                        the launcher (from the twenty-ninth session to the
                            thirty-second "in stream, greatest", since then chunks
                            0, 2, ... on the caller's stream: caller_stream_ab.py),
  tx before                 the pipeline shipped until then,
  tx in stream, least       copies and main kernels on two streams of the least priority,
  tx in stream, no delay    "in stream, greatest" without the GPU wait before
                            copy 1,
  tx, copy 1 D us after the start  (--start-delays D,...) copy 1 waits D us from the
                            call's start instead of copy 0's end: no event recorded
                            between copy 0 and main kernel 0, which may keep main kernel
                            0's programmatic launch (sm_90, KernelConfig.waits_for_copy),
  ..., graph                "tx" and "tx before" replayed from CUDA graphs.

    python tools/in_stream_copy_ab.py --pattern 4:32,8:32 --rounds 9

The first runs, in the twenty-ninth session, timed the launcher of before as "tx" and
this order as "tx in stream, greatest" (results/row_major_launch_h100/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _ab import (  # noqa: E402
    checked_ratios,
    greatest_streams,
    int_list,
    pipeline_tool,
    row_major_core,
)
from copy_footprint_ab import (  # noqa: E402
    chunk_plans,
    end_call,
    start_call,
    variant_call,
    variant_streams,
)
from graph_core_ab import replayed  # noqa: E402
from pdl_ab import queue_shipped_copy  # noqa: E402

from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402
from nmgen.gpu.launch import _wait_kernel  # noqa: E402


def in_stream(tx: launch.Kernel, a, b, out, streams, delay_ns: int,
              after_copy_0: bool = True, first_plan=None):
    """A pipelined call with copy j and main kernel j on ``streams[j % 2]``; copy 1 waits
    ``delay_ns`` on the GPU after copy 0's end, or (not ``after_copy_0``) after the
    call's start. ``streams[0]`` None: the caller's own stream, as the launcher's since
    the thirty-second session (no wait before copy 0; at the end the caller waits for
    stream 1 alone); else both streams wait for the caller's work first, and it for both
    at the end. ``first_plan``: chunk 0's launch plan, where not ``tx``'s."""
    own = streams[0] is None
    if own and not after_copy_0:
        raise ValueError("stream 1 must follow copy 0 where stream 0 is the caller's")
    a_op, depth, chunks, plans, starts = chunk_plans(tx, a, b)
    n_cols = b.shape[1]

    def call(i: int) -> None:
        caller, spaces = start_call(plans, depth, () if own else streams)
        ordered = (caller, streams[1]) if own else streams
        ends = []  # the last main kernel's end on each stream the caller waits for
        first_copy = None  # copy 0's end event
        for j, rows in enumerate(chunks):
            plan, space, stream = plans[rows], spaces[j % 2], ordered[j % 2]
            if j == 0 and first_plan is not None:
                plan = first_plan
            if j == 1:  # copy 1 after copy 0, so that main kernel 0 takes the SMs first
                if after_copy_0:
                    stream.wait_event(first_copy)
                if delay_ns:
                    _wait_kernel()((1,), (1,), (np.uint64(delay_ns),), stream=stream)
            plan.launch_copy_a(a_op.ptr + 4 * starts[j] * depth, space.data.ptr, stream.ptr)
            if j == 0 and after_copy_0:
                first_copy = launch._record(stream)
            plan.launch(space.data.ptr, out.data.ptr + 4 * starts[j] * n_cols, stream.ptr)
            if j >= len(chunks) - 2 and stream is not caller:
                ends.append(launch._record(stream))
        end_call(caller, ends)
    return call


def one(pattern: Pattern, size: int, args) -> list[str]:
    a, b, out, ref, km, tx, fns = row_major_core(pattern, size)
    tx_name = list(fns)[1]
    least = variant_streams(False)[1]
    fns["tx before"] = variant_call(tx, a, b, out, queue_shipped_copy)
    fns["tx in stream, least"] = in_stream(tx, a, b, out, least, launch.COPY_1_DELAY_NS)
    fns["tx in stream, no delay"] = in_stream(tx, a, b, out,
                                              greatest_streams(a.device.id), 0)
    for delay in int_list(args.start_delays) if args.start_delays else []:
        fns[f"tx, copy 1 {delay} us after the start"] = in_stream(
            tx, a, b, out, greatest_streams(a.device.id), 1000 * delay, False)
    fns["tx graph"] = replayed(fns[tx_name])
    fns["tx before graph"] = replayed(fns["tx before"])
    return checked_ratios(fns, out, ref, f"{pattern.n}:{pattern.m}", args.rounds, 300)


def main() -> None:
    def options(parser) -> None:
        parser.add_argument("--start-delays", default="", metavar="US,...",
                            help="also copy 1 these us after the call's start")
    pipeline_tool(__doc__, "Copies on the main kernels' streams", one, options)


if __name__ == "__main__":
    main()
