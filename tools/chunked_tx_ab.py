"""Would row-major A cost less run in M chunks? A prototype made of shipped parts.

A `tx` kernel copies row-major A K-major (one pass through DRAM: read A, write the copy)
and runs the K-major kernel on the copy. At 4096 x 4096 that copy is 44-46 us, 11 % of the
4:32 kernel (results/core_h100). Called on M chunks of A instead, each call's copy is small
enough to stay in L2 for the main kernel that reads it right after (the workspace comes
back from CuPy's pool), so the copy's DRAM write and the main kernel's DRAM read of it may
mostly vanish; the price is a launch pair a chunk and a smaller grid.

Times, in turns in one process, each checked against float64 first:
  km       the K-major kernel on A already K-major (the bound),
  tx       the row-major kernel on all of A (shipped: pipelined where
           nmgen.copy_plan says so),
  tx one copy  the same with Kernel.pipeline_copy off: one copy of A, one main kernel,
  tx plan P  the shipped pipeline over the chunks of plan P (--shipped-plans).
  tx/C     the same kernel called on chunks of C rows of A and C rows of the output.
  txp/C    pipelined chunks: the chunk copies on a stream of their own (high priority,
           so that a copy's blocks take the SMs the main kernel's tail frees), the main
           kernels on two streams taking turns, each waiting only for its chunk's copy;
           a copy waits for the main kernel two chunks back (two K-major workspaces), so
           at most two chunks' copies are live in L2. Kernel boundaries overlap: the
           next chunk's blocks fill the last one's tail.
  copy/C, main/C  the two halves of txp/C on their own, one stream (where time goes).
Plans may be uneven (--chunks 256+1280+1280+1280: a small first chunk, whose copy nothing
hides); --spaces 3 lets the copies run a chunk further ahead; --caps 112 runs the main
kernels with their registers capped, so that a copy block fits on an SM beside two main
blocks (127 registers leave no room) and the copies need not wait for a main block to end.

    python tools/chunked_tx_ab.py --pattern 4:32,8:32 --shape 4096,4096,4096 \
        --chunks 512,1024,2048 --out results/chunked_tx_h100.md
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.codegen import COPY_A_THREADS, KernelSource  # noqa: E402
from nmgen.config import ALayout  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import measure  # noqa: E402
from nmgen.gpu.bench import dense_float64, random_weight  # noqa: E402
from nmgen.gpu.launch import Kernel, _cupy, _launch, device_info  # noqa: E402
from nmgen.gpu.timing import time_in_turns  # noqa: E402
from nmgen.space import Problem, core_config  # noqa: E402

RTOL = 1e-5


def capped(kernel: Kernel, registers: int) -> Kernel:
    """``kernel``'s configuration with its registers capped (``__maxnreg__``) instead of
    its launch bounds: room on each SM for a copy block beside two main blocks."""
    source = kernel.source
    code, count = re.subn(r"__launch_bounds__\(THREADS, \d+\)", f"__maxnreg__({registers})",
                          source.code)
    if count != 1:
        raise RuntimeError(f"{kernel.name}: no launch bounds to replace")
    return Kernel(kernel.config, KernelSource(source.config, code))


def with_chunks(tx: Kernel, a, b, out, plan: list[int]):
    """The shipped pipeline (Kernel._run_pipelined) over the chunks of ``plan`` instead of
    copy_chunks': the call sets them on the launch plan it is about to use."""
    from nmgen.gpu.launch import operand

    launch_plan = tx._cached_plan(b, operand(a, "a"), a.shape[0], a.shape[1])
    shipped = launch_plan.chunks  # the plan is shared with the "tx" version: put it back

    def call(i: int) -> None:
        launch_plan.chunks = plan
        try:
            tx(a, b, out=out)
        finally:
            launch_plan.chunks = shipped
    return call


