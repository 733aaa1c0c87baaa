"""Does an NVRTC compile slow down when many run at once on one host (issue 5)?

    python tools/probe_compile_contention.py [CONCURRENCY ...]     (default 1 8 16 24 30)

Each level starts that many fresh processes (spawned, CuPy and NVRTC warmed up with a
one-line kernel first, no CUDA context), then all compile the same kernel (the 8:32
row-major core kernel, the slowest common one) at once through NVRTC, without a cache.
Prints each level's median and slowest compile time and the CPU clocks seen meanwhile.
"""

from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

ARCH = "-arch=sm_90"


def _warm(_: int) -> None:
    from cupy.cuda import compiler

    compiler.compile_using_nvrtc('extern "C" __global__ void w() {}', options=(ARCH,))


def _compile(source: str) -> float:
    from cupy.cuda import compiler

    start = time.perf_counter()
    compiler.compile_using_nvrtc(source, options=("-std=c++17", ARCH))
    return time.perf_counter() - start


def _clocks_mhz() -> list[float]:
    with open("/proc/cpuinfo") as info:
        return [float(line.split(":")[1]) for line in info if line.startswith("cpu MHz")]


def main() -> None:
    from nmgen.codegen import render
    from nmgen.config import ALayout
    from nmgen.space import Problem, core_config

    source = render(core_config(Problem(8, 32, 32, a_layout=ALayout.ROW_MAJOR))).code
    levels = [int(a) for a in sys.argv[1:]] or [1, 8, 16, 24, 30]
    for level in levels:
        with ProcessPoolExecutor(level, mp_context=get_context("spawn")) as pool:
            list(pool.map(_warm, range(level)))
            futures = [pool.submit(_compile, source) for _ in range(level)]
            time.sleep(0.8)
            clocks = _clocks_mhz()
            times = [f.result() for f in futures]
        print(f"{level:3d} at once: median {statistics.median(times):.2f} s, slowest "
              f"{max(times):.2f} s; CPU clocks meanwhile: median "
              f"{statistics.median(clocks):.0f} MHz, min {min(clocks):.0f}, "
              f"max {max(clocks):.0f} ({len(clocks)} CPUs)", flush=True)


if __name__ == "__main__":
    main()
