"""Main kernel 0 of a pipelined row-major launch as a programmatic dependent launch of
copy 0, against the shipped pipeline.

tools/block_timeline.py shows (H100, 4096^3, 4:32) that main kernel 0's first block starts
about 4 us after copy 0's last block ends, on the same stream. With programmatic dependent
launch (PDL: ``cuLaunchKernelEx`` with programmatic stream serialization), the copy lets
its dependent launch at once (``griddepcontrol.launch_dependents``), main kernel 0's blocks
take the SMs as the copy's blocks leave, and wait at their top (``griddepcontrol.wait``)
until the whole copy is done and its writes are visible. Everything else is the shipped
pipeline. Versions, timed in turns in one process after a float64 check:

  km               the K-major kernel on K-major A (the bound),
  tx               the shipped pipeline,
  tx, PDL source   the source with the two griddepcontrol lines, launched as shipped
                   (both lines are no-ops without PDL),
  tx, PDL          that source, main kernel 0 launched with PDL,
  ..., copy carveout  the same with the copy kernel's preferred shared-memory carveout at
                   its largest (100), the main kernel's: an SM that ran copy blocks then
                   takes main blocks without changing its L1/shared split.

    python tools/pdl_ab.py --pattern 16:32,12:32,8:32,4:32 --rounds 9

Since the thirty-first session the launcher itself launches a ``tx`` main kernel on sm_90
as a programmatic dependent launch of its copy (``KernelConfig.waits_for_copy``), so "tx"
is that launch and the PDL lines read as it (results/pdl_launch_h100/); the "PDL" of the
runs before that session was an ordinary launch (results/row_major_launch_h100/, part 6).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import at_kernel_entry, checked_ratios, pipeline_tool, row_major_core  # noqa: E402
from copy_footprint_ab import Chunk, queue_copy, queue_first_copy, variant_call  # noqa: E402

from nmgen.codegen import KernelSource, render  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402

WAIT = 'asm volatile("griddepcontrol.wait;" ::: "memory");  // PDL: copy 0 done'
TRIGGER = 'asm volatile("griddepcontrol.launch_dependents;");  // PDL: main kernel 0 may start'


def launch_pdl(function, grid, threads, smem, params, stream_ptr) -> None:
    """``launch._launch`` as a programmatic dependent launch on ``stream_ptr`` (the
    launcher's own ``_AfterCopyLaunch``). Until the thirty-first session this tool packed
    the attribute itself, in a ``c_char`` union that ctypes reads back as a copy, so its
    "PDL" went out as an ordinary launch (results/row_major_launch_h100/, part 6)."""
    launch._AfterCopyLaunch(grid, threads, smem)(function, params, stream_ptr)


def queue_shipped_copy(chunk: Chunk, copy_stream, done: list) -> None:
    """Chunk j's copy as the launcher queued it until the twenty-ninth session."""
    if chunk.j == 0:
        queue_first_copy(chunk.plan, chunk.source, chunk.space.data.ptr, chunk.main,
                         copy_stream)
    else:
        queue_copy(chunk.j, chunk.plan, chunk.source, chunk.space.data.ptr, copy_stream,
                   chunk.main, done)


def launch_main_pdl(chunk: Chunk) -> None:
    """Main kernel 0 as a programmatic dependent launch, the others as shipped."""
    shipped = launch._launch
    if chunk.j == 0:
        launch._launch = launch_pdl
    try:
        chunk.plan.launch(chunk.space.data.ptr, chunk.out_ptr, chunk.main.ptr)
    finally:
        launch._launch = shipped


def pipelined(tx: launch.Kernel, a, b, out, pdl: bool):
    """Kernel._run_pipelined, main kernel 0 launched with PDL where ``pdl``."""
    return variant_call(tx, a, b, out, queue_shipped_copy, launch_main_pdl if pdl else None)


_PREFERRED_SHARED_MEMORY_CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT


def with_copy_carveout(kernel: launch.Kernel, percent: int) -> launch.Kernel:
    """``kernel`` with its transpose kernel's preferred carveout set (before any plan)."""
    import cupy as cp

    _, _, transpose = kernel._compiled(cp.cuda.runtime.getDevice())
    cp.cuda.driver.funcSetAttribute(transpose.ptr, _PREFERRED_SHARED_MEMORY_CARVEOUT, percent)
    return kernel


def one(pattern: Pattern, size: int, args: argparse.Namespace) -> list[str]:
    a, b, out, ref, _, tx, fns = row_major_core(pattern, size)
    code = at_kernel_entry(render(tx.config), WAIT, TRIGGER)
    variant = launch.Kernel(tx.config, code)
    fns["tx, PDL source"] = pipelined(variant, a, b, out, False)
    fns["tx, PDL"] = pipelined(variant, a, b, out, True)
    # a comment makes it another module, so the shipped kernels keep their attribute
    carved = with_copy_carveout(launch.Kernel(tx.config, KernelSource(
        tx.config, code.code + "// copy carveout\n")), 100)
    fns["tx, PDL source, copy carveout"] = pipelined(carved, a, b, out, False)
    fns["tx, PDL, copy carveout"] = pipelined(carved, a, b, out, True)
    return checked_ratios(fns, out, ref, f"{pattern.n}:{pattern.m}", args.rounds, 300)


def main() -> None:
    pipeline_tool(__doc__, "Main kernel 0 by programmatic dependent launch", one)


if __name__ == "__main__":
    main()
