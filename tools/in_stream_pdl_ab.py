"""Copies in stream (tools/in_stream_copy_ab.py) with every main kernel launched as a
programmatic dependent launch of its copy.

With each chunk's copy and main kernel on one stream, every main kernel directly follows
its copy in stream order, so all of them, not only main kernel 0 (tools/pdl_ab.py, at
most 0.5 %), can be launched with programmatic stream serialization: the main kernel's
blocks take the SMs as the copy's blocks leave and wait at their top
(``griddepcontrol.wait``) until the copy is done and its writes are visible. Timed in
turns in one process after a float64 check (NaN-poisoned output) of each:

  km                          the K-major kernel on K-major A (the bound),
  tx                          the launcher,
  tx in stream, PDL source    the main kernels' source with the wait at their top (and,
                              with --trigger, the copies' ``launch_dependents`` at theirs),
                              launched in stream without PDL (the lines are no-ops
                              then): the baseline of the two lines below,
  tx in stream, PDL           that source, every main kernel launched with PDL,
  tx in stream, PDL graph     that call captured into a CUDA graph and replayed.

    python tools/in_stream_pdl_ab.py --pattern 4:32,8:32 --rounds 9 [--trigger]

Since the thirty-first session "tx" is this order too (results/row_major_launch_h100/,
part 5). With PDL really on (part 6, in_stream_pdl_run2*.md): 1.054 at 4:32 against tx's
1.057-1.058 then, 1.050-1.051 from a graph.

"tx" itself is a programmatic launch since the thirty-first session (pdl_ab.py says more).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import at_kernel_entry, checked_ratios, pipeline_tool, row_major_core  # noqa: E402
from copy_footprint_ab import variant_streams  # noqa: E402
from graph_core_ab import replayed  # noqa: E402
from in_stream_copy_ab import in_stream  # noqa: E402
from pdl_ab import TRIGGER, WAIT  # noqa: E402
from pdl_one_copy_ab import with_pdl_main  # noqa: E402

from nmgen.codegen import KernelSource, render  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402


def one(pattern: Pattern, size: int, args: argparse.Namespace) -> list[str]:
    a, b, out, ref, km, tx, fns = row_major_core(pattern, size)
    streams = variant_streams(True)[1]  # two streams of the greatest priority
    delay = launch.COPY_1_DELAY_NS
    code = at_kernel_entry(render(tx.config), WAIT, TRIGGER if args.trigger else "")
    source = launch.Kernel(tx.config, code)
    # a comment makes it another module, whose plans are patched apart from the source's
    pdl = with_pdl_main(launch.Kernel(tx.config, KernelSource(tx.config, code.code + "// pdl\n")))
    fns["tx in stream, PDL source"] = in_stream(source, a, b, out, streams, delay)
    fns["tx in stream, PDL"] = in_stream(pdl, a, b, out, streams, delay)
    fns["tx in stream, PDL graph"] = replayed(fns["tx in stream, PDL"])
    return checked_ratios(fns, out, ref, f"{pattern.n}:{pattern.m}", args.rounds, 300)


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--trigger", action="store_true",
                            help="the copies let their dependents launch at their top")
    pipeline_tool(__doc__, "Copies in stream, main kernels by programmatic dependent launch",
                  one, options)


if __name__ == "__main__":
    main()
