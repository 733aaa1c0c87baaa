"""Untimed warm-up before a timed tuning comparison: load what every tuning process loads
(Python packages, CuPy, the CUDA driver, NVRTC) once, so that the first timed run does
not pay a fresh machine's cold file cache and the later runs do not get it for free.

    python tools/warm_up.py
"""

import os
import tempfile
import time

start = time.monotonic()
with tempfile.TemporaryDirectory() as cache:
    os.environ["CUPY_CACHE_DIR"] = cache  # compiles for real, keeps nothing
    import cupy

    import nmgen.cli  # noqa: F401
    import nmgen.studies  # noqa: F401
    import nmgen.tuner  # noqa: F401

    cupy.RawModule(code='extern "C" __global__ void warm() {}', backend="nvrtc",
                   options=("-std=c++17",)).get_function("warm")
print(f"warm-up: {time.monotonic() - start:.1f} s")
