"""Does the K-major core kernel run faster on A whose rows are not 16 KB apart?

tools/block_timeline.py found (H100, 4096^3, 4:32) that the main blocks of the pipelined
row-major launch, which read 1024-wide K-major chunks of A, take ~81 us where the K-major
kernel's blocks, reading A with rows 4096 floats apart, take ~88 us. This times the
K-major core kernel on the same A held with other row strides (``--pads``: floats added
to each K row of 4096), and on the 1024-row quarters of A as four calls, in turns in one
process after a float64 check of each.

    python tools/km_stride_probe.py --pattern 4:32,8:32 --pads 0,4,32,256
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import checked_ratios, core_pair, int_list, pipeline_tool, problem_inputs  # noqa: E402

from nmgen.config import ALayout  # noqa: E402
from nmgen.format import Pattern  # noqa: E402


def one(pattern: Pattern, size: int, args: argparse.Namespace) -> list[str]:
    import cupy as cp

    a, b, out, ref = problem_inputs(pattern, ALayout.ROW_MAJOR, size, size, size)
    km, _ = core_pair(pattern)
    fns = {}
    for pad in args.pads:
        held = cp.empty((size, size + pad), cp.float32)  # K rows of M (+ pad) floats
        held[:, :size] = a.T
        view = held[:, :size].T  # logical M x K, K-major, rows size + pad floats apart

        fns[f"km, K rows {size + pad} floats apart"] = lambda i, v=view: km(v, b, out=out)
    quarter = size // 4
    parts = [(cp.ascontiguousarray(a[r:r + quarter].T).T, out[r:r + quarter])
             for r in range(0, size, quarter)]

    def quarters(i: int) -> None:
        for part, part_out in parts:
            km(part, b, out=part_out)
    fns[f"km, four calls on {quarter}-row quarters (rows {quarter} floats apart)"] = quarters
    return checked_ratios(fns, out, ref, f"{pattern.n}:{pattern.m}", args.rounds, 300)


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--pads", default=[0, 4, 32, 256], type=int_list)
    pipeline_tool(__doc__, "The K-major kernel on other row strides of A", one, options)


if __name__ == "__main__":
    main()
