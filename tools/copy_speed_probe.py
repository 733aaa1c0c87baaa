"""How fast the transpose of row-major A runs alone: the launcher's copy kernel (``tx``)
for chunks of M rows of a K = 4096 A, launched back to back on one stream, each on another
part of a 256 MiB A so that nothing is read from L2. Per copy: microseconds, and the
bytes read and written over that time. ``--copy-template`` adds the copy of another version
of the template, timed in turns with the shipped one; "memcpy" is a device-to-device copy
of the same bytes.

    python tools/copy_speed_probe.py --rows 1024,4096 [--copy-template FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.codegen import render_text  # noqa: E402
from nmgen.config import ALayout  # noqa: E402
from nmgen.gpu import launch  # noqa: E402
from nmgen.gpu.bench import random_weight  # noqa: E402
from nmgen.gpu.launch import Kernel, _cupy, device_info  # noqa: E402
from nmgen.space import Problem, core_config  # noqa: E402

DEPTH = 4096
A_BYTES = 256 * 2**20


def copy_us(kernel: Kernel, b, rows: int, a, space, launches: int) -> float:
    """Mean microseconds of one copy of ``rows`` rows, over ``launches`` back to back."""
    cp = _cupy()
    plan = kernel._cached_plan(b, launch.operand(a[:rows], "a"), rows, DEPTH)
    parts = a.shape[0] // rows
    stream = cp.cuda.get_current_stream()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    plan.launch_copy_a(a.data.ptr, space.data.ptr, stream.ptr)  # warm-up
    start.record(stream)
    for i in range(launches):
        plan.launch_copy_a(a.data.ptr + 4 * (i % parts) * rows * DEPTH, space.data.ptr,
                           stream.ptr)
    stop.record(stream)
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1e3 / launches


def memcpy_us(rows: int, a, space, launches: int) -> float:
    """The same for a plain device-to-device copy of the chunk's bytes (the reference)."""
    cp = _cupy()
    nbytes, parts = 4 * rows * DEPTH, a.shape[0] // rows
    stream = cp.cuda.get_current_stream()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for i in range(launches):
        src = a.data + (i % parts) * nbytes
        space.data.copy_from_device_async(src, nbytes, stream)
    stop.record(stream)
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1e3 / launches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1024,4096")
    parser.add_argument("--launches", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--copy-template", type=Path)
    args = parser.parse_args()
    cp = _cupy()
    a = cp.random.standard_normal((A_BYTES // (4 * DEPTH), DEPTH), dtype=cp.float32)
    space = cp.empty(DEPTH * 4096, cp.float32)
    b = random_weight(4, 32, 32, DEPTH, 4096)
    config = core_config(Problem(4, 32, 32, ALayout.ROW_MAJOR, device_info().arch))
    kernels = {"shipped": Kernel(config)}
    if args.copy_template:
        kernels[args.copy_template.name] = Kernel(
            config, render_text(config, args.copy_template.read_text()))
    print(f"# {device_info().name}: the transpose of K = {DEPTH} row-major A, chunks of M rows\n")
    print("| copy | rows | us (median of rounds) | GB/s read + written |\n"
          "| --- | --- | --- | --- |")
    for rows in (int(r) for r in args.rows.split(",")):
        times: dict[str, list[float]] = {name: [] for name in (*kernels, "memcpy")}
        for _ in range(args.rounds):
            for name, kernel in kernels.items():
                times[name].append(copy_us(kernel, b, rows, a, space, args.launches))
            times["memcpy"].append(memcpy_us(rows, a, space, args.launches))
        for name, samples in times.items():
            us = sorted(samples)[len(samples) // 2]
            print(f"| {name} | {rows} | {us:.2f} | {2 * 4 * rows * DEPTH / us / 1e3:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
