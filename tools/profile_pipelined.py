"""Where the host time of a pipelined row-major call goes (cProfile of many calls).

The GPU is kept busy behind a long wait while the calls are queued, so that no launch
blocks on a full queue and the profile is of the host's own work; the host time a call
is measured first without the profiler, as tools/queue_ahead_ab.py measures it. The
problem is the core benchmark's (M = N = K = 4096 by default), the shipped launcher:

    python tools/profile_pipelined.py --pattern 4:32 --calls 50
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import row_major_core  # noqa: E402
from queue_ahead_ab import host_us  # noqa: E402

from nmgen.format import Pattern  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="4:32")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    import cupy as cp
    import numpy as np

    from nmgen.gpu.launch import _wait_kernel

    a, b, out, ref, km, tx, fns = row_major_core(Pattern.parse(args.pattern), args.size)
    call = fns[list(fns)[1]]
    stream = cp.cuda.get_current_stream()
    for _ in range(3):
        call(0)
    stream.synchronize()
    plain = host_us(call, args.calls)  # as tools/queue_ahead_ab.py times it
    _wait_kernel()((1,), (1,), (np.uint64(args.calls * 2_000_000),), stream=stream)
    profile = cProfile.Profile()
    profile.enable()
    for i in range(args.calls):
        call(i)
    profile.disable()
    stream.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.top)
    print(f"{args.pattern} {args.size}^3 {list(fns)[1]}: {plain:.1f} us a call, median "
          f"of {args.calls}")
    print(text.getvalue())


if __name__ == "__main__":
    main()
