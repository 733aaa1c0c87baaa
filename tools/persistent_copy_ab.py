"""Copies 1.. of a pipelined row-major launch in a few persistent blocks (the register
transpose of the shipped copy kernel in a grid-stride loop), against the shipped pipeline.

tools/block_timeline.py shows (H100, 4096^3, 4:32) that the shipped copies, 1024 short
blocks a chunk, take block slots wherever a main block ends, so that a third of the main
blocks share their SM with copy blocks at some time and take 93-101 us instead of 80-82.
G persistent blocks stay on the SMs where they start (those with one main block), so
that the copy meets few main blocks. Timed in turns in one process after a float64 check:

  km          the K-major kernel on K-major A (the bound),
  tx          the shipped pipeline,
  tx G=g      copies 1.. in g persistent blocks of 256 threads, the rest as shipped.

    python tools/persistent_copy_ab.py --pattern 4:32,8:32 --blocks 8,16,32,64 --rounds 9
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _ab import checked_ratios, int_list, pipeline_tool, row_major_core  # noqa: E402
from copy_footprint_ab import Chunk, queue_first_copy, variant_call  # noqa: E402

from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402

THREADS = 256
SOURCE = r"""
// Row-major A (M x K, lda) into K-major AT (K x ld), 64x64 tiles in a grid-stride loop:
// a thread moves a 4x4 block of each tile through registers (four 16-byte reads along K,
// four 16-byte writes along M), and reads its block of the next tile before it writes the
// current one. Needs lda % 4 == 0, a 16-byte aligned A and K % 64 == 0 (the tool's 4096^3).
extern "C" __global__ void __launch_bounds__(256)
transpose_persistent(const float* __restrict__ A, float* __restrict__ AT, int M, int K,
                     long long lda, long long ld) {
    constexpr int T = 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kc = 4 * (warp % 4) + lane % 4, mg = 8 * (warp / 4) + lane / 4;
    const int tiles_k = K / T, tiles = tiles_k * ((M + T - 1) / T);
    float4 v[4];
    auto load = [&](int t) {
        const int k = (t % tiles_k) * T + 4 * kc, m = (t / tiles_k) * T + 4 * mg;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const float* src = A + (long long)(m + r) * lda + k;
            v[r] = m + r < M ? __ldg(reinterpret_cast<const float4*>(src))
                             : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    };
    int t = blockIdx.x;
    if (t < tiles) load(t);
    for (; t < tiles; t += gridDim.x) {
        const float4 x0 = v[0], x1 = v[1], x2 = v[2], x3 = v[3];
        if (t + gridDim.x < tiles) load(t + gridDim.x);
        const int k = (t % tiles_k) * T + 4 * kc, m = (t / tiles_k) * T + 4 * mg;
        if (m < ld) {
            float* dst = AT + (long long)k * ld + m;
            *reinterpret_cast<float4*>(dst) = make_float4(x0.x, x1.x, x2.x, x3.x);
            *reinterpret_cast<float4*>(dst + ld) = make_float4(x0.y, x1.y, x2.y, x3.y);
            *reinterpret_cast<float4*>(dst + 2 * ld) = make_float4(x0.z, x1.z, x2.z, x3.z);
            *reinterpret_cast<float4*>(dst + 3 * ld) = make_float4(x0.w, x1.w, x2.w, x3.w);
        }
    }
}
"""


@functools.cache
def persistent_kernel():
    return launch._cupy().RawKernel(SOURCE, "transpose_persistent", options=("-std=c++17",))


def pipelined(tx: launch.Kernel, a, b, out, blocks: int):
    """Kernel._run_pipelined with copies 1.. in ``blocks`` persistent blocks."""
    cp = launch._cupy()

    def queue(chunk: Chunk, copy_stream, done: list) -> None:
        if chunk.j == 0:  # as shipped
            queue_first_copy(chunk.plan, chunk.source, chunk.space.data.ptr, chunk.main,
                             copy_stream)
            return
        if chunk.j >= 2:
            copy_stream.wait_event(done[chunk.j - 2])  # its workspace is free
        depth = a.shape[1]
        with copy_stream:
            persistent_kernel()((blocks,), (THREADS,), (
                cp.uint64(chunk.source), chunk.space, np.int32(chunk.rows), np.int32(depth),
                np.int64(depth), np.int64(chunk.plan.copy_a.ld)))
        chunk.main.wait_event(launch._record(copy_stream))
    return variant_call(tx, a, b, out, queue)


def one(pattern: Pattern, size: int, args: argparse.Namespace) -> list[str]:
    if size % 64:
        raise SystemExit("the persistent copy needs K % 64 == 0")
    a, b, out, ref, _, tx, fns = row_major_core(pattern, size)
    for blocks in args.blocks:
        fns[f"tx G={blocks}"] = pipelined(tx, a, b, out, blocks)
    return checked_ratios(fns, out, ref, f"{pattern.n}:{pattern.m}", args.rounds, 300)


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--blocks", default=[8, 16, 32, 64], type=int_list)
    pipeline_tool(__doc__, "Copies 1.. in persistent blocks", one, options)


if __name__ == "__main__":
    main()
