"""Untimed warm-up before a timed tuning comparison: load what every tuning process loads
(Python packages, CuPy, the CUDA driver, NVRTC) once, and build the search space's
on-disk enumeration of each pattern and the model's table of it
(``families.base.enumeration`` and ``tune.seeds.model_seeds``: seconds, once an nmgen
version),
so that the first timed run does not pay a fresh machine's cold start and the later runs
do not get it for free.

    python tools/warm_up.py GPU PATTERN,... [VEC] [LAYOUT]    e.g. h200 8:32 32 rm
"""

import os
import sys
import tempfile
import time

start = time.monotonic()
with tempfile.TemporaryDirectory() as cache:
    os.environ["CUPY_CACHE_DIR"] = cache  # compiles for real, keeps nothing
    import nmgen.cli  # noqa: F401
    import nmgen.tune.storage  # noqa: F401
    from nmgen.families.f32_simt import F32_SIMT
    from nmgen.format import Pattern
    from nmgen.gpus import gpu_spec
    from nmgen.problem import ALayout
    from nmgen.tune.seeds import SEEDS_FROM_MODEL, model_seeds
    from nmgen.tune.task import TuneTask

    try:
        import cupy
    except ImportError:  # a host without a GPU: the space only
        cupy = None
    if cupy is not None:
        cupy.RawModule(code='extern "C" __global__ void warm() {}', backend="nvrtc",
                       options=("-std=c++17",)).get_function("warm")
    gpu, patterns, vec, layout = (sys.argv[1:] + ["32", "rm"][len(sys.argv) - 3:])[:4]
    for text in filter(None, patterns.split(",")):
        pattern = Pattern.parse(text)
        task = TuneTask.of(gpu_spec(gpu), F32_SIMT, pattern.n, pattern.m, int(vec),
                           ALayout(layout), (1, 1, 1))
        model_seeds(task, SEEDS_FROM_MODEL)  # ranks the (cached) enumeration
print(f"warm-up: {time.monotonic() - start:.1f} s")
