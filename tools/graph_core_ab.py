"""The core kernels at 4096^3 launched as shipped and replayed from CUDA graphs.

An inference stack that captures its layers into CUDA graphs launches a row-major call's
kernels from the graph: their dependencies are resolved on the GPU, without the streams'
event waits. Each version is checked against float64 (NaN-poisoned output), its graph
captured after one call outside capture (as the library requires), and the graph's
replay checked the same way; then all are timed in turns in one process:

  km, km graph            the K-major kernel on K-major A (the bound), and its graph,
  tx, tx graph            the shipped row-major launch (pipelined copy), and its graph,
  tx one copy (graph)     the same with the pipelined copy off (one copy of all of A).

    python tools/graph_core_ab.py --pattern 4:32,8:32 --rounds 9
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import checked_ratios, one_copy_twin, pipeline_tool, row_major_core  # noqa: E402

from nmgen.format import Pattern  # noqa: E402


def replayed(fn):
    """A call that replays ``fn(0)`` captured into a CUDA graph, on the current stream."""
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn(0)  # the plan, the compiled kernel and the weight's layout exist first
        stream.begin_capture()
        fn(0)
        graph = stream.end_capture()
    stream.synchronize()
    return lambda i: graph.launch(cp.cuda.get_current_stream())


def one(pattern: Pattern, size: int, args) -> list[str]:
    a, b, out, ref, km, tx, fns = row_major_core(pattern, size)
    one_copy = one_copy_twin(tx.config)
    fns["tx one copy"] = lambda i: one_copy(a, b, out=out)
    km_name, tx_name = list(fns)[:2]
    versions = {km_name: fns[km_name], "km graph": replayed(fns[km_name]),
                tx_name: fns[tx_name], "tx graph": replayed(fns[tx_name]),
                "tx one copy": fns["tx one copy"],
                "tx one copy graph": replayed(fns["tx one copy"])}
    return checked_ratios(versions, out, ref, f"{pattern.n}:{pattern.m}", args.rounds, 300)


def main() -> None:
    pipeline_tool(__doc__, "Launched as shipped and from CUDA graphs", one)


if __name__ == "__main__":
    main()
