"""Fewer copy blocks beside a main block: does that slow the main kernels less?

In the pipelined copy of row-major A (Kernel._run_pipelined), copies 1.. run in the block
slots a one-wave main kernel leaves: the few SMs that hold one main block instead of two.
Up to four 256-thread copy blocks fit beside it (registers), and the main kernels that
run beside copies span 107-110 us against 100.5 us alone at 4:32
(results/copy_order_h100/timeline7.md). Here copies 1.. ask for dynamic shared memory
they do not use, so that only S-many fit beside a main block, and the shipped pipeline
is timed in turns with them, after a float64 check of each.

    python tools/copy_share_ab.py --pattern 4:32,8:32 --smem-kb 40,48,66 --rounds 9
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _ab import checked_ratios, int_list, pipeline_tool, row_major_core  # noqa: E402

from nmgen.codegen import COPY_A_THREADS  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402

MAX_DYNAMIC_SMEM_ATTRIBUTE = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


def with_copy_smem(call, smem: int):
    """``call`` with the launcher's copies after the first of a call (copies 1..) asking
    for ``smem`` bytes of dynamic shared memory."""
    cp = launch._cupy()
    original = launch.LaunchPlan.launch_copy_a
    copies = [0]  # this call's copies so far

    def launch_copy_a(self, a_ptr: int, copy_ptr: int, stream_ptr: int) -> None:
        copies[0] += 1
        if copies[0] == 1:
            return original(self, a_ptr, copy_ptr, stream_ptr)
        copy = self.copy_a
        cp.cuda.driver.funcSetAttribute(copy.function.ptr, MAX_DYNAMIC_SMEM_ATTRIBUTE, smem)
        with self.lock:
            copy.args[0].value = a_ptr
            copy.args[1].value = copy_ptr
            launch._launch(copy.function, copy.grid, COPY_A_THREADS, smem, copy.params,
                           stream_ptr)

    def patched(i: int) -> None:
        copies[0] = 0
        launch.LaunchPlan.launch_copy_a = launch_copy_a
        try:
            call(i)
        finally:
            launch.LaunchPlan.launch_copy_a = original
    return patched


def one(pattern: Pattern, size: int, args: argparse.Namespace) -> list[str]:
    a, b, out, ref, _, tx, fns = row_major_core(pattern, size)
    for kb in args.smem_kb:
        fns[f"tx, copies 1.. with {kb} KB"] = with_copy_smem(lambda i: tx(a, b, out=out),
                                                             kb * 1024)
    return checked_ratios(fns, out, ref, str(pattern), args.rounds)


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--smem-kb", default=[40, 48, 66], type=int_list)
    pipeline_tool(__doc__, "Copies sharing SMs", one, options)


if __name__ == "__main__":
    main()
