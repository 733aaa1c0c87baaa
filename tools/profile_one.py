"""Run one configuration a few times on a square problem (or --rows x size x size), for
a profiler to look at.

    ncu --section SpeedOfLight python tools/profile_one.py NAME --size 4096 [--rows 4224]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nmgen  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="kernel name")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rows", type=int, help="M (default: --size)")
    parser.add_argument("--launches", type=int, default=3)
    args = parser.parse_args()
    import cupy as cp

    config = nmgen.KernelConfig.from_name(args.config)
    rng = np.random.default_rng()
    b = nmgen.prune(rng.standard_normal((args.size, args.size), dtype=np.float32),
                    (config.n, config.m), config.vec)
    a = cp.asarray(rng.standard_normal((args.rows or args.size, args.size), dtype=np.float32))
    if config.a_layout is nmgen.ALayout.K_MAJOR:
        a = cp.ascontiguousarray(a.T).T
    kernel = nmgen.Kernel(config)
    for _ in range(args.launches):
        kernel(a, b)
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