def variants(pattern: Pattern, a, b, out, plans: list[list[int]], caps: list[int],
             spaces: list[int], shipped_plans: list[list[int]]) -> dict:
    """name -> call(i) of every version timed; all write ``out``."""
    cp = _cupy()
    arch = device_info().arch
    km = Kernel(core_config(Problem(pattern.n, pattern.m, 32, ALayout.K_MAJOR, arch)))
    tx = Kernel(core_config(Problem(pattern.n, pattern.m, 32, ALayout.ROW_MAJOR, arch)))
    a_km = cp.ascontiguousarray(a.T).T  # the same values, K-major
    rows = a.shape[0]

    def chunked(size: int):
        def call(i: int) -> None:
            for r0 in range(0, rows, size):
                tx(a[r0:r0 + size], b, out=out[r0:r0 + size])
        return call

    single = Kernel(tx.config)
    single.pipeline_copy = False  # one copy of all of A, then one main kernel
    fns = {f"km {km.name}": lambda i: km(a_km, b, out=out),
           f"tx {tx.name}": lambda i: tx(a, b, out=out),
           "tx one copy": lambda i: single(a, b, out=out)}
    for plan in shipped_plans:
        fns[f"tx plan {plan_label(plan)}"] = with_chunks(tx, a, b, out, plan)
    for cap in caps:
        main = capped(km, cap) if cap else km
        if cap:
            fns[f"km cap {cap}"] = lambda i, main=main: main(a_km, b, out=out)
        for plan in plans:
            if len(set(plan)) == 1:
                fns[f"tx/{plan[0]}"] = chunked(plan[0])
            for count in spaces:
                fns.update(pipelined(tx, main, a, b, out, plan, count, cap))
    return fns


def plan_label(plan: list[int]) -> str:
    return str(plan[0]) if len(set(plan)) == 1 else "+".join(map(str, plan))


def pipelined(tx: Kernel, km: Kernel, a, b, out, plan: list[int], count: int,
              cap: int) -> dict:
    """txp over the chunks of ``plan`` with ``count`` workspaces, and its halves (see the
    module's docstring; a copy stream of the same priority as the main streams timed the
    same, results/chunked_tx_h100/pipelined.md)."""
    cp = _cupy()
    depth = a.shape[1]
    copies = {size: tx._plan(b, a.device.id, size, depth, True).copy_a for size in set(plan)}
    spaces = [cp.empty(depth * max(c.ld for c in copies.values()), cp.float32)
              for _ in range(count)]
    starts = [sum(plan[:j]) for j in range(len(plan))]

    def space(j: int):  # chunk j's K-major workspace, K x ld
        ld = copies[plan[j]].ld
        return spaces[j % count][:depth * ld].reshape(depth, ld)

    def copy(j: int, stream) -> None:
        job = copies[plan[j]]
        job.args[0].value = a[starts[j]:].data.ptr
        job.args[1].value = space(j).data.ptr
        _launch(job.function, job.grid, COPY_A_THREADS, 0, job.params, stream.ptr)

    def main(j: int, stream) -> None:
        r0, size = starts[j], plan[j]
        km(space(j)[:, :size].T, b, out=out[r0:r0 + size], stream=stream)

    def halves(step):
        return lambda i: [step(j, cp.cuda.get_current_stream()) for j in range(len(plan))]

    least, greatest = priorities()
    tag = plan_label(plan) + (f" cap {cap}" if cap else "") + (f" s{count}" if count != 2 else "")
    copy_stream = cp.cuda.Stream(non_blocking=True, priority=greatest)
    main_streams = [cp.cuda.Stream(non_blocking=True, priority=least) for _ in range(2)]
    fns = {f"txp/{tag}": overlapped(copy_stream, main_streams, len(plan), count, copy, main)}
    if count == 2:
        fns.update({f"copy/{tag}": halves(copy), f"main/{tag}": halves(main)})
    return fns


def priorities() -> tuple[int, int]:
    """(least, greatest) stream priority; the driver clamps values outside its range."""
    runtime = _cupy().cuda.runtime
    if hasattr(runtime, "deviceGetStreamPriorityRange"):
        return runtime.deviceGetStreamPriorityRange()
    return 0, -5


