"""Row-major ("tx") launches whose K-major copy of A is dropped from L2 once the main
kernel has read it (``discard.global.L2``), against the shipped launch.

The copy writes K x M floats that nothing reads after the main kernel, but L2 is a
write-back cache: each dirty line goes to DRAM when it is evicted, in this call or the
next, so a row-major call moves A's bytes through DRAM three times (read, copy written
back, and the main kernel's reads where they miss) where a K-major call moves them once.
``discard.global.L2`` invalidates a 128-byte line without writing it back. Here a kernel
queued after each main kernel discards the workspace it read. Versions, timed in turns in
one process after a float64 check (NaN-poisoned output) of each:

  km                the tuned K-major winner on K-major A (the bound),
  tx                the tuned row-major winner, launched as shipped,
  tx + empty        the same, an empty kernel queued after each main kernel (what the
                    extra launch costs by itself),
  tx + discard      a kernel that discards the workspace queued after each main kernel.

    python tools/discard_ab.py --problems 4:32x1024x2048x5632 --core 4:32,8:32 --rounds 9

``--problems`` takes tuned shapes (their winners from results/tuned_db_show.txt),
``--core`` the core kernels at 4096^3, pipelined as shipped and with one copy.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import checked_ratios, one_copy_twin, problem_inputs, row_major_core  # noqa: E402
from pdl_one_copy_ab import problem, tuned_winners  # noqa: E402

from nmgen.config import ALayout, KernelConfig  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402

LINE = 128  # bytes: discard.global.L2 drops one line
THREADS, BLOCKS = 256, 528

SOURCE = r"""
extern "C" __global__ void discard_l2(char* p, long long lines) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < lines;
         i += (long long)gridDim.x * blockDim.x)
        asm volatile("discard.global.L2 [%0], 128;" :: "l"(p + i * 128) : "memory");
}
extern "C" __global__ void empty_kernel(char* p, long long lines) {}
"""


@functools.cache
def _kernel(name: str):
    import cupy as cp

    return cp.RawModule(code=SOURCE).get_function(name)


def with_after_main(kernel: launch.Kernel, depth: int, what: str) -> launch.Kernel:
    """``kernel`` whose main launches are each followed, on their stream, by ``what``
    ("discard_l2" or "empty_kernel") over the K-major workspace the main kernel read
    (``depth`` rows of the plan's ``ld`` floats, whole lines)."""
    import cupy as cp
    import numpy as np

    plan_of = kernel._cached_plan
    follow = _kernel(what)

    def cached_plan(*args, **kwargs):
        plan = plan_of(*args, **kwargs)
        if not getattr(plan, "followed", False):
            shipped, lines = plan.launch, depth * plan.copy_a.ld * 4 // LINE

            def launch_main(a_ptr, c_ptr, stream_ptr, *rest):
                shipped(a_ptr, c_ptr, stream_ptr, *rest)
                if a_ptr % LINE:
                    raise RuntimeError(f"workspace {a_ptr:#x} not aligned to a line")
                follow((BLOCKS,), (THREADS,), (np.uint64(a_ptr), np.int64(lines)),
                       stream=cp.cuda.ExternalStream(stream_ptr))

            plan.launch, plan.followed = launch_main, True
        return plan

    kernel._cached_plan = cached_plan
    return kernel


def variants(config: KernelConfig, depth: int, fns: dict, a, b, out, label: str = "",
             pipelined: bool = True) -> None:
    """The empty and discarding versions of ``config``'s launch (with the pipelined copy
    on or off), added to ``fns``."""
    for what, name in (("empty_kernel", "empty"), ("discard_l2", "discard")):
        kernel = with_after_main(launch.Kernel(config), depth, what)
        kernel.pipeline_copy = pipelined
        kernel._source_key = (kernel._source_key, what, pipelined)  # plans of their own
        fns[f"tx{label} + {name}"] = lambda i, k=kernel: k(a, b, out=out)


def tuned(text: str, args: argparse.Namespace) -> list[str]:
    import cupy as cp

    pattern_text, rows, cols, depth = problem(text)
    names = tuned_winners(pattern_text, rows, cols, depth)
    a, b, out, ref = problem_inputs(Pattern.parse(pattern_text), ALayout.ROW_MAJOR, rows,
                                    cols, depth)
    a_km = cp.ascontiguousarray(a.T).T
    km = launch.Kernel(KernelConfig.from_name(names["km"]))
    tx = launch.Kernel(KernelConfig.from_name(names["rm"]))
    if not tx.config.a_copied:
        return []
    fns = {f"km {km.name}": lambda i: km(a_km, b, out=out),
           f"tx {tx.name}": lambda i: tx(a, b, out=out)}
    variants(tx.config, depth, fns, a, b, out)
    return checked_ratios(fns, out, ref, text, args.rounds)


def core(text: str, args: argparse.Namespace) -> list[str]:
    pattern = Pattern.parse(text)
    a, b, out, ref, km, tx, fns = row_major_core(pattern, 4096)
    variants(tx.config, 4096, fns, a, b, out, " pipelined")
    one_copy = one_copy_twin(tx.config)
    fns["tx one copy"] = lambda i: one_copy(a, b, out=out)
    variants(tx.config, 4096, fns, a, b, out, " one copy", pipelined=False)
    return checked_ratios(fns, out, ref, f"{text} 4096^3", args.rounds, 300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", default="", help="PATTERNxMxNxK,... (tuned shapes)")
    parser.add_argument("--core", default="", help="patterns of the 4096^3 core kernels")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from nmgen.gpu.launch import device_info

    lines = [f"# The K-major copy discarded from L2 after the main kernel ({device_info().name})",
             "", "| problem | version | ms | over km |", "| --- | --- | --- | --- |"]
    for text in filter(None, args.problems.split(",")):
        lines += tuned(text, args)
    for text in filter(None, args.core.split(",")):
        lines += core(text, args)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
