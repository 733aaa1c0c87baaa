"""Orders and footprints of the pipelined copy of row-major A, against the shipped one.

tools/pipeline_timeline.py shows (H100, 4096^3) that in the shipped pipeline chunk 1's
copy, launched on an idle GPU just before chunk 0's main kernel is ready, takes every SM
(1024 blocks) for ~17 us, so chunk 0's main kernel starts after it; the later copies,
launched while a main kernel holds the SMs, run in the few slots it leaves. Variants,
timed in turns in one process, each checked against float64 first:

  km                      the K-major kernel on K-major A (the bound),
  tx                      the shipped pipeline (Kernel._run_pipelined),
  tx G=g                  (--blocks) copies after the first in g persistent blocks (a
                          grid-stride loop over 64x64 tiles, the next tile's loads in flight
                          while the current one is written), so that the main kernels
                          keep the other SMs,
  tx G=g same             and the first copy on main kernel 0's stream,
  tx same                 the first copy on main kernel 0's stream, copy 1 unordered,
  tx first in stream      the first copy on main kernel 0's stream, copy 1 after it,
  tx first in stream, copy 1 D us later  (--delays) and a D-us GPU wait before copy 1,
                          so that main kernel 0 takes its SMs first,
  tx main first           main streams at the greatest priority, copies at the least,
  tx first in stream, main first  both,
  tx two copies first     copies 0 and 1 on main kernel 0's stream, then main kernel 0,
  tx fresh streams        the order shipped until the twenty-seventh session (copy 0 on
                          the copy stream, copy 1 right after it) on new streams of the
                          shipped priorities,
  tx old order, through the tool  that order on the launcher's streams,
  tx same event, copy|main first  main kernel 0 and copy 1 waiting for one event, the
                          stream priorities deciding.

From the twenty-seventh session the launcher ("tx") ran "tx first in stream, copy 1 2 us
later": with the transpose through registers, copies in the slots a main kernel leaves
keep pace at 4:32 too. Since the twenty-ninth it runs each chunk's copy and main kernel on
one of two streams of the greatest priority (tools/in_stream_copy_ab.py); the variants
here queue theirs on the streams of before (``streams_before_29``).

    python tools/copy_footprint_ab.py --pattern 16:32,12:32,8:32,4:32 --delays 2 --rounds 9

Results: results/copy_order_h100/README.md.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from _ab import checked_ratios, pattern_tables, row_major_core  # noqa: E402

from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402
from nmgen.gpu.launch import _wait_kernel  # noqa: E402

TILE, THREADS = 64, 256

PERSISTENT_SOURCE = r"""
// Row-major A (M x K, lda) into K-major AT (K x ld): a grid-stride loop over 64x64 tiles.
// A thread keeps 4 16-byte loads in flight, and loads the next tile's while it writes
// the current one out.
extern "C" __global__ void __launch_bounds__(256)
transpose_persistent(const float* __restrict__ A, float* __restrict__ AT, int M, int K,
                     long long lda, long long ld) {
    constexpr int T = 64, CHUNKS = T / 4, ROW_STEP = 256 / CHUNKS, PER = T / ROW_STEP;
    __shared__ float tile[T][T + 1];
    const int tiles_k = (K + T - 1) / T, tiles = tiles_k * (int)((ld + T - 1) / T);
    const int c = threadIdx.x % CHUNKS, r0 = threadIdx.x / CHUNKS;
    const bool aligned = lda % 4 == 0 && reinterpret_cast<unsigned long long>(A) % 16 == 0;
    float4 v[PER];
    auto load = [&](int t) {
        const int k0 = (t % tiles_k) * T, m0 = (t / tiles_k) * T;
        const bool whole = aligned && k0 + T <= K;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int m = m0 + r0 + i * ROW_STEP, k = k0 + 4 * c;
            v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (m < M) {
                const float* src = A + m * lda + k;
                if (whole) {
                    v[i] = __ldg(reinterpret_cast<const float4*>(src));
                } else {
                    v[i].x = k < K ? __ldg(src) : 0.f;
                    v[i].y = k + 1 < K ? __ldg(src + 1) : 0.f;
                    v[i].z = k + 2 < K ? __ldg(src + 2) : 0.f;
                    v[i].w = k + 3 < K ? __ldg(src + 3) : 0.f;
                }
            }
        }
    };
    int t = blockIdx.x;
    if (t < tiles) load(t);
    for (; t < tiles; t += gridDim.x) {
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int r = r0 + i * ROW_STEP;
            tile[r][4 * c] = v[i].x, tile[r][4 * c + 1] = v[i].y;
            tile[r][4 * c + 2] = v[i].z, tile[r][4 * c + 3] = v[i].w;
        }
        __syncthreads();
        if (t + gridDim.x < tiles) load(t + gridDim.x);
        const int k0 = (t % tiles_k) * T, m0 = (t / tiles_k) * T;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int r = r0 + i * ROW_STEP, k = k0 + r, m = m0 + 4 * c;
            if (k < K && m < ld)
                *reinterpret_cast<float4*>(AT + k * ld + m) = make_float4(
                    tile[4 * c][r], tile[4 * c + 1][r], tile[4 * c + 2][r], tile[4 * c + 3][r]);
        }
        __syncthreads();
    }
}
"""


def persistent_kernel():
    return launch._cupy().RawKernel(PERSISTENT_SOURCE, "transpose_persistent",
                             options=("-std=c++17",))


def chunk_plans(tx: launch.Kernel, a, b):
    """(A's operand, K, the launcher's chunks of M, their launch plans by rows, each
    chunk's first row) of a pipelined ``tx`` call."""
    a_op = launch.operand(a, "a")
    rows_all, depth = a.shape
    chunks = tx._cached_plan(b, a_op, rows_all, depth).chunks
    plans = {rows: tx._cached_plan(b, a_op, rows, depth) for rows in set(chunks)}
    return a_op, depth, chunks, plans, [sum(chunks[:j]) for j in range(len(chunks))]


def start_call(plans: dict, depth: int, streams: tuple):
    """(caller's stream, two K-major workspaces) of a pipelined call, ``streams`` made to
    wait for the caller's work so far (as Kernel._run_pipelined does)."""
    cp = launch._cupy()
    caller = cp.cuda.get_current_stream()
    words = depth * max(p.copy_a.ld for p in plans.values())
    spaces = [cp.empty(words, np.float32) for _ in range(2)]
    begin = launch._record(caller)
    for stream in streams:
        stream.wait_event(begin)
    return caller, spaces


def variant_streams(main_first: bool):
    """(copy stream, two main streams), new, with the launcher's priorities, or swapped
    (``main_first``: the main streams at the greatest priority)."""
    cp = launch._cupy()
    least, greatest = launch._priority_range()
    if main_first:
        least, greatest = greatest, least
    return (cp.cuda.Stream(non_blocking=True, priority=greatest),
            tuple(cp.cuda.Stream(non_blocking=True, priority=least) for _ in range(2)))


_STREAMS_BEFORE_29: dict[int, tuple] = {}


def streams_before_29(device: int):
    """(copy stream, two main streams) of ``device`` as the launcher made them until the
    twenty-ninth session (copies at the greatest priority, main kernels at the least),
    made once; the variants of these tools queue their copies on them. Since then the
    launcher runs each chunk's copy and main kernel on one of two streams of the greatest
    priority (``launch._pipeline_streams``)."""
    if device not in _STREAMS_BEFORE_29:
        with launch._cupy().cuda.Device(device):
            _STREAMS_BEFORE_29[device] = variant_streams(False)
    return _STREAMS_BEFORE_29[device]


def queue_first_copy(plan, source: int, space_ptr: int, main, copy_stream) -> None:
    """Copy 0 as the launcher queues it: on main kernel 0's stream, and the copy stream
    held COPY_1_DELAY_NS behind it on the GPU, so that main kernel 0 takes the SMs first."""
    plan.launch_copy_a(source, space_ptr, main.ptr)
    copy_stream.wait_event(launch._record(main))
    with copy_stream:
        _wait_kernel()((1,), (1,), (np.uint64(launch.COPY_1_DELAY_NS),))


def queue_copy(j: int, plan, source: int, space_ptr: int, copy_stream, main, done: list):
    """Chunk j's copy as the launcher queues copies 1..: on the copy stream, after main
    kernel j-2 has freed its workspace; ``main`` waits for it."""
    if j >= 2:
        copy_stream.wait_event(done[j - 2])
    plan.launch_copy_a(source, space_ptr, copy_stream.ptr)
    main.wait_event(launch._record(copy_stream))


def queue_main(plan, space_ptr: int, out_ptr: int, main, done: list) -> None:
    """A chunk's main kernel on ``main``; its end event goes on ``done``."""
    plan.launch(space_ptr, out_ptr, main.ptr)
    done.append(launch._record(main))


def end_call(caller, done: list) -> None:
    """The caller's stream waits for the last two main kernels (one on each main stream;
    ``done`` may hold only the ones it must wait for)."""
    for event in done[-2:]:
        caller.wait_event(event)


@dataclass
class Chunk:
    """Chunk j of a pipelined call, for the variants' hooks (``variant_call``)."""

    j: int
    rows: int
    plan: Any  # its launch plan
    source: int  # its first row of row-major A
    space: Any  # its K-major workspace (a CuPy array)
    out_ptr: int  # its first row of C
    main: Any  # its main stream


def variant_call(tx: launch.Kernel, a, b, out, queue_chunk_copy, launch_main=None):
    """A pipelined call on the launcher's chunks, streams and workspaces, with the copies
    queued by ``queue_chunk_copy(chunk, copy_stream, done)`` (which makes ``chunk.main``
    wait for the copy; ``done``: the end events of the main kernels so far) and each main
    kernel launched as shipped, or by ``launch_main(chunk)``."""
    a_op, depth, chunks, plans, starts = chunk_plans(tx, a, b)
    copy_stream, main_streams = streams_before_29(a_op.device)
    n_cols = b.shape[1]

    def call(i: int) -> None:
        caller, spaces = start_call(plans, depth, (copy_stream, *main_streams))
        done: list = []
        for j, rows in enumerate(chunks):
            chunk = Chunk(j, rows, plans[rows], a_op.ptr + 4 * starts[j] * depth,
                          spaces[j % 2], out.data.ptr + 4 * starts[j] * n_cols,
                          main_streams[j % 2])
            queue_chunk_copy(chunk, copy_stream, done)
            if launch_main is not None:
                launch_main(chunk)
            else:
                chunk.plan.launch(chunk.space.data.ptr, chunk.out_ptr, chunk.main.ptr)
            done.append(launch._record(chunk.main))
        end_call(caller, done)
    return call


def pipelined(tx: launch.Kernel, a, b, out, blocks: int, same_stream: bool,
              ordered: bool = False, delay_us: float = 0.0, main_first: bool = False,
              fresh: bool = False):
    """Kernel._run_pipelined with the copies after the first in ``blocks`` persistent
    blocks (0: as shipped) and, with ``same_stream``, the first copy on main stream 0
    (``ordered``: the copy stream waits for it, so copy 1 still follows copy 0; and
    ``delay_us`` more on the GPU, so that main kernel 0 takes its SMs first).
    ``main_first``: the main kernels' streams at the greatest priority and the copies'
    at the least (shipped: the other way round), so that a main kernel ready at the same
    time as a copy takes the SMs first. ``fresh``: new streams of the shipped priorities
    instead of the launcher's (made at the first pipelined call of the process)."""
    cp = launch._cupy()
    a_op, depth, chunks, plans, _ = chunk_plans(tx, a, b)
    copy_stream, main_streams = (variant_streams(main_first) if main_first or fresh
                                 else streams_before_29(a_op.device))
    persistent = persistent_kernel()
    n_cols = b.shape[1]

    def call(i: int) -> None:
        caller, spaces = start_call(plans, depth, (copy_stream, *main_streams))
        done, first = [], 0
        for j, rows in enumerate(chunks):
            plan, space, main = plans[rows], spaces[j % 2], main_streams[j % 2]
            if j >= 2:
                copy_stream.wait_event(done[j - 2])
            a_ptr = a_op.ptr + 4 * first * depth
            if j == 0 and same_stream:
                plan.launch_copy_a(a_ptr, space.data.ptr, main.ptr)
                if ordered:
                    copy_stream.wait_event(launch._record(main))
                    if delay_us > 0:
                        with copy_stream:
                            _wait_kernel()((1,), (1,), (np.uint64(delay_us * 1e3),))
            elif j == 0 or blocks == 0:
                plan.launch_copy_a(a_ptr, space.data.ptr, copy_stream.ptr)
                main.wait_event(launch._record(copy_stream))
            else:
                with copy_stream:
                    persistent((blocks,), (THREADS,), (
                        cp.uint64(a_ptr), space, np.int32(rows), np.int32(depth),
                        np.int64(depth), np.int64(plan.copy_a.ld)))
                main.wait_event(launch._record(copy_stream))
            queue_main(plan, space.data.ptr, out.data.ptr + 4 * first * n_cols, main, done)
            first += rows
        end_call(caller, done)
    return call


def two_copies_first(tx: launch.Kernel, a, b, out):
    """Copies 0 and 1 one after the other on main stream 0, then main kernel 0 there;
    main kernel 1 on main stream 1 after copy 1; the rest as shipped. In the shipped order
    copy 1 takes every SM before main kernel 0 anyway (tools/pipeline_timeline.py); this
    order keeps that and trades two cross-stream waits (~4 us each) for in-stream ones."""
    a_op, depth, chunks, plans, starts = chunk_plans(tx, a, b)
    copy_stream, main_streams = streams_before_29(a_op.device)
    n_cols = b.shape[1]

    def call(i: int) -> None:
        caller, spaces = start_call(plans, depth, (copy_stream, *main_streams))
        first_two = main_streams[0]
        for j in (0, 1):
            plans[chunks[j]].launch_copy_a(a_op.ptr + 4 * starts[j] * depth,
                                           spaces[j].data.ptr, first_two.ptr)
        main_streams[1].wait_event(launch._record(first_two))
        done = []
        for j, rows in enumerate(chunks):
            plan, space, main = plans[rows], spaces[j % 2], main_streams[j % 2]
            if j >= 2:
                queue_copy(j, plan, a_op.ptr + 4 * starts[j] * depth, space.data.ptr,
                           copy_stream, main, done)
            queue_main(plan, space.data.ptr, out.data.ptr + 4 * starts[j] * n_cols, main, done)
        end_call(caller, done)
    return call


def same_event(tx: launch.Kernel, a, b, out, main_first: bool):
    """Copy 0 on main stream 1 (idle until main kernel 1), and main kernel 0 and copy 1
    both waiting for copy 0's event, so that they become ready together and the stream
    priorities alone decide which takes the SMs first: the main streams' with
    ``main_first``, else the copy stream's (as shipped). The rest as shipped."""
    a_op, depth, chunks, plans, starts = chunk_plans(tx, a, b)
    copy_stream, main_streams = variant_streams(main_first)
    n_cols = b.shape[1]

    def call(i: int) -> None:
        caller, spaces = start_call(plans, depth, (copy_stream, *main_streams))
        done = []
        for j, rows in enumerate(chunks):
            plan, space, main = plans[rows], spaces[j % 2], main_streams[j % 2]
            source = a_op.ptr + 4 * starts[j] * depth
            if j == 0:  # on main stream 1, which has nothing to do before main kernel 1
                plan.launch_copy_a(source, space.data.ptr, main_streams[1].ptr)
                first_copy = launch._record(main_streams[1])
                main.wait_event(first_copy)
                copy_stream.wait_event(first_copy)
            else:
                queue_copy(j, plan, source, space.data.ptr, copy_stream, main, done)
            queue_main(plan, space.data.ptr, out.data.ptr + 4 * starts[j] * n_cols, main, done)
        end_call(caller, done)
    return call


def one(pattern: Pattern, size: int, args: argparse.Namespace) -> list[str]:
    a, b, out, ref, _, tx, fns = row_major_core(pattern, size)
    for blocks in args.blocks:
        fns[f"tx G={blocks}"] = pipelined(tx, a, b, out, blocks, False)
        fns[f"tx G={blocks} same"] = pipelined(tx, a, b, out, blocks, True)
    fns["tx same"] = pipelined(tx, a, b, out, 0, True)
    fns["tx first in stream"] = pipelined(tx, a, b, out, 0, True, True)
    fns["tx main first"] = pipelined(tx, a, b, out, 0, False, main_first=True)
    fns["tx two copies first"] = two_copies_first(tx, a, b, out)
    fns["tx same event, copy first"] = same_event(tx, a, b, out, False)
    fns["tx same event, main first"] = same_event(tx, a, b, out, True)
    fns["tx fresh streams"] = pipelined(tx, a, b, out, 0, False, fresh=True)
    fns["tx old order, through the tool"] = pipelined(tx, a, b, out, 0, False)
    fns["tx first in stream, main first"] = pipelined(tx, a, b, out, 0, True, True,
                                                      main_first=True)
    for delay in args.delays:
        fns[f"tx first in stream, copy 1 {delay} us later"] = pipelined(
            tx, a, b, out, 0, True, True, delay)
    return checked_ratios(fns, out, ref, f"{pattern.n}:{pattern.m}", args.rounds, 300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="4:32,8:32")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--blocks", default=[],
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--delays", default=[2.0, 5.0, 10.0],
                        type=lambda s: [float(x) for x in s.split(",")],
                        help="GPU waits (us) between copy 0 and copy 1 on the copy stream")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pattern_tables(args, "Copies on few SMs", one)


if __name__ == "__main__":
    main()
