"""GPU (sm_80 and newer): the ``mma.sp`` family against float64, on fresh random data, the
output poisoned with NaN before every launch.

Hand-picked configurations (prefill tiles, decode tiles with slices of K, two stages, one
warp along M, an epilogue, K-major A and rows of A not 16-byte aligned, read element by
element) each run odd shapes: M from 1, N and K not multiples of the tiles or of four, one
stage and many passes over the ring of buffers, in BF16 and FP16, for element-wise 2:4 and
the patterns that fit it (1:4, 1:2, 2:8, vector-wise 2:4); configurations named for sm_80
run the same code on any later GPU. Then 4096^3 on a prefill tile. The reference is the
float64 product of the rounded inputs; the tolerance is the mma family's.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from nmgen.families.mmasp.config import MmaSpConfig
from nmgen.runtime.launch import Kernel

from .gpu_suite import SEED, compile_ahead
from .test_mma_gpu import relative_error, tolerance
from .test_sptc_gpu import shapes_of

pytestmark = pytest.mark.gpu

CONFIGS = [
    "nm_mmasp_bf16_n2m4l1_b128x64x128_w2x2_s3_k1_rm_sm80",
    "nm_mmasp_f16_n2m4l1_b128x128x128_w2x4_s2_k1_rm_sm80",  # two stages
    "nm_mmasp_bf16_n2m4l1_b64x8x128_w4x1_s4_k8_rm_sm80",  # decode: slices of K
    "nm_mmasp_f16_n2m4l1_b128x16x128_w4x2_s5_k4_rm_sm80",
    "nm_mmasp_bf16_n2m4l1_b64x32x128_w2x2_s4_k2_km_sm80",  # K-major A
    "nm_mmasp_bf16_n2m4l1_b128x32x128_w4x2_s3_k1_rm_sm80_bias_silu",
    "nm_mmasp_bf16_n1m4l1_b128x64x128_w4x2_s4_k1_rm_sm80",  # 1:4
    "nm_mmasp_f16_n1m2l1_b64x128x128_w2x4_s3_k3_rm_sm80",  # 1:2, three slices
    "nm_mmasp_bf16_n2m8l16_b256x32x128_w4x2_s2_k1_km_sm80",  # 2:8, L = 16
    "nm_mmasp_bf16_n2m4l128_b256x64x128_w4x2_s3_k1_rm_sm90",  # vector-wise 2:4
    "nm_mmasp_f16_n2m4l1_b128x8x128_w4x1_s6_k16_rm_sm80_bias_gelu",
    "nm_mmasp_bf16_n2m4l1_b64x64x128_w1x2_s2_k1_rm_sm80",  # one warp along M
]
PREFILL_TILE = "nm_mmasp_bf16_n2m4l1_b128x128x128_w2x4_s3_k1_rm_sm80"


def test_named_configurations_on_odd_shapes_match_float64(gpu_cases):
    configs = [MmaSpConfig.from_name(name) for name in CONFIGS]
    assert not compile_ahead(configs)
    rng = random.Random(SEED)
    wrong = []
    for config in configs:
        kernel = Kernel(config)
        for rows, cols, depth, pad in shapes_of(rng):
            err = relative_error(kernel, np.random.default_rng(rng.randrange(1 << 31)), rows,
                                 cols, depth, pad)
            gpu_cases["kernel_cases"] += 1
            if not err < tolerance(config.dtype, depth):
                wrong.append(f"{config.name} M={rows} N={cols} K={depth} pad={pad}: {err:.3g}")
    assert not wrong, f"seed {SEED}: {len(wrong)} wrong:\n" + "\n".join(wrong[:30])


def test_a_prefill_tile_at_4096_cubed_matches_float64(gpu_cases):
    config = MmaSpConfig.from_name(PREFILL_TILE)
    err = relative_error(Kernel(config), np.random.default_rng(SEED), 4096, 4096, 4096,
                         "none", device_values=True)
    gpu_cases["kernel_cases"] += 1
    assert err < tolerance(config.dtype, 4096), f"{config.name}: {err:.3g}"
