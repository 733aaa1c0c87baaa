"""GPU (sm_90): the wgmma family against float64, on fresh random data.

Random configurations of the family's space (BF16 and FP16, L of 64 to 256, patterns from
2:4 to 16:64) each run on several odd shapes (M from 1, N and K not multiples of the tiles
or of m, rows of A wider than M or not 16-byte aligned), with the output poisoned with NaN
before every launch; then 4096^3 problems on the model's choice and a hand-picked
configuration of each tile shape. Kernels with a producer warpgroup (``producer="warp"``,
mbarriers instead of block barriers, some with setmaxnreg) are drawn by the space too, and
a hand-picked few (row-major A among them: the K-major copy read as the shared kernel
reads it) run odd shapes with K deep enough for many passes over the stages; so do their
twins whose B' tiles come by the bulk copy engine (``producer="tma"``: A gathered as the
``_ws`` producer does, unaligned A included, the full barrier also awaiting the boxes'
bytes), on the same shapes and more. The reference is the float64 product of the rounded
inputs; the tolerance is the mma family's (``test_mma_gpu.tolerance``): the output's
rounding and the FP32 accumulation of K products.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from nmgen.dispatch import Dispatcher
from nmgen.families.wgmma import WGMMA
from nmgen.families.wgmma.config import WgmmaConfig
from nmgen.format import DType
from nmgen.gpus import Arch, spec_or_h100, table_name
from nmgen.problem import ALayout, Problem
from nmgen.runtime.check import random_weight
from nmgen.runtime.device import device_info
from nmgen.runtime.launch import Kernel

from .gpu_suite import SEED, compile_ahead
from .test_mma_gpu import _float64, make_a, relative_error, tolerance

pytestmark = pytest.mark.gpu

PATTERNS = [(2, 4), (1, 4), (2, 8), (4, 32), (8, 32), (16, 32), (16, 64), (4, 16), (3, 7),
            (12, 32)]
VECS = [64, 128, 256]
CONFIGS = 30
SHAPES_PER_CONFIG = 11
M_EDGES = (1, 17, 100)
MAX_SIZE = 600


@pytest.fixture(autouse=True)
def _sm90():
    if device_info().arch is not Arch.SM90:
        pytest.skip("wgmma kernels need an sm_90 GPU")


def draw_configs(rng: random.Random, count: int) -> list[WgmmaConfig]:
    """Random configurations that fit this GPU: the patterns and dtypes in turn."""
    info = device_info()
    gpu = spec_or_h100(table_name(info.name))
    configs: dict[str, WgmmaConfig] = {}
    while len(configs) < count:
        i = len(configs)
        layout = (ALayout.K_MAJOR, ALayout.ROW_MAJOR)[i % 3 == 2]  # a third row-major
        problem = Problem(*PATTERNS[i % len(PATTERNS)], rng.choice(VECS), layout,
                          info.arch, (DType.BF16, DType.F16)[(i // len(PATTERNS)) % 2])
        if WGMMA.serves(problem) is not None:
            continue
        try:
            config = WGMMA.space.sample(problem, rng, max_tries=300)
        except ValueError:
            continue
        if WGMMA.feasible(config, gpu) is None:
            configs[config.name] = config
    return list(configs.values())


def draw_shapes(rng: random.Random, config: WgmmaConfig) -> list[tuple[int, int, int, str]]:
    """(M, N, K, A's row padding): the M edges, then random sizes; every third K not a
    multiple of m."""
    shapes = []
    for i in range(SHAPES_PER_CONFIG):
        rows = M_EDGES[i] if i < len(M_EDGES) else rng.randint(1, MAX_SIZE)
        depth = rng.randint(1, MAX_SIZE)
        if i % 3 == 0 and depth % config.m == 0:
            depth += rng.randint(1, config.m - 1)
        shapes.append((rows, rng.randint(1, MAX_SIZE), depth,
                       rng.choice(("none", "none", "odd", "wide"))))
    return shapes


def test_random_configurations_and_shapes_match_float64(gpu_cases):
    rng = random.Random(SEED)
    configs = draw_configs(rng, CONFIGS)
    assert not compile_ahead(configs)
    wrong = []
    for config in configs:
        kernel = Kernel(config)
        for rows, cols, depth, pad in draw_shapes(rng, config):
            err = relative_error(kernel, np.random.default_rng(rng.randrange(1 << 31)), rows,
                                 cols, depth, pad)
            gpu_cases["kernel_cases"] += 1
            if not err < tolerance(config.dtype, depth):
                wrong.append(f"{config.name} M={rows} N={cols} K={depth} pad={pad}: {err:.3g}")
    assert not wrong, f"seed {SEED}: {len(wrong)} wrong:\n" + "\n".join(wrong[:20])


TILES = ["nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90a",
         "nm_wgmma_bf16_n8m32l128_b256x128x64_g2_s3_km_sm90a",
         "nm_wgmma_f16_n8m32l128_b128x128x64_g1_s4_km_sm90a",
         "nm_wgmma_bf16_n16m32l256_b128x256x64_g2_s3_km_sm90a",
         "nm_wgmma_bf16_n4m32l64_b64x64x32_g1_s5_km_sm90a",
         "nm_wgmma_bf16_n8m32l128_b128x128x32_g2_s4_rm_sm90a",
         "nm_wgmma_bf16_n8m32l128_b128x128x32_g2_s4_ws_km_sm90a",
         "nm_wgmma_bf16_n16m32l128_b256x128x32_g2_s5_ws_km_sm90a",
         "nm_wgmma_bf16_n8m32l128_b128x128x32_g2_s4_ws_rm_sm90a",
         "nm_wgmma_bf16_n16m32l128_b256x128x32_g4_s4_km_sm90a",  # four warpgroups
         "nm_wgmma_bf16_n8m32l128_b128x128x32_g2_s4_tma_km_sm90a",  # bulk copies
         "nm_wgmma_bf16_n8m32l128_b128x128x32_g2_s4_tma_rm_sm90a",
         "nm_wgmma_f16_n8m32l128_b256x128x32_g4_s4_rm_sm90a"]


@pytest.mark.parametrize("name", TILES)
def test_tile_shapes_at_4096_cubed_match_float64(name, gpu_cases):
    config = WgmmaConfig.from_name(name)
    err = relative_error(Kernel(config), np.random.default_rng(SEED), 4096, 4096, 4096,
                         "none", device_values=True)
    gpu_cases["kernel_cases"] += 1
    assert err < tolerance(config.dtype, 4096), f"{name}: {err:.3g}"


# Producer warpgroups: (name, what it exercises)
WARP = ["nm_wgmma_bf16_n8m32l128_b128x128x32_g2_s4_ws_km_sm90a",  # the probe's tile
        "nm_wgmma_f16_n16m32l128_b256x128x32_g2_s5_ws_km_sm90a",  # two m64 tiles a thread
        "nm_wgmma_bf16_n16m32l128_b128x128x32_g1_s4_ws_km_sm90a",  # setmaxnreg 128: 56 / 200
        "nm_wgmma_f16_n2m4l64_b256x64x16_g2_s6_ws_km_sm90a",  # setmaxnreg 80: 40 / 96
        "nm_wgmma_bf16_n3m7l128_b64x128x48_g1_s3_ws_km_sm90a",  # 3 stages, odd pattern
        "nm_wgmma_bf16_n4m32l256_b64x256x64_g1_s3_ws_km_sm90a",  # n256
        "nm_wgmma_bf16_n8m32l128_b128x128x32_g2_s4_ws_rm_sm90a",  # row-major A: the copy
        "nm_wgmma_f16_n16m32l128_b128x128x32_g1_s4_ws_rm_sm90a_bias_silu",  # and setmaxnreg
        "nm_wgmma_bf16_n8m32l128_b256x128x32_g4_s4_ws_rm_sm90a"]  # four MMA warpgroups
# (M, N, K, A's row padding): one stage and many passes over the STAGES buffers (the
# mbarriers' phases), unaligned A (the element-wise path: stores released by an
# ordinary arrival), rows wider than M
WARP_SHAPES = [(1, 333, 4099, "none"), (17, 129, 3001, "odd"), (100, 200, 2500, "wide"),
               (255, 65, 7, "odd"), (130, 257, 1, "none"), (64, 64, 700, "none")]


def odd_shape_errors(kernel: Kernel, shapes, gpu_cases) -> list[str]:
    """The shapes (and five drawn for the kernel) whose output misses the float64
    reference, each with its error."""
    rng = random.Random(SEED)
    wrong = []
    for rows, cols, depth, pad in shapes + draw_shapes(rng, kernel.config)[:5]:
        err = relative_error(kernel, np.random.default_rng(rng.randrange(1 << 31)), rows,
                             cols, depth, pad)
        gpu_cases["kernel_cases"] += 1
        if not err < tolerance(kernel.config.dtype, depth):
            wrong.append(f"M={rows} N={cols} K={depth} pad={pad}: {err:.3g}")
    return wrong


@pytest.mark.parametrize("name", WARP)
def test_producer_warpgroup_on_odd_shapes_matches_float64(name, gpu_cases):
    wrong = odd_shape_errors(Kernel(WgmmaConfig.from_name(name)), WARP_SHAPES, gpu_cases)
    assert not wrong, f"{name}, seed {SEED}: {len(wrong)} wrong:\n" + "\n".join(wrong)


# Bulk-copy producers: the _tma twins of the producer warpgroups above, on their shapes
# and more: M not a multiple of 64, K not of m (rows -1), one stage and many passes over the
# buffers, rows of A wider than M, A not 16-byte aligned (the element-wise path).
TMA = [name.replace("_ws_", "_tma_") for name in WARP]
TMA_SHAPES = WARP_SHAPES + [(8, 333, 4099, "odd"), (17, 129, 3001, "wide"),
                            (136, 257, 1, "odd"), (1, 100, 300, "wide")]


@pytest.mark.parametrize("name", TMA)
def test_bulk_copy_producer_on_odd_shapes_matches_float64(name, gpu_cases):
    kernel = Kernel(WgmmaConfig.from_name(name))
    wrong = odd_shape_errors(kernel, TMA_SHAPES, gpu_cases)
    assert not kernel._instead, f"{name}: {list(kernel._instead)}"  # the kernel itself ran
    assert not wrong, f"{name}, seed {SEED}: {len(wrong)} wrong:\n" + "\n".join(wrong)


LARGE = [Problem(8, 32, 128, ALayout.K_MAJOR, dtype="bf16"),
         Problem(16, 32, 128, ALayout.K_MAJOR, dtype="bf16"),
         Problem(4, 32, 64, ALayout.K_MAJOR, dtype="f16")]


@pytest.mark.parametrize("problem", LARGE, ids=str)
def test_model_choice_at_4096_cubed_matches_float64(problem, gpu_cases):
    info = device_info()
    shape = (4096, 4096, 4096)
    config = WGMMA.default_config(problem, spec_or_h100(table_name(info.name)), shape)
    err = relative_error(Kernel(config), np.random.default_rng(SEED), *shape, "none",
                         device_values=True)
    gpu_cases["kernel_cases"] += 1
    assert err < tolerance(problem.dtype, shape[2]), f"{config.name}: {err:.3g}"


def test_dispatch_without_records_runs_the_wgmma_model_choice(gpu_cases):
    """With no tuned records, dispatch of K-major BF16 at prefill M picks this family."""
    import cupy as cp

    info = device_info()
    dispatcher = Dispatcher([], device=info)
    problem = Problem(8, 32, 128, ALayout.K_MAJOR, info.arch, "bf16")
    decision = dispatcher.decide(problem, (2048, 4096, 4096))
    assert decision.config.family == "wgmma" and decision.source == "model"
    rng = np.random.default_rng(SEED)
    weight = random_weight(rng, 8, 32, 128, 4096, 4096, dtype=DType.BF16)
    a = make_a(rng, 2048, 4096, ALayout.K_MAJOR, "none", DType.BF16)
    out = dispatcher(a, weight)
    ref = _float64(a) @ cp.asarray(weight.to_dense().astype(np.float64))
    err = float(cp.linalg.norm(_float64(out) - ref) / cp.linalg.norm(ref))
    gpu_cases["kernel_cases"] += 1
    assert err < tolerance(DType.BF16, 4096)
