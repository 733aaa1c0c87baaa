"""Where the host time of a cached ``nmgen.dispatch`` call goes: each step of the path
timed on its own (median of bursts), then a cProfile of the whole call.

    python tools/profile_dispatch.py
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nmgen  # noqa: E402
from nmgen.dispatch import Dispatcher  # noqa: E402
from nmgen.gpu import launch  # noqa: E402


def us(fn, calls: int = 200, repeats: int = 25) -> float:
    import cupy as cp

    samples = []
    for _ in range(repeats):
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    cp.cuda.Device().synchronize()
    return statistics.median(samples)


def main() -> None:
    import cupy as cp

    rng = np.random.default_rng()
    b = nmgen.prune(rng.standard_normal((64, 64)), "2:4", 16)
    a = cp.asarray(rng.standard_normal((1, 64), dtype=np.float32))
    out = cp.empty((1, 64), cp.float32)
    dispatcher = Dispatcher([f"sqlite:///{Path('/tmp/nmgen_profile_empty.db')}"])
    dispatcher(a, b, out=out)
    config = dispatcher.decide(dispatcher.key_for((1, 64), nmgen.ALayout.ROW_MAJOR, b)).config
    kernel = dispatcher.kernel(config)
    a_op = launch.operand(a, "a")
    plan = next(v for k, v in b._prepared.items() if isinstance(k, tuple) and k[0] == "plan")
    stream_ptr = launch._current_stream_ptr()
    steps = {
        "dispatch": lambda: dispatcher(a, b, out=out),
        "kernel.run": lambda: kernel.run(a, a_op, b, out, None),
        "operand(a)": lambda: launch.operand(a, "a"),
        "_check_a": lambda: launch._check_a(a_op, b, config),
        "_output": lambda: launch._output(out, a, a_op, (1, 64)),
        "_stream": lambda: launch._stream(None, a_op),
        "_current_stream_ptr": launch._current_stream_ptr,
        "getDevice": cp.cuda.runtime.getDevice,
        "plan.launch": lambda: plan.launch(a_op.ptr, out.data.ptr, stream_ptr),
        "a.device.id": lambda: a.device.id,
        "a.data.ptr": lambda: a.data.ptr,
    }
    for name, fn in steps.items():
        print(f"{name:22s} {us(fn):7.2f} us")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20000):
        dispatcher(a, b, out=out)
        if _ % 500 == 0:
            cp.cuda.Device().synchronize()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
