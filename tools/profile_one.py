"""Run one configuration of any family a few times on a square problem (or --rows x size x
size), for a profiler to look at. FP32 kernels take CuPy arrays; bf16/fp16 kernels torch
tensors (as frameworks pass them).

    ncu --section SpeedOfLight python tools/profile_one.py NAME --size 4096 [--rows 4224]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nmgen  # noqa: E402
from nmgen.families.registry import config_from_name  # noqa: E402
from nmgen.format import DType  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="kernel name")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rows", type=int, help="M (default: --size)")
    parser.add_argument("--launches", type=int, default=3)
    args = parser.parse_args()
    config = config_from_name(args.config)
    rows = args.rows or args.size
    k_major = config.a_layout is nmgen.ALayout.K_MAJOR
    if getattr(config, "dtype", DType.F32) is DType.F32:
        a, b, synchronize = _cupy_operands(config, rows, args.size, k_major)
    else:
        a, b, synchronize = _torch_operands(config, rows, args.size, k_major)
    kernel = nmgen.Kernel(config)
    for _ in range(args.launches):
        kernel(a, b)
    synchronize()


def _cupy_operands(config, rows: int, size: int, k_major: bool):
    import cupy as cp

    rng = np.random.default_rng()
    b = nmgen.prune(rng.standard_normal((size, size), dtype=np.float32),
                    (config.n, config.m), config.vec)
    a = cp.asarray(rng.standard_normal((rows, size), dtype=np.float32))
    if k_major:
        a = cp.ascontiguousarray(a.T).T
    return a, b, cp.cuda.Device().synchronize


def _torch_operands(config, rows: int, size: int, k_major: bool):
    import torch

    dtype = torch.bfloat16 if config.dtype is DType.BF16 else torch.float16
    b = nmgen.prune(torch.randn(size, size, dtype=dtype), (config.n, config.m), config.vec,
                    layout="nk")
    a = torch.randn(size, rows, device="cuda", dtype=dtype).T if k_major else \
        torch.randn(rows, size, device="cuda", dtype=dtype)
    return a, b, torch.cuda.synchronize


if __name__ == "__main__":
    main()
