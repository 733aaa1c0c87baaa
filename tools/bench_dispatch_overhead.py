"""Host cost of ``nmgen.dispatch`` on the cached path, on a tiny problem.

Times the host side only: a burst of calls short enough that the launch queue never fills,
timed with a host clock before synchronizing (the GPU may still be working), median of
bursts; compared with a raw ``Kernel`` call and with a bare CuPy launch.

    python tools/bench_dispatch_overhead.py --out results/dispatch_overhead_h100.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nmgen  # noqa: E402
from nmgen.dispatch import Dispatcher  # noqa: E402


def per_call_us(fn, calls: int, repeats: int = 15) -> float:
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


def tiny_problem():
    """A 1x64x64 2:4 problem and a dispatcher on an empty database whose first, uncached
    call (decide, compile, prepare) is made: (dispatcher, a, b, out, config)."""
    import cupy as cp

    rng = np.random.default_rng()
    b = nmgen.prune(rng.standard_normal((64, 64)), "2:4", 16)
    a = cp.asarray(rng.standard_normal((1, 64), dtype=np.float32))
    out = cp.empty((1, 64), cp.float32)
    dispatcher = Dispatcher([f"sqlite:///{Path('/tmp/nmgen_overhead_empty.db')}"])
    dispatcher(a, b, out=out)
    config = next(iter(dispatcher._kernels.values())).config  # the one kernel it compiled
    return dispatcher, a, b, out, config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="per burst (< queue depth)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import cupy as cp
    import torch

    dispatcher, a, b, out, config = tiny_problem()
    kernel = nmgen.Kernel(config)
    kernel(a, b, out=out)
    noop = cp.RawKernel(r'extern "C" __global__ void noop(float* x) {}', "noop")
    a_t = torch.as_tensor(a, device="cuda")
    out_t = torch.empty((1, 64), device="cuda")
    result = {
        "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "dispatch_cupy_us": per_call_us(lambda: dispatcher(a, b, out=out), args.calls),
        "dispatch_torch_us": per_call_us(lambda: dispatcher(a_t, b, out=out_t), args.calls),
        "kernel_call_us": per_call_us(lambda: kernel(a, b, out=out), args.calls),
        "bare_cupy_launch_us": per_call_us(lambda: noop((1,), (32,), (out,)), args.calls),
        "config": config.name,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
