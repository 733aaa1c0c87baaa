"""GPU: every family's epilogue (bias, activation, both) against float64, on fresh random
data: for each family, configurations that reach each way C is written (f32: data-parallel,
split-K's reduction, stream-K's finishing blocks, sliced K's slice 0, the bulk copy engine,
the copied and pipelined A; gemv: one slice and the last block's sum of several, with and
without rows loaded ahead; mma: both A layouts and odd N; wgmma (sm_90): one and two
warpgroups, one and two m64 tiles), each with three epilogues (``variants``: every family
gets all nine, every configuration a bias, and the seed picks which three, so that runs
cover the other pairings), on odd shapes from M = 1, the output poisoned with NaN. The
reference is the float64 product of the rounded inputs, plus the rounded bias, then the
activation in float64 (``nmgen.reference``'s epilogue).
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

import nmgen
from nmgen.dispatch import Dispatcher
from nmgen.epilogue import Activation, Epilogue, apply_reference
from nmgen.families.gemv.config import GemvConfig
from nmgen.families.mma.config import MmaConfig
from nmgen.families.wgmma.config import WgmmaConfig
from nmgen.format import DType
from nmgen.problem import ALayout, Problem
from nmgen.runtime.check import device_array, random_weight, tolerance
from nmgen.runtime.launch import Kernel

from .gpu_suite import SEED, compile_ahead

pytestmark = pytest.mark.gpu

# Bias and no bias in turn (5 + 4): any three in a row, cyclically, hold a bias.
_WITH_BIAS = [Epilogue(True, act) for act in Activation]
_WITHOUT = [Epilogue(False, act) for act in Activation if act is not Activation.NONE]
EPILOGUES = [e for pair in zip(_WITH_BIAS, [*_WITHOUT, None], strict=True) for e in pair
             if e]
EPILOGUES_A_CONFIG = 3

F32 = [nmgen.KernelConfig(8, 32, 32, 64, 128, 64, 8, 8, a_layout="km"),
       nmgen.KernelConfig(8, 32, 32, 64, 128, 32, 8, 8, a_tile="tm"),
       nmgen.KernelConfig(8, 32, 32, 64, 128, 64, 8, 8, split_k=3, a_layout="km"),
       nmgen.KernelConfig(8, 32, 32, 64, 128, 64, 8, 8, stream_k=True, a_tile="tx"),
       nmgen.KernelConfig(8, 32, 32, 32, 64, 128, 4, 4, warp_m=4, warp_n=8, slice_k=2,
                          a_layout="km"),
       nmgen.KernelConfig(8, 32, 32, 128, 256, 64, 16, 8, stages=3, tma=True, a_layout="km")]
GEMV = [GemvConfig(8, 32, 128, rows=4, col_threads=64, lanes=2, cols=8, unroll=4,
                   dtype="bf16"),
        GemvConfig(8, 32, 128, rows=2, col_threads=64, lanes=4, cols=4, unroll=2, split_k=8,
                   dtype="f16", a_layout="km"),
        GemvConfig(4, 16, 32, rows=1, col_threads=128, lanes=1, cols=4, unroll=4, split_k=4),
        GemvConfig(16, 32, 128, rows=8, col_threads=32, lanes=2, cols=2, unroll=2,
                   dtype="bf16", a_layout="km"),
        GemvConfig(8, 32, 128, rows=1, col_threads=128, lanes=2, cols=8, unroll=4, split_k=8,
                   prefetch=2, dtype="bf16"),
        GemvConfig(8, 32, 128, rows=2, col_threads=64, lanes=1, cols=4, unroll=8, prefetch=1,
                   dtype="f16", a_layout="km")]
MMA = [MmaConfig.from_name("nm_mma_bf16_n8m32l128_b64x128x32_w2x2_s3_rm_sm80"),
       MmaConfig.from_name("nm_mma_f16_n8m32l128_b64x64x32_w2x2_s3_km_sm80"),
       MmaConfig.from_name("nm_mma_bf16_n2m4l64_b64x64x32_w2x2_s2_km_sm80"),
       MmaConfig.from_name("nm_mma_f16_n16m32l128_b128x128x32_w2x2_s2_rm_sm80")]
WGMMA = [WgmmaConfig.from_name("nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90a"),
         WgmmaConfig.from_name("nm_wgmma_f16_n2m4l64_b128x64x32_g1_s3_km_sm90a"),
         WgmmaConfig.from_name("nm_wgmma_bf16_n8m32l128_b128x128x32_g2_s4_ws_km_sm90a")]
# (M, N, K): the M edges, odd N and K, N smaller than a tile
SHAPES = [(1, 333, 257), (17, 129, 700), (300, 65, 1000 + 13)]


def float64(x):
    import cupy as cp

    if hasattr(x, "is_cuda"):  # torch (bf16)
        return cp.asarray(x.double())
    return x.astype(cp.float64)


def make_a(rng: np.random.Generator, rows: int, depth: int, layout: ALayout, dtype: DType):
    import cupy as cp

    if layout is ALayout.ROW_MAJOR:
        return device_array(cp.asarray(rng.standard_normal((rows, depth), np.float32)), dtype)
    return device_array(cp.asarray(rng.standard_normal((depth, rows), np.float32)), dtype).T


def epilogue_error(kernel: Kernel, rng: np.random.Generator, rows: int, cols: int,
                   depth: int) -> float:
    """Relative error of one call with a random bias (where the kernel adds one) against
    float64; ``inf`` for an output left unwritten."""
    import cupy as cp

    c = kernel.config
    weight = random_weight(rng, c.n, c.m, c.vec, depth, cols, dtype=c.dtype)
    a = make_a(rng, rows, depth, c.a_layout, c.dtype)
    bias = device_array(cp.asarray(rng.standard_normal(cols, np.float32)), c.dtype) \
        if c.epilogue.bias else None
    out = device_array(cp.full((rows, cols), np.nan, np.float32), c.dtype)
    kernel(a, weight, out=out, bias=bias)
    ref = float64(a) @ cp.asarray(weight.to_dense().astype(np.float64))
    ref = apply_reference(ref, None if bias is None else float64(bias), c.epilogue.activation)
    err = float(cp.linalg.norm(float64(out) - ref)) / max(float(cp.linalg.norm(ref)), 1e-30)
    return err if np.isfinite(err) else float("inf")


def variants(configs: list, seed: int = SEED) -> list:
    """Each configuration with ``EPILOGUES_A_CONFIG`` epilogues, taken in turn from
    ``EPILOGUES`` from an offset the seed picks: a family of three or more configurations
    gets every epilogue, and every configuration one with a bias."""
    start = seed % len(EPILOGUES)
    return [dataclasses.replace(c, epilogue=EPILOGUES[(start + EPILOGUES_A_CONFIG * i + j)
                                                      % len(EPILOGUES)])
            for i, c in enumerate(configs) for j in range(EPILOGUES_A_CONFIG)]


def runnable(configs: list) -> list:
    """The configurations this GPU runs (the bulk copy engine and wgmma are sm_90's)."""
    import cupy as cp

    sm90 = cp.cuda.Device().compute_capability == "90"
    return [c for c in configs
            if sm90 or not (getattr(c, "tma", False) or c.family == "wgmma")]


@pytest.mark.parametrize("family, configs", [("f32", F32), ("gemv", GEMV), ("mma", MMA),
                                             ("wgmma", WGMMA)])
def test_every_epilogue_of_every_family_matches_float64(family, configs, gpu_cases):
    chosen = variants(runnable(configs))
    assert {c.epilogue for c in chosen} == set(EPILOGUES) or len(runnable(configs)) < 3
    assert not compile_ahead(chosen)
    rng = random.Random(SEED)
    wrong = []
    for config in chosen:
        kernel = Kernel(config)
        for rows, cols, depth in SHAPES:
            err = epilogue_error(kernel, np.random.default_rng(rng.randrange(1 << 31)), rows,
                                 cols, depth)
            gpu_cases["kernel_cases"] += 1
            if not err < tolerance(config.dtype):
                wrong.append(f"{config.name} M={rows} N={cols} K={depth}: {err:.3g}")
    assert not wrong, f"seed {SEED}: {len(wrong)} wrong:\n" + "\n".join(wrong[:20])


def test_pipelined_copy_applies_the_epilogue_in_every_chunk(gpu_cases):
    """A copied-A kernel run in chunks of M on two streams: the bias pointer is the same
    for every chunk, and the result is the single copy's, bit for bit."""
    import cupy as cp

    from .test_kernels_gpu import PIPELINED, pipelined_case

    config = nmgen.KernelConfig(8, 32, 32, **{**PIPELINED[1]}, a_tile="tx",
                                epilogue="bias_gelu")
    kernel, b, a, out, _ = pipelined_case(config, "cupy", "current")
    bias = cp.asarray(np.random.default_rng(SEED).standard_normal(b.shape[1], np.float32))
    kernel(a, b, out=out, bias=bias)
    cp.cuda.Device().synchronize()
    ref = nmgen.reference(a, b, bias, "gelu")
    assert float(cp.linalg.norm(out - ref) / cp.linalg.norm(ref)) < 1e-5
    kernel.pipeline = False
    assert bool((kernel(a, b, bias=bias) == out).all())
    gpu_cases["kernel_cases"] += 2


DISPATCHED = [(1, "bf16"), (7, "f16"), (600, "bf16"), (3, "f32"), (500, "f32")]  # (M, dtype)


@pytest.mark.parametrize("rows, dtype", DISPATCHED)
def test_dispatch_runs_the_epilogue_variant(rows, dtype, gpu_cases):
    """With no records: decode M on gemv, prefill M on the tensor cores or the FP32
    family, each with the bias and the activation asked for."""
    import cupy as cp

    from nmgen.runtime.device import device_info

    info = device_info()
    dispatcher = Dispatcher([], device=info)
    dt = DType(dtype)
    rng = np.random.default_rng(SEED)
    weight = random_weight(rng, 8, 32, 128, 1000, 520, dtype=dt)
    a = make_a(rng, rows, 1000, ALayout.ROW_MAJOR, dt)
    bias = device_array(cp.asarray(rng.standard_normal(520, np.float32)), dt)
    out = dispatcher(a, weight, bias=bias, activation="silu")
    (kernel, *_), = dispatcher._fast.values()
    assert kernel.name.endswith("_bias_silu")
    problem = Problem(8, 32, 128, ALayout.ROW_MAJOR, info.arch, dt)
    assert kernel.config == dataclasses.replace(
        dispatcher.decide(problem, (rows, 520, 1000)).config, epilogue="bias_silu")
    ref = apply_reference(float64(a) @ cp.asarray(weight.to_dense().astype(np.float64)),
                          float64(bias), "silu")
    err = float(cp.linalg.norm(float64(out) - ref) / cp.linalg.norm(ref))
    gpu_cases["kernel_cases"] += 1
    assert err < tolerance(dt), f"{kernel.name}: {err:.3g}"


def test_bias_is_checked_against_the_kernel():
    import cupy as cp

    config = nmgen.KernelConfig(2, 4, 8, 32, 32, 16, 4, 4)
    b = nmgen.prune(np.random.default_rng().standard_normal((64, 40)), "2:4", 8)
    a = cp.random.standard_normal((10, 64), dtype=cp.float32)
    bias = cp.zeros(40, cp.float32)
    with pytest.raises(ValueError, match="adds no bias"):
        Kernel(config)(a, b, bias=bias)
    kernel = Kernel(config.replace(epilogue="bias_relu"))
    with pytest.raises(ValueError, match="adds a bias: pass bias="):
        kernel(a, b)
    with pytest.raises(ValueError, match="bias has shape"):
        kernel(a, b, bias=cp.zeros(41, cp.float32))
    with pytest.raises(TypeError, match="takes a f32 bias"):
        kernel(a, b, bias=cp.zeros(40, cp.float16))
    with pytest.raises(ValueError, match="contiguous"):
        kernel(a, b, bias=cp.zeros(80, cp.float32)[::2])
    out = kernel(a, b, bias=bias)
    assert bool((out >= 0).all())
