"""What a fresh compile process pays before its first kernel (issue 5): run on a GPU host.

    python tools/probe_compile_start.py h100

1. 1 and then 16 spawned processes at once: importing CuPy, the first CUDA call (the
   compute capability query) and making a context.
2. 16 kernels (the core kernel and model seeds of four 8:32 shapes) on 16 fresh processes,
   then again on the same processes with an empty cache: NVRTC alone (no module load),
   and nmgen's own compile step (``timing._compile_one``, which loads the module).
3. The first four kernels compiled one at a time.
"""

from __future__ import annotations

import inspect
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context


def first_cuda(_: int) -> dict[str, float]:
    t0 = time.time()
    import cupy as cp

    t1 = time.time()
    cp.cuda.Device().compute_capability  # noqa: B018 - the first CUDA call is the point
    t2 = time.time()
    cp.cuda.runtime.free(0)
    return {"import": t1 - t0, "first call": t2 - t1, "context": time.time() - t2}


def nvrtc_only(config_json: str) -> float:
    import cupy as cp

    from nmgen.codegen import render
    from nmgen.config import KernelConfig
    from nmgen.gpu.launch import NVRTC_OPTIONS

    source = render(KernelConfig.from_json(config_json)).code
    start = time.time()
    cp.cuda.compiler.compile_using_nvrtc(source, options=NVRTC_OPTIONS + ("-arch=sm_90",))
    return time.time() - start


def nmgen_compile(config_json: str) -> float:
    from nmgen.gpu.timing import _compile_one

    start = time.time()
    _compile_one(config_json)
    return time.time() - start


def sample_kernels(gpu: str) -> list:
    from nmgen.config import ALayout
    from nmgen.model import gpu_spec
    from nmgen.space import Problem, core_config
    from nmgen.tuner import TuneTask, model_seeds

    configs = [core_config(Problem(8, 32, 32))]
    for shape in ((256, 2048, 2048), (512, 6144, 2048), (1024, 2048, 5632), (4096, 5632, 2048)):
        configs += model_seeds(TuneTask(gpu_spec(gpu), 8, 32, 32, ALayout.ROW_MAJOR, *shape), 6)
    return list(dict.fromkeys(configs))[:16]


def main() -> None:
    import cupy as cp

    print("cupy", cp.__version__, inspect.signature(cp.cuda.compiler.compile_using_nvrtc))
    spawn = get_context("spawn")
    for n in (1, 16):
        with ProcessPoolExecutor(n, mp_context=spawn) as pool:
            start = time.time()
            runs = list(pool.map(first_cuda, range(n)))
        print(f"{n} processes at once: {time.time() - start:.2f} s; " + ", ".join(
            f"{k} max {max(r[k] for r in runs):.2f} s" for k in runs[0]))
    jobs = [c.to_json() for c in sample_kernels(sys.argv[1])]
    for label, fn in (("NVRTC alone", nvrtc_only), ("nmgen compile step", nmgen_compile)):
        os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp()  # the processes inherit it
        with ProcessPoolExecutor(16, mp_context=spawn) as pool:
            start = time.time()
            first = list(pool.map(fn, jobs))
            wall = time.time() - start
            os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp()  # not seen by these processes
            start = time.time()
            again = list(pool.map(fn, jobs))
        print(f"{label}: {len(jobs)} kernels on 16 fresh processes {wall:.2f} s, on the same "
              f"processes again {time.time() - start:.2f} s; first four kernels "
              f"{[round(t, 2) for t in first[:4]]} then {[round(t, 2) for t in again[:4]]}")
    for job in jobs[:4]:
        print(f"  alone {nvrtc_only(job):.2f} s")


if __name__ == "__main__":
    main()
