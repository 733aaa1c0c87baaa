"""Where the time of a pipelined row-major launch goes: each copy's and main kernel's
stream-side start and end, from timing events recorded around every launch of the
shipped pipeline (``Kernel._run_pipelined``), median over calls.

A "start" is when the launch's stream reached it (after the events it waits on), so a
kernel that then waits for SM slots shows that wait inside its span.

    python tools/pipeline_timeline.py --pattern 4:32,8:32 --calls 20
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nmgen.config import ALayout  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu.bench import random_weight  # noqa: E402
from nmgen.gpu.launch import (  # noqa: E402
    Kernel,
    LaunchPlan,
    _cupy,
    _external_stream,
    _wait_kernel,
    device_info,
)
from nmgen.space import Problem, core_config  # noqa: E402

QUEUE_AHEAD_NS = 300_000  # GPU wait queued before each call: its host path stays out


def traced(calls: int, call) -> list[tuple[str, float, float]]:
    """(label, start us, end us) of every launch in a call, medians over ``calls``."""
    cp = _cupy()
    spans: list[list[tuple[str, object, object]]] = []
    originals = {name: getattr(LaunchPlan, name) for name in ("launch", "launch_copy_a")}

    def wrap(name: str, label: str):
        def launch(self, *args):
            stream = _external_stream(args[-1] if name == "launch_copy_a" else args[2])
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            originals[name](self, *args)
            end.record(stream)
            spans[-1].append((label, start, end))
        return launch

    LaunchPlan.launch = wrap("launch", "main")
    LaunchPlan.launch_copy_a = wrap("launch_copy_a", "copy")
    try:
        for _ in range(calls):
            cp.cuda.Device().synchronize()
            spans.append([])
            _wait_kernel()((1,), (1,), (cp.uint64(QUEUE_AHEAD_NS),))
            call()
        cp.cuda.Device().synchronize()
    finally:
        for name, original in originals.items():
            setattr(LaunchPlan, name, original)
    rows = []
    for i, (label, _, _) in enumerate(spans[0]):
        starts = [cp.cuda.get_elapsed_time(s[0][1], s[i][1]) * 1e3 for s in spans]
        ends = [cp.cuda.get_elapsed_time(s[0][1], s[i][2]) * 1e3 for s in spans]
        rows.append((label, statistics.median(starts), statistics.median(ends)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="4:32,8:32")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--variants", action="store_true",
                        help="also tools/copy_footprint_ab.py's main-first and delayed orders")
    args = parser.parse_args()
    cp = _cupy()
    size = args.size
    a = cp.random.standard_normal((size, size), dtype=cp.float32)
    out = cp.empty((size, size), cp.float32)
    print(f"# {device_info().name}, M = N = K = {size}")
    for text in args.pattern.split(","):
        pattern = Pattern.parse(text)
        b = random_weight(pattern.n, pattern.m, 32, size, size)
        tx = Kernel(core_config(Problem(pattern.n, pattern.m, 32, ALayout.ROW_MAJOR,
                                        device_info().arch)))
        single = Kernel(tx.config)
        single.pipeline_copy = False
        calls = {"pipelined": functools.partial(tx, a, b, out=out),
                 "one copy": functools.partial(single, a, b, out=out)}
        if args.variants:  # tools/copy_footprint_ab.py's launch orders
            from copy_footprint_ab import pipelined, same_event, two_copies_first
            main_first = pipelined(tx, a, b, out, 0, False, main_first=True)
            delayed = pipelined(tx, a, b, out, 0, True, True, 2.0)
            calls["main first"] = functools.partial(main_first, 0)
            calls["two copies first"] = functools.partial(two_copies_first(tx, a, b, out), 0)
            for main_first in (False, True):
                calls[f"same event, {'main' if main_first else 'copy'} first"] = (
                    functools.partial(same_event(tx, a, b, out, main_first), 0))
            for title, variant in (("first in stream", {}),
                                   ("first in stream, main first", {"main_first": True})):
                calls[title] = functools.partial(
                    pipelined(tx, a, b, out, 0, True, True, **variant), 0)
            calls["copy 1 2 us later"] = functools.partial(delayed, 0)
        for title, call in calls.items():
            for _ in range(3):
                call()  # compile, plan, warm
            print(f"\n## {text} {title}: {tx.name}")
            print("| launch | start us | end us | span us |")
            print("| --- | --- | --- | --- |")
            for label, start, end in traced(args.calls, call):
                print(f"| {label} | {start:.1f} | {end:.1f} | {end - start:.1f} |")


if __name__ == "__main__":
    main()
