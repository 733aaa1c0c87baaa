"""A sample of every family's kernels for ``compute-sanitizer``: random cases of
``nmgen selftest`` (odd shapes, edges, M = 1) and, for the FP32 family, one kernel of each
path the random draw may miss: split-K, sliced K, stream-K, the bulk copy engine, packing,
each A tile, and a row-major call long enough to be pipelined in chunks on two streams.
Each case is checked against float64, so a kernel that reads or writes out of bounds and
still gets the right answer is caught by the sanitizer, and a wrong one by the check.

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 tools/sanitize.py --cases 120
    compute-sanitizer --tool racecheck --error-exitcode 1 \
        python3 tools/sanitize.py --cases 24 --small

``--small`` runs the pipelined kernel on a shape of one chunk: racecheck looks inside a
block (shared memory), where the shape changes nothing but the run time (minutes for the
pipelined one); memcheck runs it whole.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.bench.selftest import Case, check_case, selftest  # noqa: E402
from nmgen.families.f32_simt.config import KernelConfig  # noqa: E402
from nmgen.runtime.launch import Kernel  # noqa: E402

BASE = dict(n=8, m=32, vec=32, ms=64, ns=128, ks=64, mt=8, nt=8)
# (configuration, (M, N, K)): one of each path of the FP32 family.
PATHS = [
    (KernelConfig(**BASE, split_k=2, a_layout="km"), (97, 200, 515)),
    (KernelConfig(**BASE, slice_k=2, a_layout="km"), (33, 130, 300)),
    (KernelConfig(**BASE, stream_k=True, a_layout="km"), (300, 700, 1000)),
    (KernelConfig(**BASE, tma=True, a_layout="km"), (129, 257, 333)),
    (KernelConfig(**BASE, packing=True, a_layout="km"), (65, 129, 260)),
    (KernelConfig(**BASE, a_tile="tm"), (17, 120, 97)),
    (KernelConfig(**BASE, a_tile="tr"), (70, 140, 256)),
    (KernelConfig(**BASE, a_tile="tk"), (70, 140, 256)),
    (KernelConfig(**BASE, a_tile="tx"), (1, 130, 257)),
    # pipelined: M holds three chunks of 512 rows and 8 MiB of A
    (KernelConfig(**BASE, a_tile="tx", tma=True), (1536, 8192, 4096)),
]
SMALL = (70, 256, 512)  # --small: the shape of every case over 2**20 outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200, help="random cases a family")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="no case over 2**20 outputs")
    args = parser.parse_args()
    wrong = []
    for config, shape in PATHS:
        large = shape[0] * shape[1] > 2**20
        rows, cols, depth = SMALL if args.small and large else shape
        error = check_case(Kernel(config), Case(config.name, rows, cols, depth, 0, args.seed))
        print(f"{config.name} M={rows} N={cols} K={depth}: {error or 'right'}", flush=True)
        wrong += [config.name] if error else []
    outcome = selftest(args.cases, args.seed, per_config=10, max_size=256, workers=8)
    for family, count in outcome.cases.items():
        print(f"{family}: {count} random cases, {outcome.wrong[family]} wrong", flush=True)
    sys.exit(1 if wrong or any(outcome.wrong.values()) else 0)


if __name__ == "__main__":
    main()