def overlapped(copy_stream, main_streams, chunks: int, count: int, copy, main):
    """A call that runs chunk j's copy on ``copy_stream`` and its main kernel on
    ``main_streams[j % 2]`` after it; copy j waits for main j - count (its workspace)."""
    cp = _cupy()

    def call(i: int) -> None:
        caller = cp.cuda.get_current_stream()
        begin = caller.record()
        for s in (copy_stream, *main_streams):
            s.wait_event(begin)
        done = []
        for j in range(chunks):
            if j >= count:
                copy_stream.wait_event(done[j - count])  # its workspace is free again
            copy(j, copy_stream)
            copied = copy_stream.record()
            stream = main_streams[j % 2]
            stream.wait_event(copied)
            main(j, stream)
            done.append(stream.record())
        for event in done[-2:]:
            caller.wait_event(event)
    return call


def one(pattern: Pattern, shape: tuple[int, int, int], args: argparse.Namespace,
        lines: list[str]) -> None:
    cp = _cupy()
    rows, cols, depth = shape
    a = cp.random.standard_normal((rows, depth), dtype=cp.float32)
    b = random_weight(pattern.n, pattern.m, 32, depth, cols)
    out = cp.full((rows, cols), cp.nan, cp.float32)
    ref = a.astype(cp.float64) @ dense_float64(b)
    fns = variants(pattern, a, b, out, parse_plans(args.chunks, rows), args.caps, args.spaces,
                   parse_plans(args.shipped_plans, rows))
    for name, fn in fns.items():
        if name.startswith(("copy/", "main/")):  # halves: timing only
            continue
        err = measure.poisoned_error(lambda fn=fn: fn(0), out, ref)
        if not err < RTOL:
            raise RuntimeError(f"{name} is wrong on {rows}x{cols}x{depth}: {err:.3g}")
    del ref
    times = time_in_turns(fns, rounds=args.rounds, repeat=10)
    bound = next(t for name, t in times.items() if name.startswith("km "))
    for name, t in times.items():
        lines.append(f"| {pattern.n}:{pattern.m} | {rows}x{cols}x{depth} | {name} | "
                     f"{t:.4f} | {t / bound:.3f} |")
        print(lines[-1], flush=True)


def parse_plans(text: str, rows: int) -> list[list[int]]:
    """The --chunks plans for ``rows`` rows; a plan must cover them exactly."""
    plans = []
    for item in filter(None, text.split(",")):
        plan = [int(x) for x in item.split("+")]
        if len(plan) == 1 and plan[0] < rows and rows % plan[0] == 0:
            plan = plan * (rows // plan[0])
        if sum(plan) == rows and len(plan) > 1:
            plans.append(plan)
    return plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="4:32,8:32")
    parser.add_argument("--shape", action="append",
                        type=lambda s: tuple(int(x) for x in s.split(",")),
                        help="M,N,K (repeat the option for more)")
    parser.add_argument("--chunks", default="512,1024,2048",
                        help="chunk plans: C (all chunks C rows) or C1+C2+... (rows in order)")
    parser.add_argument("--shipped-plans", default="",
                        help="chunk plans (as --chunks) for the shipped pipeline: 'tx plan P'")
    parser.add_argument("--caps", default=[0], type=lambda s: [int(x) for x in s.split(",")],
                        help="main kernels' register caps to try (0: the shipped kernel)")
    parser.add_argument("--spaces", default=[2], type=lambda s: [int(x) for x in s.split(",")],
                        help="K-major workspaces the chunk copies take in turns")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [f"# Row-major A in M chunks ({device_info().name})", "",
             "| pattern | M x N x K | version | ms | over km |", "| --- | --- | --- | --- | --- |"]
    for shape in args.shape or [(4096, 4096, 4096)]:
        for text in args.pattern.split(","):
            one(Pattern.parse(text), shape, args, lines)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
