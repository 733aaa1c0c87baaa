"""The main kernel of a row-major ("tx") launch as a programmatic dependent launch of its
copy, on the tuned shapes where row-major A costs most, against the shipped launch.

At 4096^3 (tools/pdl_ab.py) PDL for main kernel 0 of the pipeline gained at most 0.5 %:
1-2 us of the ~4 us between the copy's last block and the main kernel's first, out of
~395 us. Where M, N or the kernel is small, the row-major launch is one copy then one main
kernel, the tuned row-major winner runs up to 1.34x the K-major one
(results/tuned_db_show.txt), and the same microseconds weigh more. Versions, timed in
turns in one process after a float64 check (NaN-poisoned output) of each:

  km                the tuned K-major winner on K-major A (the bound),
  tx                the tuned row-major winner, launched as shipped,
  tx, PDL source    its source with ``griddepcontrol.wait`` at the main kernel's top (and
                    ``launch_dependents`` at the copy's, with --trigger), launched as
                    shipped (both lines are no-ops without PDL),
  tx, PDL           that source, every main kernel launched with programmatic stream
                    serialization.

With --capture, each PDL version is also captured into a CUDA graph, replayed and checked.

    python tools/pdl_one_copy_ab.py --problems 4:32x256x2048x2048,8:32x256x2048x5632 --rounds 9

"tx" itself is a programmatic launch since the thirty-first session (pdl_ab.py says more).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import at_kernel_entry, checked_ratios, precompile, problem_inputs  # noqa: E402
from pdl_ab import TRIGGER, WAIT, launch_pdl  # noqa: E402

from nmgen.codegen import KernelSource, render  # noqa: E402
from nmgen.config import ALayout, KernelConfig  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch  # noqa: E402

SHOW = Path(__file__).resolve().parent.parent / "results" / "tuned_db_show.txt"


def tuned_winners(pattern: str, rows: int, cols: int, depth: int) -> dict[str, str]:
    """{"rm": name, "km": name}: the shipped database's winners of the problem, from the
    committed ``nmgen show`` table."""
    found = {}
    for line in SHOW.read_text().splitlines()[1:]:
        f = line.split()
        if len(f) > 9 and f[1] == pattern and (int(f[4]), int(f[5]), int(f[6])) == (
                rows, cols, depth):
            found[f[3]] = f[-1]
    if set(found) != {"rm", "km"}:
        raise SystemExit(f"{pattern} {rows}x{cols}x{depth}: not in {SHOW}")
    return found


def with_pdl_main(kernel: launch.Kernel) -> launch.Kernel:
    """``kernel`` whose plans launch their main kernel with PDL (the copy as shipped)."""
    plan_of = kernel._cached_plan

    def cached_plan(*args, **kwargs):
        plan = plan_of(*args, **kwargs)
        if not getattr(plan, "pdl", False):
            shipped = plan.launch

            def launch_main(*a, **k):
                saved, launch._launch = launch._launch, launch_pdl
                try:
                    shipped(*a, **k)
                finally:
                    launch._launch = saved

            plan.launch, plan.pdl = launch_main, True
        return plan

    kernel._cached_plan = cached_plan
    return kernel


def captured_error(fn, out, ref) -> float:
    """Relative error of one call captured into a CUDA graph and replayed on a poisoned
    output."""
    import cupy as cp

    from nmgen.gpu import measure

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn(0)  # the plan and workspaces exist before the capture
        stream.begin_capture()
        fn(0)
        graph = stream.end_capture()
    return measure.poisoned_error(lambda: (graph.launch(stream), stream.synchronize()),
                                  out, ref)


def problem(text: str) -> tuple[str, int, int, int]:
    pattern, rows, cols, depth = text.split("x")
    return pattern, int(rows), int(cols), int(depth)


def sources(text: str, trigger: bool) -> list[KernelSource]:
    """Every source ``one`` compiles for ``text``: the two winners, the PDL source and its
    twin."""
    names = tuned_winners(*problem(text))
    km, tx = (KernelConfig.from_name(names[k]) for k in ("km", "rm"))
    code = pdl_source(tx, trigger)
    return [render(km), render(tx), code, KernelSource(tx, code.code + "// pdl\n")]


def pdl_source(config: KernelConfig, trigger: bool) -> KernelSource:
    return at_kernel_entry(render(config), WAIT, TRIGGER if trigger else "")


def one(text: str, args: argparse.Namespace) -> list[str]:
    pattern_text, rows, cols, depth = problem(text)
    pattern = Pattern.parse(pattern_text)
    names = tuned_winners(pattern_text, rows, cols, depth)
    a, b, out, ref = problem_inputs(pattern, ALayout.ROW_MAJOR, rows, cols, depth)
    import cupy as cp

    a_km = cp.ascontiguousarray(a.T).T
    km = launch.Kernel(KernelConfig.from_name(names["km"]))
    tx_config = KernelConfig.from_name(names["rm"])
    if not tx_config.a_copied:
        return [f"| {text} | {names['rm']} | - | not a copied A tile |"]
    tx = launch.Kernel(tx_config)
    code = pdl_source(tx_config, args.trigger)
    fns = {f"km {km.name}": lambda i: km(a_km, b, out=out),
           f"tx {tx.name}": lambda i: tx(a, b, out=out)}
    source = launch.Kernel(tx_config, code)
    # a comment makes it another module, whose plans are patched apart from the source's
    pdl = with_pdl_main(launch.Kernel(tx_config, KernelSource(tx_config, code.code + "// pdl\n")))
    fns["tx, PDL source"] = lambda i: source(a, b, out=out)
    fns["tx, PDL"] = lambda i: pdl(a, b, out=out)
    lines = checked_ratios(fns, out, ref, text, args.rounds)
    if args.capture:
        try:
            result = f"error {captured_error(fns['tx, PDL'], out, ref):.2e}"
        except Exception as exc:  # noqa: BLE001 - the report says what failed
            result = f"failed: {type(exc).__name__}: {exc}"
        lines.append(f"| {text} | tx, PDL captured in a graph, replayed | {result} | - |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", required=True,
                        help="PATTERNxMxNxK,... (each in results/tuned_db_show.txt)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--trigger", action="store_true",
                        help="the copy lets its dependent launch at its top")
    parser.add_argument("--capture", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from nmgen.gpu.launch import device_info

    lines = [f"# PDL for the main kernel after the copy ({device_info().name})", "",
             f"trigger at the copy's top: {args.trigger}", "",
             "| problem | version | ms | over km |", "| --- | --- | --- | --- |"]
    problems = args.problems.split(",")
    precompile([s for text in problems for s in sources(text, args.trigger)])
    for text in problems:
        lines += one(text, args)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
