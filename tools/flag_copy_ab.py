"""Main kernel 0 started while copy 0 runs, row tile by row tile: an experiment.

In the launcher (Kernel._run_pipelined) main kernel 0 starts only when all of copy 0 is
done: at 4:32 and 4096^3 about 11 us in which no main block runs, half of what row-major
A costs over K-major A (results/block_timeline_h100/). Here chunk 0 runs from a version of
the module in which

- the transpose is persistent (``--copy-blocks`` a multiprocessor, all resident at once;
  at 40 registers, three fit beside one 127-register main block of 256 threads),
  lets its dependents launch at its top (``griddepcontrol.launch_dependents``), walks the
  64x64 tiles in row order, and after each tile adds one to its row's counter (threads'
  stores, ``__threadfence``, a barrier, then one thread's atomic add);
- the main kernel, launched as a programmatic dependent launch of the copy, waits at its
  top until the counters of its block's rows have all of K (one thread,
  ``ld.acquire.gpu``), then orders the async proxy (TMA) after them
  (``fence.proxy.async.global``); the last block of a row to pass zeroes its counters for
  the next call.

So main blocks start as soon as their rows are copied, beside the copy's blocks, with no
launch gap. Chunks 1.. are as shipped (copy and main kernel on one stream of two, in
turns). Copy 1 cannot wait for copy 0's end without an event between copy 0 and main
kernel 0, which would end the programmatic launch; it waits for the call's start plus
``--copy1-delays`` us on the GPU instead. Each version is checked against float64
(NaN-poisoned output) ``--checks`` times in a row, then all are timed in turns:

  km              the K-major kernel (the bound),
  tx              the launcher,
  flags P D F     chunk 0 as above, P copy blocks a multiprocessor (0: a block a tile,
                  as shipped), copy 1 D us after the start, the copy's writes fenced
                  by F (``FENCES``),
  ..., no PDL     (--no-pdl) the same with main kernel 0 launched as usual, after all of
                  copy 0: what the persistent copy costs by itself.

    python tools/flag_copy_ab.py --pattern 4:32,8:32 --copy-blocks 1,2,3 --copy1-delays 4,8,12

``--probe CALLS`` also times, on the GPU (%globaltimer), copy 0's span and main kernel
0's first block start and first block past its wait, in each of CALLS calls of each
flags version. Results: results/flag_copy_h100/ (slower than the launcher; not shipped).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _ab import (  # noqa: E402
    checked_ratios,
    compiled_module,
    greatest_streams,
    int_list,
    pipeline_tool,
    row_major_core,
)
from copy_footprint_ab import chunk_plans  # noqa: E402
from in_stream_copy_ab import in_stream  # noqa: E402
from pdl_ab import TRIGGER, with_copy_carveout  # noqa: E402
from pdl_one_copy_ab import with_pdl_main  # noqa: E402

from nmgen.codegen import COPY_A_TILE, KernelSource, render  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch, measure  # noqa: E402
from nmgen.gpu.launch import CopyA, _wait_kernel  # noqa: E402

FLAGS = r"""
// flag_copy_ab: copy tiles done a row of 64x64 tiles, and main blocks past the wait.
__device__ unsigned flag_rows_done[1024];
__device__ unsigned flag_rows_passed[1024];
// --probe: copy's first start, copy's last end, main kernel 0's first block start, its
// first block past the wait (%globaltimer ns)
__device__ unsigned long long flag_times[4];
__device__ __forceinline__ unsigned long long flag_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
"""

# At the main kernel's top: wait for this block's rows, then let the last block of a row
# through reset that row's counters (each copy row lies in one block row: MS % 64 == 0).
WAIT = r"""{
        const int row_first = blockIdx.y * MS / COPY_ROWS;
        const int row_end = min((blockIdx.y * MS + MS - 1) / COPY_ROWS, (M - 1) / COPY_ROWS) + 1;
        const unsigned need = (K + COPY_ROWS - 1) / COPY_ROWS;
        if (threadIdx.x == 0) {
            atomicMin(flag_times + 2, flag_now());
            for (int r = row_first; r < row_end; ++r) {
                unsigned done, spins = 0;
                while (true) {
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                                 : "=r"(done) : "l"(flag_rows_done + r) : "memory");
                    if (done >= need) break;
                    if (++spins == 1u << 24) __trap();  // a second or more: a bug, not a wait
                    __nanosleep(64);
                }
            }
            for (int r = row_first; r < row_end; ++r)
                if (atomicAdd(flag_rows_passed + r, 1u) == gridDim.x * gridDim.z - 1)
                    flag_rows_done[r] = 0, flag_rows_passed[r] = 0;
            atomicMin(flag_times + 3, flag_now());
        }
        __syncthreads();
        asm volatile("fence.proxy.async.global;" ::: "memory");
    }"""

# The transpose's tile loop, made persistent: tile t of row t / tiles_k, column t % tiles_k.
LOOP_HEAD = r"""    const int tiles_k = (K + COPY_TILE - 1) / COPY_TILE;
    const int tiles = tiles_k * (int)((ld + COPY_TILE - 1) / COPY_TILE);
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int tile_k = t % tiles_k, tile_m = t / tiles_k;
"""
LOOP_TAIL = r"""
    FENCE_EACH
    __syncthreads();
    if (threadIdx.x == 0) {
        FENCE_ONE
        atomicAdd(flag_rows_done + tile_m, 1u);
    }
    }
    if (threadIdx.x == 0) atomicMax(flag_times + 1, flag_now());
}
"""


# Where the copy's writes are fenced before a tile is counted: by every thread, or (by
# cumulativity, as cooperative groups' grid sync does) by the counting thread alone after
# the barrier, so that the other warps go on to the next tile.
FENCES = {"each": ("__threadfence();", ""), "one": ("", "__threadfence();")}


def flag_source(source: KernelSource, tag: str, fence: str = "each") -> KernelSource:
    """``source`` with the persistent, counting transpose and the waiting main kernel;
    ``tag``, in a comment, makes it a module (and launch plans) of its own."""
    code, name = source.code, re.escape(source.name)
    assert source.config.ms % COPY_A_TILE == 0, "a copy row must lie in one block row"
    start = re.search(rf"\n{name}_transpose\(", code).end()
    body = code.index(") {\n", start) + len(") {\n")
    loop = code.index("#pragma unroll\n    for (int i = 0; i < CHUNKS * CHUNKS", body)
    end = code.index("\n}\n", loop)
    inner = code[loop:end].replace("blockIdx.x * COPY_TILE", "tile_k * COPY_TILE")
    inner = inner.replace("blockIdx.y * COPY_TILE", "tile_m * COPY_TILE")
    assert "blockIdx" not in inner
    each, one = FENCES[fence]
    tail = LOOP_TAIL.replace("FENCE_EACH", each).replace("FENCE_ONE", one)
    copy = (f"    {TRIGGER}\n    if (threadIdx.x == 0) atomicMin(flag_times, flag_now());\n"
            + code[body:loop] + LOOP_HEAD + inner + tail)
    code = code[:body] + copy + code[end + len("\n}\n"):]
    # the template's own wait (KernelConfig.waits_for_copy) would hold every main block
    # until all of the copy is done: the counters take its place
    code = code.replace("    WAIT_FOR_COPY();\n", "")
    main = re.search(rf"\n{name}\(", code).end()
    main_body = code.index(") {\n", main) + len(") {\n")
    wait = WAIT.replace("MS", str(source.config.ms)).replace("COPY_ROWS", str(COPY_A_TILE))
    code = code[:main_body] + f"    {wait}\n" + code[main_body:]
    first = code.index("namespace {")
    code = code[:first] + FLAGS + code[first:] + f"// flag_copy_ab {tag}\n"
    return KernelSource(source.config, code)


def flagged(tx: launch.Kernel, a, b, out, streams, blocks_per_sm: int, delay_ns: int,
            pdl: bool = True, fence: str = "each"):
    """A pipelined call whose chunk 0 runs from ``flag_source``; without ``pdl`` main
    kernel 0 follows the whole copy in stream order (the counters are full then)."""
    source = flag_source(render(tx.config), f"{blocks_per_sm} {delay_ns} {pdl} {fence}", fence)
    # the copy prefers all shared memory, so that an SM need not be emptied of copy blocks
    # to change its carveout before a main block joins them
    flag = launch.Kernel(tx.config, source)
    times = flag_times(flag)
    flag = with_copy_carveout(flag, 100)
    if pdl:
        flag = with_pdl_main(flag)
    a_op, depth, chunks, _, _ = chunk_plans(tx, a, b)
    first = flag._cached_plan(b, a_op, chunks[0], depth)
    copy = first.copy_a
    sms = launch.device_info().sms
    tiles = copy.grid[0] * copy.grid[1]  # P = 0: a block a tile, as shipped
    blocks = sms * blocks_per_sm if blocks_per_sm else tiles
    first.copy_a = CopyA(copy.function, (blocks, 1, 1), copy.ld, copy.args)
    # copy 1 after the start, not copy 0: no event between copy 0 and main kernel 0
    call = in_stream(tx, a, b, out, streams, delay_ns, after_copy_0=False, first_plan=first)

    def probe() -> list[float]:
        """us from copy 0's first block start to its last block end, to main kernel 0's
        first block start, and to its first block past the wait, in one call."""
        cp = launch._cupy()
        cp.cuda.Device().synchronize()
        times[:] = cp.asarray(np.array([2**64 - 1, 0, 2**64 - 1, 2**64 - 1], np.uint64))
        _wait_kernel()((1,), (1,), (np.uint64(100_000),))  # the host's launches queue first
        call(0)
        cp.cuda.Device().synchronize()
        t = times.get().astype(np.int64)
        return [(t[i] - t[0]) / 1000 for i in (1, 2, 3)]

    call.probe = probe
    return call


def flag_times(kernel: launch.Kernel):
    """``flag_times`` of the module ``kernel`` launches from."""
    cp = launch._cupy()
    return cp.ndarray((4,), cp.uint64, memptr=compiled_module(kernel).get_global("flag_times"))


def repeatedly_right(fns: dict, out, ref, checks: int) -> None:
    """Each version against float64 on a freshly poisoned output, ``checks`` times."""
    for name, fn in fns.items():
        worst = max(measure.poisoned_error(lambda fn=fn: fn(0), out, ref) for _ in range(checks))
        if not worst < 1e-5:
            raise RuntimeError(f"{name} is wrong: relative error {worst:.3g}")
        print(f"{name}: {checks} checks, worst relative error {worst:.2g}", flush=True)


def one(pattern: Pattern, size: int, args: argparse.Namespace) -> list[str]:
    a, b, out, ref, km, tx, fns = row_major_core(pattern, size)
    streams = greatest_streams(a.device.id)
    for blocks in int_list(args.copy_blocks):
        for delay in int_list(args.copy1_delays):
            for fence in args.fences.split(","):
                fns[f"flags {blocks} {delay} {fence}"] = flagged(
                    tx, a, b, out, streams, blocks, 1000 * delay, fence=fence)
            if args.no_pdl:
                fns[f"flags {blocks} {delay}, no PDL"] = flagged(
                    tx, a, b, out, streams, blocks, 1000 * delay, pdl=False)
    repeatedly_right(fns, out, ref, args.checks)
    for name, fn in fns.items():
        if args.probe and hasattr(fn, "probe"):
            runs = np.array([fn.probe() for _ in range(args.probe)])
            copy_end, main_start, main_pass = np.median(runs, axis=0)
            print(f"{name}: copy 0 {copy_end:.1f} us; main kernel 0's first block starts at "
                  f"{main_start:.1f} us, the first past its wait at {main_pass:.1f} us "
                  f"(medians of {args.probe} calls)", flush=True)
    return checked_ratios(fns, out, ref, f"{pattern.n}:{pattern.m}", args.rounds, 300)


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--copy-blocks", default="1,2,3", help="copy blocks an SM")
        parser.add_argument("--copy1-delays", default="4,8,12",
                            help="us from the call's start to copy 1")
        parser.add_argument("--checks", type=int, default=20)
        parser.add_argument("--fences", default="each", help="each,one (FENCES)")
        parser.add_argument("--probe", type=int, default=0, metavar="CALLS",
                            help="time copy 0 and main kernel 0's start on the GPU")
        parser.add_argument("--no-pdl", action="store_true",
                            help="also each version with main kernel 0 after all of copy 0")
    pipeline_tool(__doc__, "Main kernel 0 on copy 0's finished rows", one, options)


if __name__ == "__main__":
    main()
