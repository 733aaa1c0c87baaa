"""GPU (sm_90): the sparse-tensor-core family (wgmma.mma_async.sp) against float64, on
fresh random data, the output poisoned with NaN before every launch.

Hand-picked configurations (prefill tiles, two m64 tiles a thread, setmaxnreg splits,
decode tiles with slices of K, an epilogue, K-major A through its transpose) each run odd
shapes: M from 1, N and K not multiples of the tiles or of four, one stage and many passes
over the ring of buffers, rows of A not 16-byte aligned or wider than K (the copy into a
workspace), in BF16 and FP16, for element-wise 2:4 and the patterns that fit it (1:4, 1:2,
2:8, vector-wise 2:4). Then 4096^3 on a prefill tile, and dispatch of an element-wise 2:4
weight with no record (the model's choice of this family). The reference is the float64
product of the rounded inputs; the tolerance is the mma family's.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from nmgen.dispatch import Dispatcher
from nmgen.families.sptc.config import SptcConfig
from nmgen.format import DType
from nmgen.gpus import Arch
from nmgen.problem import ALayout, Problem
from nmgen.runtime.check import random_weight
from nmgen.runtime.device import device_info
from nmgen.runtime.launch import Kernel

from .gpu_suite import SEED, compile_ahead
from .test_mma_gpu import _float64, make_a, relative_error, tolerance

pytestmark = pytest.mark.gpu


CONFIGS = [
    "nm_sptc_bf16_n2m4l1_b128x128x128_g2_s4_k1_rm_sm90a",
    "nm_sptc_f16_n2m4l1_b256x128x128_g2_s3_k1_rm_sm90a",  # two m64 tiles a thread
    "nm_sptc_bf16_n2m4l1_b128x256x128_g2_s2_k1_rm_sm90a",  # setmaxnreg split
    "nm_sptc_bf16_n2m4l1_b64x8x128_g1_s8_k16_rm_sm90a",  # decode: slices of K
    "nm_sptc_f16_n2m4l1_b128x16x128_g1_s6_k4_rm_sm90a",
    "nm_sptc_bf16_n2m4l1_b64x64x128_g1_s5_k2_km_sm90a",  # K-major A: the transpose
    "nm_sptc_bf16_n2m4l1_b128x32x128_g2_s4_k1_rm_sm90a_bias_silu",
    "nm_sptc_bf16_n1m4l1_b128x64x128_g1_s4_k1_rm_sm90a",  # 1:4
    "nm_sptc_f16_n1m2l1_b64x128x128_g1_s3_k3_rm_sm90a",  # 1:2, three slices
    "nm_sptc_bf16_n2m8l16_b128x128x128_g1_s4_k1_km_sm90a",  # 2:8, L = 16
    "nm_sptc_bf16_n2m4l128_b256x64x128_g2_s4_k1_rm_sm90a",  # vector-wise 2:4
    "nm_sptc_f16_n2m4l1_b128x8x128_g1_s4_k8_rm_sm90a_bias_gelu",
]
# (M, N, K, A's row padding): one stage, many passes over the buffers, odd everything
SHAPES = [(1, 333, 515, "none"), (7, 129, 3001, "odd"), (17, 64, 128, "none"),
          (100, 257, 1, "wide"), (130, 1000, 2052, "none"), (255, 65, 7, "odd"),
          (64, 512, 4099, "wide"), (300, 70, 900, "none"), (3, 4096, 1024, "none"),
          (513, 200, 260, "odd")]
RANDOM_SHAPES = 15
MAX_SIZE = 700


@pytest.fixture(autouse=True)
def _sm90():
    if device_info().arch is not Arch.SM90:
        pytest.skip("wgmma.mma_async.sp kernels need an sm_90 GPU")


def shapes_of(rng: random.Random) -> list[tuple[int, int, int, str]]:
    drawn = [(rng.randint(1, MAX_SIZE), rng.randint(1, MAX_SIZE), rng.randint(1, 3 * MAX_SIZE),
              rng.choice(("none", "none", "odd", "wide"))) for _ in range(RANDOM_SHAPES)]
    return SHAPES + drawn


def test_named_configurations_on_odd_shapes_match_float64(gpu_cases):
    configs = [SptcConfig.from_name(name) for name in CONFIGS]
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


PREFILL_TILE = "nm_sptc_bf16_n2m4l1_b256x128x128_g2_s3_k1_rm_sm90a"
# At M = 1 the models put gemv first for this 11 MB weight: gemv's model runs 1.8x under
# its measured time there (results/sptc_h200/llama/ranking/gemv_model.txt), a gap left open.
DISPATCH_ROWS = (16, 2048)


def test_a_prefill_tile_at_4096_cubed_matches_float64(gpu_cases):
    config = SptcConfig.from_name(PREFILL_TILE)
    err = relative_error(Kernel(config), np.random.default_rng(SEED), 4096, 4096, 4096,
                         "none", device_values=True)
    gpu_cases["kernel_cases"] += 1
    assert err < tolerance(config.dtype, 4096), f"{config.name}: {err:.3g}"


@pytest.mark.parametrize("rows", DISPATCH_ROWS)
def test_dispatch_without_records_runs_this_family_for_element_wise_2of4(rows, gpu_cases):
    import cupy as cp

    info = device_info()
    dispatcher = Dispatcher([], device=info)
    problem = Problem(2, 4, 1, ALayout.ROW_MAJOR, info.arch, "bf16")
    decision = dispatcher.decide(problem, (rows, 3584, 2048))
    assert decision.config.family == "sptc", decision.config.name
    rng = np.random.default_rng(SEED)
    weight = random_weight(rng, 2, 4, 1, 2048, 3584, dtype=DType.BF16)
    a = make_a(rng, rows, 2048, ALayout.ROW_MAJOR, "none", DType.BF16)
    out = dispatcher(a, weight)
    ref = _float64(a) @ cp.asarray(weight.to_dense().astype(np.float64))
    err = float(cp.linalg.norm(_float64(out) - ref) / cp.linalg.norm(ref))
    gpu_cases["kernel_cases"] += 1
    assert err < tolerance(DType.BF16, 2048)
