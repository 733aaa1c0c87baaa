"""GPU: the tensor-core family against float64, on fresh random data.

Random configurations of the family's space (BF16 and FP16, both A layouts, L from 16 to
256, patterns from 2:4 to 16:64) each run on several odd shapes (M from 1, N and K not
multiples of the tiles or of m, rows of A wider than K or M), with the output poisoned with
NaN before every launch; then a few 4096^3 problems on the model's choice. The reference is
the float64 product of the rounded inputs. A relative (Frobenius) error under
``UNIT_ROUNDOFF[dtype] + K * 2**-22`` passes: the rounding of the output to the dtype, and
the FP32 accumulation of K products (4096 adds 1e-3).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from nmgen.dispatch import Dispatcher
from nmgen.epilogue import apply_reference
from nmgen.families.mma import MMA
from nmgen.families.mma.config import MmaConfig
from nmgen.format import DType
from nmgen.gpus import Arch, spec_or_h100, table_name
from nmgen.problem import ALayout, Problem
from nmgen.runtime.check import device_array, random_weight
from nmgen.runtime.device import device_info
from nmgen.runtime.launch import Kernel

from .gpu_suite import SEED, compile_ahead

pytestmark = pytest.mark.gpu

PATTERNS = [(2, 4), (1, 4), (2, 8), (4, 32), (8, 32), (16, 32), (16, 64), (4, 16), (3, 7)]
VECS = [16, 32, 64, 128, 256]
UNIT_ROUNDOFF = {DType.BF16: 2.0**-8, DType.F16: 2.0**-11}
CONFIGS = 28
SHAPES_PER_CONFIG = 11
M_EDGES = (1, 17, 100)
MAX_SIZE = 600


def tolerance(dtype: DType, depth: int) -> float:
    return UNIT_ROUNDOFF[dtype] + depth * 2.0**-22


def _float64(x):
    import cupy as cp

    if hasattr(x, "is_cuda"):  # torch (bf16)
        return cp.asarray(x.double())
    return x.astype(cp.float64)


def row_pad(kind: str, extent: int) -> int:
    """Elements past the end of A's contiguous rows: none, an odd 3 (A then goes an element
    at a time), or up to a multiple of 8 and 8 more (16-byte copies from wide rows)."""
    return {"none": 0, "odd": 3, "wide": -extent % 8 + 8}[kind]


def make_a(rng: np.random.Generator, rows: int, depth: int, layout: ALayout, pad_kind: str,
           dtype: DType):
    """Logical M×K A in ``layout``, its contiguous rows padded (``row_pad``)."""
    import cupy as cp

    pad = row_pad(pad_kind, depth if layout is ALayout.ROW_MAJOR else rows)
    if layout is ALayout.ROW_MAJOR:
        full = cp.asarray(rng.standard_normal((rows, depth + pad), dtype=np.float32))
        return device_array(full, dtype)[:, :depth]
    full = cp.asarray(rng.standard_normal((depth, rows + pad), dtype=np.float32))
    return device_array(full, dtype)[:, :rows].T


def relative_error(kernel: Kernel, rng: np.random.Generator, rows: int, cols: int,
                   depth: int, pad: str, device_values: bool = False) -> float:
    import cupy as cp

    c = kernel.config
    weight = random_weight(rng, c.n, c.m, c.vec, depth, cols, device_values, c.dtype)
    a = make_a(rng, rows, depth, c.a_layout, pad, c.dtype)
    bias = device_array(cp.asarray(rng.standard_normal(cols, np.float32)), c.dtype) \
        if c.epilogue.bias else None  # a random bias where the kernel's epilogue adds one
    out = device_array(cp.full((rows, cols), np.nan, np.float32), c.dtype)  # poisoned
    kernel(a, weight, out=out, bias=bias)
    ref = _float64(a) @ cp.asarray(weight.to_dense().astype(np.float64))
    ref = apply_reference(ref, None if bias is None else _float64(bias), c.epilogue.activation)
    err = float(cp.linalg.norm(_float64(out) - ref)) / max(float(cp.linalg.norm(ref)), 1e-30)
    return err if np.isfinite(err) else float("inf")


def draw_configs(rng: random.Random, count: int) -> list[MmaConfig]:
    """Random configurations that fit this GPU: the patterns, layouts and dtypes in turn."""
    info = device_info()
    gpu = spec_or_h100(table_name(info.name))
    configs: dict[str, MmaConfig] = {}
    while len(configs) < count:
        i = len(configs)
        problem = Problem(*PATTERNS[i % len(PATTERNS)], rng.choice(VECS),
                          list(ALayout)[i % 2], info.arch, (DType.BF16, DType.F16)[(i // 2) % 2])
        if MMA.serves(problem) is not None:
            continue
        try:
            config = MMA.space.sample(problem, rng, max_tries=300)
        except ValueError:
            continue
        if MMA.feasible(config, gpu) is None:
            configs[config.name] = config
    return list(configs.values())


def draw_shapes(rng: random.Random, config: MmaConfig) -> list[tuple[int, int, int, str]]:
    """(M, N, K, A's row padding): the M edges, then random sizes; every third K not a
    multiple of m."""
    shapes = []
    for i in range(SHAPES_PER_CONFIG):
        rows = M_EDGES[i] if i < len(M_EDGES) else rng.randint(1, MAX_SIZE // 2)
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


GROUPED = ["nm_mma_bf16_n2m4l32_b128x128x32_w2x4_s3_rm_sm90",
           "nm_mma_f16_n8m32l16_b128x64x32_w2x4_s3_km_sm90",
           "nm_mma_bf16_n1m4l16_b64x64x16_w1x4_s4_rm_sm80",
           "nm_mma_bf16_n4m32l32_b64x256x32_w2x8_s2_km_sm80",
           "nm_mma_bf16_n2m4l32_b128x128x32_w2x4_s3_tx_rm_sm90",  # row-major A copied
           "nm_mma_f16_n3m7l16_b64x32x48_w2x2_s2_tx_rm_sm80"]


@pytest.mark.parametrize("name", GROUPED)
def test_blocks_of_several_column_groups_match_float64(name, gpu_cases):
    """Blocks across several column groups, N past the last whole block (padded groups);
    row-major A copied K-major (``_tx``), M odd."""
    rng = random.Random(SEED)
    kernel = Kernel(MmaConfig.from_name(name))
    block = kernel.config.bn
    wrong = []
    for rows, cols, depth in ((1, block - 8, 300), (100, 3 * block + 40, 517),
                              (257, 2 * block, 1000), (64, block + kernel.config.vec, 64)):
        err = relative_error(kernel, np.random.default_rng(rng.randrange(1 << 31)), rows, cols,
                             depth, "none")
        gpu_cases["kernel_cases"] += 1
        if not err < tolerance(kernel.config.dtype, depth):
            wrong.append(f"{name} M={rows} N={cols} K={depth}: {err:.3g}")
    assert not wrong, f"seed {SEED}:\n" + "\n".join(wrong)


LARGE = [Problem(8, 32, 128, ALayout.ROW_MAJOR, dtype="bf16"),
         Problem(16, 32, 128, ALayout.K_MAJOR, dtype="bf16"),
         Problem(2, 4, 64, ALayout.ROW_MAJOR, dtype="f16"),
         Problem(4, 32, 32, ALayout.K_MAJOR, dtype="bf16")]


@pytest.mark.parametrize("problem", LARGE, ids=str)
def test_model_choice_at_4096_cubed_matches_float64(problem, gpu_cases):
    info = device_info()
    problem = Problem(problem.n, problem.m, problem.vec, problem.a_layout, info.arch,
                      problem.dtype)
    shape = (4096, 4096, 4096)
    config = MMA.default_config(problem, spec_or_h100(table_name(info.name)), shape)
    err = relative_error(Kernel(config), np.random.default_rng(SEED), *shape, "none",
                         device_values=True)
    gpu_cases["kernel_cases"] += 1
    assert err < tolerance(problem.dtype, shape[2]), f"{config.name}: {err:.3g}"


def test_dispatch_without_records_runs_the_tensor_core_model_choice(gpu_cases):
    """With no tuned records, dispatch picks the tensor-core model choice at prefill M
    (on sm_90 at this size the wgmma family's, row-major A through its K-major copy)."""
    info = device_info()
    dispatcher = Dispatcher([], device=info)
    problem = Problem(8, 32, 128, ALayout.ROW_MAJOR, info.arch, "bf16")
    decision = dispatcher.decide(problem, (1000, 4096, 1000))
    expected = "wgmma" if info.arch is Arch.SM90 else "mma"
    assert decision.config.family == expected and decision.source == "model"
    rng = np.random.default_rng(SEED)
    weight = random_weight(rng, 8, 32, 128, 1000, 4096, dtype=DType.BF16)
    a = make_a(rng, 1000, 1000, ALayout.ROW_MAJOR, "none", DType.BF16)
    out = dispatcher(a, weight)
    import cupy as cp

    ref = _float64(a) @ cp.asarray(weight.to_dense().astype(np.float64))
    err = float(cp.linalg.norm(_float64(out) - ref) / cp.linalg.norm(ref))
    gpu_cases["kernel_cases"] += 1
    assert err < tolerance(DType.BF16, 1000)
