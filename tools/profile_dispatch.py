"""Where the host time of a cached ``nmgen.dispatch`` call goes: each step of the path
timed on its own (median of bursts), then a cProfile of the whole call.

    python tools/profile_dispatch.py
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dispatch_overhead import per_call_us, tiny_problem  # noqa: E402

from nmgen.runtime import device, launch  # noqa: E402


def main() -> None:
    import cupy as cp

    dispatcher, a, b, out, config = tiny_problem()
    kernel = dispatcher.kernel(config)
    a_op = device.operand(a, "a")
    plan = next(v for k, v in b._prepared.items() if isinstance(k, tuple) and k[0] == "plan")
    stream_ptr = device.current_stream_ptr()
    steps = {
        "dispatch": lambda: dispatcher(a, b, out=out),
        "kernel.run": lambda: kernel.run(a, a_op, b, out, None),
        "operand(a)": lambda: device.operand(a, "a"),
        "check_a": lambda: launch.check_a(a_op, b, config),
        "kernel._output": lambda: kernel._output(out, a, a_op, (1, 64)),
        "launch_stream": lambda: device.launch_stream(None, a_op),
        "current_stream_ptr": device.current_stream_ptr,
        "getDevice": cp.cuda.runtime.getDevice,
        "plan.run": lambda: plan.run({"a": a_op.ptr, "c": out.data.ptr}, stream_ptr),
        "a.device.id": lambda: a.device.id,
        "a.data.ptr": lambda: a.data.ptr,
    }
    for name, fn in steps.items():
        print(f"{name:22s} {per_call_us(fn, 200, repeats=25):7.2f} us")
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
